"""What a `HybridIndex` holds per document: the document as the caller gives it (`MemoryDoc`),
a hit as it is handed back (`Hit`), and the per-position facts the fusion reads
(`DocumentColumns`: the day said, the days spoken of, group, speaker, ...).

Contract: `DocumentColumns.append` is called once per document, in position order; every
column is a pure function of the document (the days spoken of resolved by core.timex against
the day it was said), except a phrase relative to an event the chat named ("the week before
the wedding"), which the documents before it date (`EventCalendar`): in position order, so an
index rebuilt from the same documents holds the same spans.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from core.recall.columns import Column
from core.recall.query import STOP_WORDS
from core.timex import EventAnchor, QueryDate, TimeSpan, event_anchors, from_event, resolve

_STOP = frozenset(STOP_WORDS)
_WORD = re.compile(r"[a-z][a-z'\u2019-]{2,}")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
#: Where a sentence ends for `question_share` (a line break too: a front end's row holds one
#: message a line, and a message may end without a mark).
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
#: Up to three words after a determiner: where a sentence names a thing ("a charity race").
_NOUN_PHRASE = re.compile(
    r"\b(?:the|a|an|my|our|his|her|their|your)\s+((?:[a-z][a-z'\u2019-]*\s+){0,2}[a-z][a-z'\u2019-]*)"
)


def _noun_run(words: tuple[str, ...]) -> tuple[str, ...]:
    """The words before the first function word: "movie did well" -> ("movie",), "big race we"
    -> ("big", "race")."""
    for index, word in enumerate(words):
        if word in _STOP or not _WORD.fullmatch(word):
            return words[:index]
    return words


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


class EventCalendar:
    """When the events a conversation named happened, as far as its documents dated them: each
    word of a sentence that holds exactly one resolved time expression (and no phrase relative
    to another event) is dated by it, the latest such sentence winning ("I ran a charity race
    last weekend" dates "charity" and "race"). A later phrase relative to an event ("the day
    after the race", "since the race") is resolved against that date (`core.timex.from_event`):
    of its up to three words, the longest run whose last word is dated names the event."""

    def __init__(self) -> None:
        self._days: dict[str, TimeSpan] = {}

    def spans(self, text: str, said: date | None, spans: list[TimeSpan]) -> list[TimeSpan]:
        """The spans of `text`'s phrases relative to an event, learning first what its own
        sentences date ("Our wedding is on June 10; the week before the wedding ...")."""
        if said is None:
            return []
        self._learn(text, spans)
        return self._resolved(event_anchors(text), said)

    def question_dates(self, question: str) -> list[TimeSpan]:
        """The days a question's phrases relative to an event mean, as far as the documents so
        far dated the event ("What did Ann do the weekend after the charity race?" asks about
        the weekend after the race's days). Not "since the race": asked, that is every day
        from then on, which ties the question to no day in particular."""
        anchors = [a for a in event_anchors(question) if a.unit != "since"]
        return self._resolved(anchors, date.max) if anchors else []

    def _resolved(self, anchors: list[EventAnchor], said: date) -> list[TimeSpan]:
        out: list[TimeSpan] = []
        for anchor in anchors:
            words = _noun_run(anchor.words)
            for used in range(len(words), 0, -1):
                event = self._days.get(words[used - 1])
                if event is not None and anchor.names_event(used):
                    span = from_event(anchor, used, event, said)
                    if span is not None:
                        out.append(span)
                    break
        return out

    def _learn(self, text: str, spans: list[TimeSpan]) -> None:
        for sentence in _SENTENCE_END.split(text):
            lowered = sentence.lower()
            inside = [s for s in spans if s.phrase and s.phrase.lower() in lowered]
            if len(inside) != 1 or event_anchors(sentence):
                continue
            timed = set(_WORD.findall(inside[0].phrase.lower()))
            for phrase in _NOUN_PHRASE.finditer(lowered):
                for word in _noun_run(tuple(phrase.group(1).split())):
                    if word not in timed:
                        self._days[word] = inside[0]


#: How long before or after a day a turn that speaks of it is looked for: "I went hiking
#: yesterday" said the morning after, "I'm hiking on Saturday!" said the Wednesday before.
SPOKEN_OF_WITHIN_DAYS = 7


class DocumentColumns:
    """Per position: the day the document was said and the days it speaks of (core.timex), and
    as numpy columns for the learned fusion's features: the group (an id per distinct group),
    the speakers (an id per distinct lowercased `speaker` field), the day said (an ordinal, -1: none),
    whether it speaks of a time, whether it has lexical extras (a caption), log1p of the
    text's length, and the share of its words that ask (`question_share`)."""

    def __init__(self) -> None:
        self.said: list[TimeSpan | None] = []
        self.events: list[tuple[TimeSpan, ...]] = []
        self._calendar = EventCalendar()
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
        self.question_share = Column(np.float64)

    def append(self, doc: MemoryDoc, said: date | None) -> None:
        """The next document's facts; `said`: the day it was said (parsed from `doc.when`)."""
        self.said.append(TimeSpan(said, said) if said is not None else None)
        spans = resolve(doc.text, said)
        self.events.append((*spans, *self._calendar.spans(doc.text, said, spans)))
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
        self.question_share.append(question_share(doc.text))

    def question_dates(self, question: str) -> list[QueryDate]:
        """The dates a question names relative to an event the documents dated
        (`EventCalendar.question_dates`): "the week before the wedding"."""
        return [QueryDate(span=span) for span in self._calendar.question_dates(question)]

    def of_days(self, spans: tuple[TimeSpan, ...], count: int, limit: int) -> list[int]:
        """The positions (of the first `count`) of the documents `within_days` of `spans`, the
        latest `limit` of them in order: a question about "yesterday" asks about those. One that
        speaks of such a day is looked for among those said in the week before or after it."""
        days = self.said_day.values[:count]
        inside = np.zeros(count, dtype=bool)
        near = np.zeros(count, dtype=bool)
        for span in spans:
            first, last = span.start.toordinal(), span.end.toordinal()
            inside |= (days >= first) & (days <= last)
            near |= (days >= first - SPOKEN_OF_WITHIN_DAYS) & (days <= last + SPOKEN_OF_WITHIN_DAYS)
        near &= self.has_events.values[:count]
        found: list[int] = []
        for p in np.flatnonzero(inside | near)[::-1].tolist():
            if inside[p] or self.within_days(p, spans):
                found.append(p)
                if len(found) == limit:
                    break
        return found[::-1]

    def within_days(self, position: int, spans: tuple[TimeSpan, ...]) -> bool:
        """Whether the document at `position` was said within one of `spans`, or speaks of a day
        (or days) inside one: "I went hiking yesterday", said the morning after, is of that day,
        and so is "I'm hiking tomorrow", said the evening before."""
        day = int(self.said_day.values[position])
        if day >= 0 and any(s.start.toordinal() <= day <= s.end.toordinal() for s in spans):
            return True
        return any(
            s.start <= e.start and e.end <= s.end for s in spans for e in self.events[position]
        )

    def said_by(self, positions: np.ndarray, lowered: str) -> np.ndarray:
        """Per position, whether a lowercased speaker's name is among its document's speakers:
        a chat front end's turn is a user's message and the reply, said by both."""
        ids = [i for i, names in enumerate(self._speaker_names) if lowered in names]
        return np.isin(self.speaker.values[positions], np.asarray(ids, dtype=np.int64))


def question_share(text: str) -> float:
    """The share of a text's words that are in its sentences that ask (end with "?"): a turn
    that only asks ("Wow, congrats! What game was it?") shares a question's words but is seldom
    what answers it; its reply is. A learned-fusion feature (docs/decisions/recall-fusion.md)."""
    sentences = [s.split() for s in _SENTENCE_BREAK.split(text.strip())]
    words = sum(len(s) for s in sentences)
    asking = sum(len(s) for s in sentences if s and s[-1].endswith("?"))
    return asking / words if words else 0.0


def speaker_names(field: str) -> frozenset[str]:
    """The names a document's `speaker` field lists (commas between several)."""
    return frozenset(name.strip() for name in field.split(",") if name.strip())
