"""Tests of tasks/dialogue/: the dialogue sidecar's service, its units, concurrency, the benchmark
formats and the scripted dialogue."""
