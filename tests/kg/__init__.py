"""Tests of kg/: the graph store and its command line, retrieval, maintenance (healing, QA), the
codex, the vault, the dialogue lease, the Cypher lint."""
