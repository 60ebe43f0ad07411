"""The crash harness (`python -m bench.crash novel|sidecar|regression`): real runs killed at seeded
random moments, resumed, and compared byte for byte with an uninterrupted run."""
