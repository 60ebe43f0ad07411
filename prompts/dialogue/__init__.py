"""Prompts of the dialogue memory sidecar (extractor, judge, historian, actor)."""
