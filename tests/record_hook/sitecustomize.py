"""Loaded at start-up by every Python subprocess of a test session (this folder is first on
the PYTHONPATH the session hands down): records its Cypher like the session itself does.
Outside a test session (no KG_CYPHER_RECORD_DIR) it does nothing."""

import os

if os.environ.get("KG_CYPHER_RECORD_DIR"):
    from pathlib import Path

    try:
        import skald_cypher_recorder
    except ImportError:  # this folder is not importable here: nothing to record with
        pass
    else:
        skald_cypher_recorder.install(Path(os.environ["KG_CYPHER_RECORD_DIR"]))
