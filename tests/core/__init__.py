"""Tests of core/: settings, the content store, the LLM gateway, the embedder, recall, timex, the
prose guard, the doctor, children."""
