"""Tests of flows/: `python -m flows.novel` and `python -m flows.regression` end to end, crash
equivalence, ingest."""
