"""Prefect flows (orchestration only).

Prefect reads some settings when it is imported, so the defaults we rely on are set
here, before any flow module imports it. Explicit environment values still win.
"""

import os

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "skald")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

# Prefect's ephemeral API server (a uvicorn child it starts when no PREFECT_API_URL is set)
# must not outlive us: see core.children.
from core.children import make_prefect_children_die_with_parent  # noqa: E402

make_prefect_children_die_with_parent()

# At most two malloc arenas (core.heap): glibc fixes the arena limit when the first thread
# other than the main one allocates, so it is set here, before any import starts a thread.
from core.heap import limit_arenas  # noqa: E402

limit_arenas()
