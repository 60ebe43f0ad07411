"""What a `HybridIndex` holds per document: the document as the caller gives it (`MemoryDoc`),
a hit as it is handed back (`Hit`), and the per-position facts the fusion reads
(`DocumentColumns`: the day said, the days spoken of, group, speaker, ...).

Contract: `DocumentColumns.append` is called once per document, in position order; every
column is a pure function of the document (the days spoken of resolved by core.timex against
the day it was said).
"""

from __future__ import annotations

from datetime import date
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from core.recall.columns import Column
from core.timex import TimeSpan, resolve


class MemoryDoc(BaseModel):
    """One retrievable document, in memory order."""

    key: str = Field(description="stable identity: a turn key, a scene id")
    text: str = Field(
        description="what the dense model embeds and the caller shows, e.g. `speaker: text`"
    )
    extra: str = Field("", description="indexed lexically only: image captions, extracted facts")
    speaker: str = Field(
        "", description='who said it; several speakers joined by commas ("Tester, Seraphina")'
    )
    group: str = Field("", description="session or chapter: neighbours are looked for within it")
    when: str = Field(
        "", description="free-text date, indexed and matched against dates in queries"
    )
    meta: dict[str, Any] = Field(
        default_factory=dict, description="provenance handed back with a hit"
    )


class Hit(BaseModel):
    key: str
    position: int
    score: float
    text: str
    speaker: str = ""
    when: str = ""
    signals: dict[str, float] = Field(
        default_factory=dict, description="rank-fusion share per signal"
    )
    meta: dict[str, Any] = Field(default_factory=dict)
    events: list[str] = Field(
        default_factory=list,
        description="the time expressions of the text resolved "
        'against when it was said, "yesterday = Sunday 7 May 2023" (core.timex)',
    )


class DocumentColumns:
    """Per position: the day the document was said and the days it speaks of (core.timex), and
    as numpy columns for the learned fusion's features: the group (an id per distinct group),
    the speakers (an id per distinct lowercased `speaker` field), the day said (an ordinal, -1: none),
    whether it speaks of a time, whether it has lexical extras (a caption), and log1p of the
    text's length."""

    def __init__(self) -> None:
        self.said: list[TimeSpan | None] = []
        self.events: list[tuple[TimeSpan, ...]] = []
        self._group_ids: dict[str, int] = {}
        self.group = Column(np.int64)
        self._speaker_ids: dict[str, int] = {}
        #: Per speaker id, the lowercased names its field lists.
        self._speaker_names: list[frozenset[str]] = []
        self.speaker = Column(np.int64)
        #: Said by several speakers: an exchange already (a front end's message and its reply).
        self.several_speakers = Column(np.bool_)
        self.said_day = Column(np.int64)
        self.has_events = Column(np.bool_)
        self.has_extra = Column(np.bool_)
        self.length = Column(np.float64)

    def append(self, doc: MemoryDoc, said: date | None) -> None:
        """The next document's facts; `said`: the day it was said (parsed from `doc.when`)."""
        self.said.append(TimeSpan(said, said) if said is not None else None)
        self.events.append(tuple(resolve(doc.text, said)))
        self.group.append(self._group_ids.setdefault(doc.group, len(self._group_ids)))
        field = doc.speaker.lower()
        if field not in self._speaker_ids:
            self._speaker_ids[field] = len(self._speaker_ids)
            self._speaker_names.append(speaker_names(field))
        self.speaker.append(self._speaker_ids[field])
        self.several_speakers.append(len(self._speaker_names[self._speaker_ids[field]]) > 1)
        self.said_day.append(said.toordinal() if said is not None else -1)
        self.has_events.append(bool(self.events[-1]))
        self.has_extra.append(bool(doc.extra))
        self.length.append(float(np.log1p(len(doc.text))))

    def said_by(self, positions: np.ndarray, lowered: str) -> np.ndarray:
        """Per position, whether a lowercased speaker's name is among its document's speakers:
        a chat front end's turn is a user's message and the reply, said by both."""
        ids = [i for i, names in enumerate(self._speaker_names) if lowered in names]
        return np.isin(self.speaker.values[positions], np.asarray(ids, dtype=np.int64))


def speaker_names(field: str) -> frozenset[str]:
    """The names a document's `speaker` field lists (commas between several)."""
    return frozenset(name.strip() for name in field.split(",") if name.strip())
