"""Tests of tasks/: context, extraction and validation checks, grounding, the writer's controls,
the ebook."""
