"""Call records: one `CallRecord` per logical gateway call, written to Parquet, summarised
with polars (`summarize_records`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["ok", "bad_output", "fatal", "unavailable"]


class CallRecord(BaseModel):
    """One logical gateway call (all its attempts and fallbacks)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    ts: datetime
    tier: str
    model: str
    endpoint: str
    purpose: str = ""
    schema_name: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    attempts: int = 0
    retries_transient: int = 0
    retries_rate_limited: int = 0
    retries_bad_output: int = 0
    fallbacks: int = 0
    fallback_reasons: list[str] = Field(default_factory=list)
    outcome: Outcome
    error: str | None = None


# Explicit so that empty runs and all-null columns still get stable Parquet types.
CALL_RECORD_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("tier", pa.string()),
        ("model", pa.string()),
        ("endpoint", pa.string()),
        ("purpose", pa.string()),
        ("schema_name", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("latency_ms", pa.float64()),
        ("attempts", pa.int64()),
        ("retries_transient", pa.int64()),
        ("retries_rate_limited", pa.int64()),
        ("retries_bad_output", pa.int64()),
        ("fallbacks", pa.int64()),
        ("fallback_reasons", pa.list_(pa.string())),
        ("outcome", pa.string()),
        ("error", pa.string()),
    ]
)


@dataclass(slots=True)
class CallStats:
    """What one logical call accumulates over its attempts and fallbacks (-> CallRecord)."""

    tier: str
    purpose: str
    schema_name: str | None
    model: str = ""
    endpoint: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    retries_transient: int = 0
    retries_rate_limited: int = 0
    retries_bad_output: int = 0
    fallbacks: int = 0
    fallback_reasons: list[str] = field(default_factory=list)
    outcome: Outcome | None = None
    error: str | None = None

    def to_record(self, run_id: str, ts: datetime, latency_ms: float) -> CallRecord:
        fields = asdict(self)
        if self.outcome is None:  # cancelled, or failed before any request: still leave a trace
            fields.update(outcome="unavailable", error=self.error or "interrupted")
        return CallRecord(run_id=run_id, ts=ts, latency_ms=latency_ms, **fields)


def write_parquet(records: Iterable[CallRecord], target: Path) -> None:
    """`records` to `target`, atomically (a reader never sees half a file)."""
    table = pa.Table.from_pylist([r.model_dump() for r in records], schema=CALL_RECORD_SCHEMA)
    partial = target.with_name(target.name + ".partial")
    pq.write_table(table, partial)
    partial.replace(target)


def summarize_records(source: pl.DataFrame | str | Path | Iterable[str | Path]) -> pl.DataFrame:
    """Per tier/model: calls, ok rate, tokens, p50/p95 latency, retries and fallbacks.

    `source` is a DataFrame of records, a Parquet file, a directory of them, or a list."""
    if isinstance(source, pl.DataFrame):
        frame = source
    else:
        paths = [source] if isinstance(source, str | Path) else list(source)
        files: list[Path] = []
        for path in map(Path, paths):
            files.extend(sorted(path.glob("*.parquet")) if path.is_dir() else [path])
        frames = [pl.read_parquet(f) for f in files]
        frame = (
            pl.concat(frames, how="diagonal_relaxed")
            if frames
            else pl.from_arrow(CALL_RECORD_SCHEMA.empty_table())  # type: ignore[assignment]
        )
    return (
        frame.group_by("tier", "model")
        .agg(
            pl.len().alias("calls"),
            (pl.col("outcome") == "ok").mean().alias("ok_rate"),
            pl.col("prompt_tokens").sum(),
            pl.col("completion_tokens").sum(),
            pl.col("latency_ms").quantile(0.5, "linear").alias("p50_latency_ms"),
            pl.col("latency_ms").quantile(0.95, "linear").alias("p95_latency_ms"),
            pl.col("attempts").sum(),
            pl.col("retries_transient").sum(),
            pl.col("retries_rate_limited").sum(),
            pl.col("retries_bad_output").sum(),
            pl.col("fallbacks").sum(),
        )
        .sort("tier", "model")
    )
