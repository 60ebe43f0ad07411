"""The dialogue sidecar's stages (spec 000): one module per slot or concern.

`pipeline` runs a turn through the slots; `retriever` recalls earlier turns through the
shared hybrid retrieval (core.recall); `ingest` imports whole transcripts; `replay` and
`report` are the regression batch's stages.
"""
