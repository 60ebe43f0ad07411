"""Tests of api/: the sidecar's HTTP API, in process and served, its lorebook, crash and
fuzz runs."""
