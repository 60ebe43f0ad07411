"""Prefect flows (orchestration only).

Prefect reads some settings when it is imported, so the defaults we rely on are set
here, before any flow module imports it. Explicit environment values still win.
"""

import os

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "skald")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
