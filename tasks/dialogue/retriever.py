"""Retriever slot: graph recall + hybrid turn recall for one conversation.

Graph recall: the conversation's entities named in the latest messages (by normalised name
or alias), the active relations touching them, then the strongest relations overall, and
the latest milestones. Turn recall: core.recall's hybrid retrieval (BM25 + sentence
embeddings + speaker and date signals, fused) over EVERY remembered turn of the
conversation, committed or blocked by the gate (KGMemory rows, see kg.dialogue).

Each process keeps one HybridIndex per conversation (an LRU bounded in turns), topped up from the
graph by memory position: a turn reads only the rows it has not seen, by indexed position
keys, including turns other processes remembered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from core.llm import LLMGateway
from core.recall import (
    Hit,
    HybridIndex,
    IndexRegistry,
    MemoryDoc,
    asked_about,
    embedded_query,
    embedded_text,
    query_texts,
    says_something,
    vector_text,
)
from core.timex import date_notes, deictic_dates, parse_when
from kg import vocabulary as vocab
from kg.dialogue import (
    ConversationSnapshot,
    DialogueEntity,
    DialogueMilestone,
    DialogueRelation,
    DialogueRepository,
    MemoryRow,
    anchor_token,
    turn_key,
)
from tasks.dialogue.models import ChatMessage, RecalledTurnOut

log = logging.getLogger(__name__)


class RecalledTurn(RecalledTurnOut):
    """A recalled turn as the API returns it, plus the fusion's per-signal scores."""

    signals: dict[str, float] = Field(default_factory=dict)


class Retrieval(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    known_entities: list[DialogueEntity] = Field(default_factory=list)
    mentioned: list[DialogueEntity] = Field(default_factory=list)
    relations: list[DialogueRelation] = Field(default_factory=list)
    milestones: list[DialogueMilestone] = Field(default_factory=list)
    recalled: list[RecalledTurn] = Field(default_factory=list)
    stored_turns: int = 0
    speakers: list[str] = Field(
        default_factory=list, description="who has spoken in the conversation so far"
    )
    query_vector: list[float] | None = Field(
        None,
        description="the embedding of what the turn's memory row embeds (`row_text`) when recall"
        " asked with that very text (the commit reuses it)",
    )
    asked_dates: list[str] = Field(
        default_factory=list,
        description="the days the asked message names through the day it is said ('yesterday ="
        " Friday 18 March 2022'), as the recalled turns' dates are spelled out",
    )


def said_when(messages: list[ChatMessage], *, said_now: bool = True) -> str:
    """When messages were said: the time the last one that has a time gives, else now (UTC)
    for messages being said now, and "" (undated) for a transcript's (`said_now=False`)."""
    given = next((m.time for m in reversed(messages) if m.time), None)
    if given:
        return given
    return datetime.now(UTC).strftime("%-I:%M %p on %-d %B, %Y") if said_now else ""


def said_day(when: str) -> str:
    """The group of a turn that has no session of its own: the day it was said ("8 May,
    2023"), whatever form its time takes (a front end's "May 8, 2023 1:56pm", ISO 8601, Unix
    time), or the text after " on " when no full date can be read from it. The fusion's
    neighbour and session features join only turns of one group, so a group per timestamp
    would leave every turn alone: a chat imported with ISO times recalled 0.776 held out
    against 0.834 with its days as groups (docs/decisions/recall-fusion.md)."""
    day = parse_when(when)
    return f"{day.day} {day:%B}, {day.year}" if day else when.split(" on ")[-1]


def session_group(session: int | str) -> str:
    """The group of a turn that names its session (a recorded dialogue's "session 3", an
    import's `session`): the turns of one session are one exchange, whatever their days."""
    return f"session {session}"


def _doc_group(row: MemoryRow) -> str:
    """The row's group; a row stored before groups were days (its group the text after " on ",
    a whole ISO or Unix time when there is none) is grouped by its day now, with no migration."""
    if row.group and row.group != row.when.split(" on ")[-1]:
        return row.group  # its own: a recorded dialogue's session, or a day already
    return said_day(row.when)


def memory_doc(row: MemoryRow) -> MemoryDoc:
    extra = " ".join([row.extra, *row.facts]).strip()
    return MemoryDoc(
        key=row.key,
        text=row.text,
        extra=extra,
        speaker=row.speaker,
        group=_doc_group(row),
        when=row.when,
        meta={
            "turn_id": row.turn_id,
            "seq": row.seq,
            "source_refs": row.source_refs,
            "facts": row.facts,
            "committed": row.committed,
        },
    )


@dataclass(frozen=True)
class PinnedMemory:
    """The index as one read left it. A reset (a rewind, a replace) swaps the index for a new
    one and leaves this one as it was, so a reader searches what it read, never an index
    emptied between its read and its search."""

    hybrid: HybridIndex | None
    speakers: frozenset[str]

    def __len__(self) -> int:
        return len(self.hybrid) if self.hybrid is not None else 0

    def spelled(self, query: str) -> str:
        """`query` as recall asks it: its typos read as the memory's words
        (`core.recall.HybridIndex.spelled`)."""
        return self.hybrid.spelled(query) if self.hybrid is not None else query

    def search(
        self,
        query: str,
        vector: np.ndarray | None,
        k: int,
        names: list[str],
        linked: list[str] | None = None,
        plain_vector: np.ndarray | None = None,
        parts: list[tuple[str, np.ndarray | None]] | None = None,
        shown: Callable[[str], bool] | None = None,
        asked_on: date | None = None,
    ) -> list[RecalledTurn]:
        """`linked`: keys of turns the graph's facts tie to the query (`linked_turns`).
        `plain_vector`: the embedding of `plain_query(query, speakers)` (None: `vector`).
        `parts`: a two-event question's parts with their embeddings (`embedded_query`).
        `shown`: whether a turn's text is in the front end's window (`on_screen`).
        `asked_on`: the day the query is asked, which its relative dates count from."""
        if self.hybrid is None or k <= 0:
            return []
        hits = self.hybrid.search(
            query,
            vector,
            k,
            names=names,
            linked=linked,
            plain_vector=plain_vector,
            parts=parts,
            shown=shown,
            asked_on=asked_on,
        )
        return [recalled(hit) for hit in hits]


class TurnMemoryIndex:
    """The remembered turns of one conversation in a HybridIndex, with the read cursor.

    `generation` counts resets (a rewind, a replace): a reader that took the cursor before a
    reset must not add what it read then (rows of the turns the rewind removed) to the index
    built after it, or the old text of a replaced turn would stay cached and be recalled."""

    def __init__(self) -> None:
        self.index: HybridIndex | None = None
        self.max_seq = 0
        self.anchor_key: str | None = (
            None  # anchor_token of turn `max_seq`: proves the cache is still current
        )
        self.speakers: set[str] = set()
        self.generation = 0
        self.lock = threading.Lock()
        #: Rows with a vector recall cannot use (another model's, or of another length than the
        #: index's), since the last reset.
        self.foreign_vectors = 0
        self._foreign_reported = False

    def cursor(self) -> tuple[int, str | None]:
        with self.lock:
            return self.max_seq, self.anchor_key

    def read_cursor(self) -> tuple[int, str | None, int]:
        """(position, anchor, generation): what a reader passes back to `sync`."""
        with self.lock:
            return self.max_seq, self.anchor_key, self.generation

    def __len__(self) -> int:
        return len(self.index) if self.index is not None else 0

    def sync(
        self,
        rows: list[MemoryRow],
        *,
        reset: bool,
        generation: int | None = None,
        vectors_epoch: int = 0,
        vectors_from: str = "",
    ) -> PinnedMemory | None:
        """Add the rows read after the cursor (`reset`: they are every row) and return the index
        as it then is. None, and nothing changed, when the index was reset since the reader took
        its cursor (`generation`). `vectors_epoch`: the conversation's, as read with the rows;
        `vectors_from`: the embedding model queries are embedded with (`usable_vector`)."""
        with self.lock:
            if generation is not None and generation != self.generation:
                return None
            if reset:
                self.index, self.max_seq, self.anchor_key, self.speakers = None, 0, None, set()
                self.generation += 1
                self.foreign_vectors = 0
            fresh = [r for r in rows if r.seq > self.max_seq]
            if not fresh:
                return self._pinned()
            own = next((len(r.embedding) for r in fresh if usable_vector(r, vectors_from)), 0)
            if self.index is None:
                self.index = HybridIndex(own or 384)
            elif own:
                self.index.adopt_dimensions(own)  # no vector held yet: the model's length
            dims = self.index.dimensions
            usable = [usable_vector(r, vectors_from) and len(r.embedding) == dims for r in fresh]
            self.foreign_vectors += sum(
                1 for r, used in zip(fresh, usable, strict=True) if r.embedding and not used
            )
            # Rows are added in position order; a run of rows without a usable vector is
            # indexed lexically only (another embedding model made them, or none).
            start = 0
            while start < len(fresh):
                end = start
                while end < len(fresh) and usable[end] == usable[start]:
                    end += 1
                chunk = fresh[start:end]
                vectors = (
                    np.asarray([r.embedding for r in chunk], dtype=np.float32)
                    if usable[start]
                    else None
                )
                self.index.add([memory_doc(r) for r in chunk], vectors)
                start = end
            self.speakers.update(s for r in fresh for s in speakers_of(r.speaker))
            self.max_seq, self.anchor_key = (
                fresh[-1].seq,
                anchor_token(fresh[-1].key, fresh[-1].text, vectors_epoch),
            )
            return self._pinned()

    def foreign_vectors_to_report(self) -> int:
        """The rows another model embedded, the first time there are any (0 afterwards): what a
        reader warns about once, not on every turn."""
        with self.lock:
            if not self.foreign_vectors or self._foreign_reported:
                return 0
            self._foreign_reported = True
            return self.foreign_vectors

    def _pinned(self) -> PinnedMemory:
        # Under self.lock. Later rows are added to the same HybridIndex (a reader may see them);
        # a reset replaces it, and the pinned one stays whole.
        return PinnedMemory(self.index, frozenset(self.speakers))

    def pinned(self) -> PinnedMemory:
        with self.lock:
            return self._pinned()

    def holds(self, key: str) -> bool:
        with self.lock:
            return self.index is not None and key in self.index.positions

    def text_of(self, key: str) -> str | None:
        """The remembered text of turn `key`, if the index holds it."""
        with self.lock:
            if self.index is None or key not in self.index.positions:
                return None
            return self.index.docs[self.index.positions[key]].text

    def search(
        self,
        query: str,
        vector: np.ndarray | None,
        k: int,
        names: list[str],
        linked: list[str] | None = None,
        plain_vector: np.ndarray | None = None,
        parts: list[tuple[str, np.ndarray | None]] | None = None,
        shown: Callable[[str], bool] | None = None,
        asked_on: date | None = None,
    ) -> list[RecalledTurn]:
        """Search the index as it is now (see PinnedMemory.search)."""
        return self.pinned().search(
            query, vector, k, names, linked, plain_vector, parts, shown, asked_on
        )


def recalled(hit: Hit) -> RecalledTurn:
    meta = hit.meta
    return RecalledTurn(
        key=hit.key,
        turn_id=str(meta.get("turn_id", "")),
        seq=int(meta.get("seq", 0)),
        speaker=hit.speaker,
        text=hit.text,
        when=hit.when,
        event_dates=list(hit.events),
        facts=list(meta.get("facts", [])),
        source_refs=list(meta.get("source_refs", [])),
        committed=bool(meta.get("committed", False)),
        score=hit.score,
        signals=hit.signals,
    )


class VectorIndexRegistry:
    """One TurnMemoryIndex per (graph, conversation) in this process, least recently used
    dropped past `max_indexes` conversations or `max_turns` turns in all (settings
    `recall_cache_turns`). The budget is in turns because an index's memory grows with them;
    a count alone either thrashes (more active conversations than slots: every turn rebuilds
    its index from the graph) or is unbounded in size."""

    def __init__(self, max_indexes: int = 1024, max_turns: int | None = 100_000) -> None:
        self._registry = IndexRegistry(max_indexes, max_documents=max_turns)

    @property
    def evictions(self) -> int:
        return self._registry.evictions

    def turns(self) -> int:
        return self._registry.documents()

    def foreign_vectors(self) -> int:
        """Turns of the cached conversations recalled by their words only because their vectors
        are another model's (`TurnMemoryIndex.foreign_vectors`): `reembed` gives them this one's."""
        return sum(index.foreign_vectors for index in self._registry.cached())

    def get(self, graph: str, conversation_id: str) -> TurnMemoryIndex:
        index: TurnMemoryIndex = self._registry.get(graph, conversation_id, TurnMemoryIndex)
        return index

    def forget(self, graph: str, conversation_id: str) -> None:
        """Drop a conversation's cached index (after a rewind: positions are reused)."""
        self.get(graph, conversation_id).sync([], reset=True)

    def forget_if_held(self, graph: str, conversation_id: str, key: str) -> bool:
        """Drop a conversation's cached index if it holds turn `key` (a turn remembered
        before it was committed: the cache has its old flag and facts). True if dropped."""
        index: TurnMemoryIndex | None = self._registry.peek(graph, conversation_id)
        if index is None or not index.holds(key):
            return False
        index.sync([], reset=True)
        return True


def memory_row(
    conversation_id: str,
    key: str,
    turn_id: str,
    messages: list[ChatMessage],
    *,
    embedding: list[float] | None = None,
    embedded_by: str = "",
    facts: list[str] | None = None,
    committed: bool = False,
    said_now: bool = True,
) -> MemoryRow:
    """A turn's memory row from its messages (speaker lines, message ids, the turn's time);
    `embedded_by`: the model that made `embedding` (LLMGateway.embedding_fingerprint).
    `said_now=False` for a turn of a transcript (an ingested file, an import): without a time
    of its own it stays undated rather than dated when stored. Dated so, an old chat log told
    the model that everything in it was said today, and resolved its "yesterday" to
    yesterday."""
    when = said_when(messages, said_now=said_now)
    return MemoryRow(
        key=key,
        conversation_id=conversation_id,
        turn_id=turn_id,
        speaker=", ".join(dict.fromkeys(m.speaker for m in messages)),
        text=turn_text(messages),
        when=when,
        group=said_day(when),
        source_refs=[m.message_id for m in messages if m.message_id],
        facts=list(facts or []),
        embedding=[round(float(x), 7) for x in (embedding if embedding is not None else [])],
        embedded_by=embedded_by if embedding is not None else "",
        committed=committed,
    )


def mentioned_entities(entities: list[DialogueEntity], text: str) -> list[DialogueEntity]:
    """Entities whose name or an alias occurs as whole words in `text` (normalised)."""
    haystack = f" {vocab.normalize_name(text)} "
    found = []
    for entity in entities:
        keys = {
            vocab.normalize_name(entity.name),
            *(vocab.normalize_name(a) for a in entity.aliases),
        }
        if any(key and f" {key} " in haystack for key in keys):
            found.append(entity)
    return found


def select_relations(
    relations: list[DialogueRelation], focus: set[str], limit: int
) -> list[DialogueRelation]:
    """Relations touching the focus entities first (strongest first), then the strongest others."""
    touching = [r for r in relations if r.source_id in focus or r.target_id in focus]
    others = [r for r in relations if r not in touching]
    ranked = sorted(touching, key=lambda r: -r.weight) + sorted(others, key=lambda r: -r.weight)
    return ranked[:limit]


def turn_text(messages: list[ChatMessage]) -> str:
    """The turn's messages as one text, each line with its speaker's name: what the memory
    stores and embeds, and the extractor's evidence."""
    return "\n".join(m.line() for m in messages)


def row_messages(row: MemoryRow) -> list[ChatMessage]:
    """A remembered turn's messages again, from its text (`turn_text`'s inverse): a line that
    opens with one of the row's speakers and ": " starts a message, any other line continues
    the one before (a message of several lines)."""
    speakers = speakers_of(row.speaker)
    messages: list[ChatMessage] = []
    for line in row.text.split("\n"):
        speaker = next((s for s in speakers if line.startswith(f"{s}: ")), None)
        if speaker is not None or not messages:
            name = speaker or row.speaker
            content = line[len(speaker) + 2 :] if speaker else line
            messages.append(ChatMessage(role="user", name=name, content=content, time=row.when))
        else:
            last = messages[-1]
            messages[-1] = last.model_copy(update={"content": f"{last.content}\n{line}"})
    return messages


def remembered_window(
    repo: DialogueRepository, conversation_id: str, count: int
) -> list[ChatMessage]:
    """The last `count` messages memory holds of a conversation, as a chat front end's window
    would show them (each remembered turn holds a message at least, so its last `count` turns
    hold them all)."""
    head = repo.memory_head(conversation_id)
    if not head or count <= 0:
        return []
    rows = repo.memory_rows(conversation_id, max(1, head - count + 1), head)
    return [m for row in rows for m in row_messages(row)][-count:]


def usable_vector(row: MemoryRow, vectors_from: str) -> bool:
    """Whether a remembered row's vector can be compared with a query embedded by model
    `vectors_from`: it has one, made by that model. A row remembered before rows recorded their
    model (`embedded_by` empty) is taken as the current model's (its length is checked still),
    as is every row when the caller names no model."""
    return bool(row.embedding) and (
        not vectors_from or not row.embedded_by or row.embedded_by == vectors_from
    )


def speakers_of(speaker: str) -> list[str]:
    """The names in a memory row's `speaker` field (a turn by several speakers lists them all)."""
    return [s.strip() for s in speaker.split(",") if s.strip()]


def row_text(messages: list[ChatMessage], speakers: Iterable[str]) -> str:
    """What a turn's memory row embeds: `core.recall.embedded_text` of its text (`turn_text`),
    with the speakers of the rows before it (`speakers`) and its own: the text a memory query
    for the same messages embeds, so the commit can store the query's vector."""
    return embedded_text(turn_text(messages), {*speakers, *(m.speaker for m in messages)})


def row_texts(rows: list[MemoryRow], known: set[str] | None = None) -> list[str]:
    """What each of a transcript's memory rows embeds, in order, each with the speakers of the
    rows up to it (as `row_text` has them when the turns are committed one by one). `known`:
    the speakers of the rows before these (updated in place), for a transcript read in pages."""
    known = set() if known is None else known
    texts = []
    for row in rows:
        known.update(speakers_of(row.speaker))
        texts.append(embedded_text(row.text, known))
    return texts


def asked_messages(messages: list[ChatMessage], window: list[ChatMessage]) -> list[ChatMessage]:
    """What memory is asked with for a turn's pending messages: the messages themselves, or,
    when none of them names a topic (`core.recall.says_something`: "", an emoji, "lol yeah",
    "Yes!"), the window's last message that does. Asked by its own words, such a message would
    draw every turn that says the same nothing ("Yeah!", "Thanks!"), or, with no word, turns
    its embedding lands near by chance. It continues the topic of the message it answers ("Did
    you adopt the dog?" "Yes!"), so the reply it gets needs memory of that topic. Empty when
    nothing names one: nothing is recalled. A name the message only addresses ("Bye Joanna!")
    is not its topic: the chat's names are its messages' senders."""
    names = {m.name for m in (*window, *messages) if m.name}
    if any(says_something(m.content, names) for m in messages):
        return messages
    topical = [m for m in window if says_something(m.content, names)]
    return topical[-1:]


def on_screen(window: list[ChatMessage]) -> Callable[[str], bool]:
    """Whether a remembered turn's text is in the front end's window (every line of it, in
    order, as whole messages there): chat the next prompt already holds."""
    shown = f"\n{turn_text(window)}\n"
    return lambda text: f"\n{text}\n" in shown


def recall_query(
    messages: list[ChatMessage], speakers: list[str] | set[str] | frozenset[str]
) -> str:
    """What memory is asked for a turn's pending messages: each message as
    `core.recall.asked_about` words it, under the name of the speaker it is about (not of its
    sender)."""
    return "\n".join(asked_about(m.speaker, m.content, speakers) for m in messages)


def linked_turns(
    conversation_id: str,
    mentioned: list[DialogueEntity],
    relations: list[DialogueRelation],
    speakers: set[str] | None = None,
) -> list[str]:
    """Keys of the turns the graph's facts about the entities a query names were extracted
    from, strongest first: the turns that started or ended each relation touching them
    (strongest relation first), then the turns that first and last mentioned each entity.
    The conversation's speakers are left out: facts about them come from every other turn
    (the speaker boost covers them).
    Recall ranks them as a ranker of their own (core.recall `linked`): a turn that says
    "I finally brought him home" is tied to a question about Max through the relation the
    extractor drew from it, though it never names him."""
    spoken = {vocab.normalize_name(s) for s in speakers or set()}
    mentioned = [e for e in mentioned if vocab.normalize_name(e.name) not in spoken]
    focus = {e.entity_id for e in mentioned}
    turns: list[str | None] = []
    for relation in sorted(
        (r for r in relations if r.source_id in focus or r.target_id in focus),
        key=lambda r: -r.weight,
    ):
        turns += [relation.since_turn, relation.ended_turn]
    for entity in mentioned:
        turns += [entity.first_turn, entity.last_turn]
    return [turn_key(conversation_id, t) for t in dict.fromkeys(t for t in turns if t)]


def _names(index: PinnedMemory, entities: list[DialogueEntity]) -> list[str]:
    names = set(index.speakers)
    for entity in entities:
        names.add(entity.name)
        names.update(entity.aliases)
    return sorted(n for n in names if n)


#: Reads a reader retries when a rewind reset the index under it (each retry is one more read).
READ_ATTEMPTS = 3


def _read_into(
    index: TurnMemoryIndex,
    repo: DialogueRepository,
    conversation_id: str,
    vectors_from: str,
) -> tuple[ConversationSnapshot, PinnedMemory]:
    """Read the conversation's snapshot after the index's cursor and add the new rows (their
    vectors where `vectors_from`, the model queries are embedded with, made them); read again
    when the index was reset meanwhile (a rewind between the read and the add: what was read
    may be gone). Returns the snapshot and the index as that read left it, to search."""
    for _ in range(READ_ATTEMPTS - 1):
        after_seq, anchor, generation = index.read_cursor()
        snapshot = repo.snapshot(conversation_id, after_seq=after_seq, anchor_key=anchor)
        pinned = index.sync(
            snapshot.new_turns,
            reset=snapshot.reset,
            generation=generation,
            vectors_epoch=snapshot.vectors_epoch,
            vectors_from=vectors_from,
        )
        if pinned is not None:
            break
    else:
        snapshot = repo.snapshot(conversation_id)  # from the start: whatever was cached goes
        pinned = index.sync(
            snapshot.new_turns,
            reset=True,
            vectors_epoch=snapshot.vectors_epoch,
            vectors_from=vectors_from,
        )
    assert pinned is not None  # the loop broke on one, and a sync without a generation applies
    if foreign := index.foreign_vectors_to_report():
        log.warning(
            "conversation %s: %d remembered turns have vectors of another embedding model "
            "(or of another length than the others; the model now: %s) and are recalled by "
            "their words only: run `python -m flows.dialogue reembed --conversation-id %s`",
            conversation_id,
            foreign,
            vectors_from,
            conversation_id,
        )
    return snapshot, pinned


def remembered_speakers(
    index: TurnMemoryIndex, repo: DialogueRepository, conversation_id: str, vectors_from: str
) -> frozenset[str]:
    """The speakers of every turn memory holds of the conversation (the index topped up from the
    graph first): what the rows appended after them embed without (`row_texts`)."""
    return _read_into(index, repo, conversation_id, vectors_from)[1].speakers


QueryVectors = Callable[[], dict[str, Any]]


def start_query_vectors(
    index: TurnMemoryIndex,
    messages: list[ChatMessage],
    window: list[ChatMessage],
    recall_k: int,
    embed: Callable[[list[str]], Any],
    submit: Callable[..., Future[Any]],
) -> QueryVectors | None:
    """Start embedding what recall will ask for `messages` (`query_texts` with the speakers the
    index holds now) on `submit`'s thread, so the embedding overlaps `retrieve`'s graph read;
    returns the getter `retrieve` takes as `query_vectors`. None when there is nothing to search
    yet (nothing remembered, `recall_k` 0, or no topic asked: `asked_messages` of the messages
    and their `window`): no embedding call at all."""
    asked = asked_messages(messages, window)
    if recall_k <= 0 or not len(index) or not asked:
        return None
    pinned = index.pinned()
    speakers = pinned.speakers
    texts = query_texts(pinned.spelled(recall_query(asked, speakers)), speakers)
    pending = submit(embed, texts)
    return lambda: dict(zip(texts, pending.result(), strict=True))


def retrieve(
    repo: DialogueRepository,
    gateway: LLMGateway,
    index: TurnMemoryIndex,
    conversation_id: str,
    messages: list[ChatMessage],
    *,
    window: list[ChatMessage] | None = None,
    recall_k: int,
    relation_limit: int = 12,
    purpose: str = "",
    query_vectors: QueryVectors | None = None,
    said_now: bool = True,
) -> Retrieval:
    """Memory for a turn's pending `messages`, the front end's `window` (the chat before them)
    shown: the topic is asked as `asked_messages` words it, and the turns the window shows
    (`on_screen`) come after every other candidate (core.recall `shown_last`): in a chat longer
    than its window, memory brings what the prompt lacks instead of repeating its last lines
    (SillyTavern's own vector storage keeps the last messages out of what it inserts, for the
    same reason); in a chat the window holds whole, it still points at what matters there.

    `query_vectors`: returns embeddings computed elsewhere, by text (the pipeline starts
    them before the graph read, so the two overlap: `query_texts` of the asked messages with
    the speakers the index knew then); what is missing from them (a speaker the read brought)
    is embedded here, in one call, as everything is when there are none."""
    window = window or []
    snapshot, memory = _read_into(index, repo, conversation_id, gateway.embedding_fingerprint())
    asked = asked_messages(messages, window)
    query = memory.spelled(recall_query(asked, memory.speakers))
    mentioned = mentioned_entities(snapshot.entities, turn_text(asked or messages))
    relations = select_relations(
        snapshot.relations, {e.entity_id for e in mentioned}, relation_limit
    )
    recalled_turns: list[RecalledTurn] = []
    vector = None
    # "What did I tell you yesterday?": yesterday as of the message asking (`said_now`
    # False: a transcript's message without a time was said on no day known).
    asked_on = parse_when(said_when(asked, said_now=said_now)) if asked else None
    if recall_k > 0 and len(memory) and asked:
        # Nothing remembered yet means nothing to search: the first turn makes no embedding call.
        texts = query_texts(query, memory.speakers)
        known = query_vectors() if query_vectors is not None else {}
        missing = [text for text in texts if text not in known]
        if missing:
            known = {
                **known,
                **dict(zip(missing, gateway.embed(missing, purpose=purpose), strict=True)),
            }
        vector, plain_vector, parts = embedded_query(query, memory.speakers, known)
        recalled_turns = memory.search(
            query,
            vector,
            recall_k,
            _names(memory, snapshot.entities),
            linked_turns(conversation_id, mentioned, snapshot.relations, memory.speakers),
            plain_vector,
            parts,
            on_screen(window) if window else None,
            asked_on,
        )
    return Retrieval(
        known_entities=snapshot.entities,
        mentioned=mentioned,
        relations=relations,
        milestones=snapshot.milestones,
        recalled=recalled_turns,
        stored_turns=snapshot.turn_count,
        speakers=sorted(memory.speakers),
        # The commit stores the embedding of the turn's row text: the query's is that one when
        # the two texts are the same (a message asked under either speaker's name or none).
        query_vector=(
            [float(x) for x in vector]
            if vector is not None
            and vector_text(query, memory.speakers) == row_text(messages, memory.speakers)
            else None
        ),
        asked_dates=date_notes(deictic_dates(query, asked_on)),
    )


def recall(
    repo: DialogueRepository,
    gateway: LLMGateway,
    index: TurnMemoryIndex,
    conversation_id: str,
    query: str,
    k: int,
    *,
    asked_on: date | None = None,
    purpose: str = "dialogue.recall",
) -> list[RecalledTurn]:
    """Hybrid recall for an arbitrary question (the regression recall probe), with the same
    graph signals as a turn's retrieval (the speakers and entities it names, the turns the
    facts about them were extracted from). `asked_on`: the day the question is asked, when the
    benchmark gives it (LongMemEval's `question_date`): its relative dates count from it."""
    snapshot, memory = _read_into(index, repo, conversation_id, gateway.embedding_fingerprint())
    if not len(memory):
        return []
    query = memory.spelled(query)
    # One embedding call for all: the question without the speakers' names, and its parts.
    texts = query_texts(query, memory.speakers)
    vector, plain_vector, parts = embedded_query(
        query, memory.speakers, dict(zip(texts, gateway.embed(texts, purpose=purpose), strict=True))
    )
    mentioned = mentioned_entities(snapshot.entities, query)
    return memory.search(
        query,
        vector,
        k,
        _names(memory, snapshot.entities),
        linked_turns(conversation_id, mentioned, snapshot.relations, memory.speakers),
        plain_vector,
        parts,
        asked_on=asked_on,
    )


def without_pending(
    retrieval: Retrieval,
    pending: dict[str, str | None],
    k: int | None = None,
    remembered: dict[str, str | None] | None = None,
) -> tuple[Retrieval, list[str]]:
    """The retrieval with nothing a pending write is about to change (`pending`: turn id -> the
    text memory will hold, None: removed): a recalled turn whose remembered text is not that
    text, and the milestones, relations and bios those turns wrote last, are left out. Returns the
    turn ids held back. `k`: recalled turns kept at most (the query asked for more to make room).
    `remembered`: turn id -> the text memory holds (None: none; see DialogueService.memory_query), for
    pending turns that were not recalled (their milestones, relations and bios are held back too
    when that text is not the new one)."""
    if not pending:
        return retrieval.model_copy(update={"recalled": retrieval.recalled[:k]}), []
    stale = {
        t.turn_id
        for t in retrieval.recalled
        if t.turn_id in pending and pending[t.turn_id] != t.text
    }
    # A turn being removed or rewritten: what the graph holds of it is the old text's.
    # A pending turn memory holds no text for (None) may be mid-replace: rewound, not yet written
    # again, while facts read a moment earlier still carry its old words. So it counts as changing
    # too; for a turn that was never committed nothing carries its id, and nothing is held back.
    changing = (
        stale
        | {turn_id for turn_id, text in pending.items() if text is None}
        | {turn_id for turn_id, held in (remembered or {}).items() if held != pending.get(turn_id)}
    )

    def unchanged(entity: DialogueEntity) -> DialogueEntity:
        # A bio last written by a changing turn may hold its old words: left out until it lands.
        if entity.last_turn in changing and (entity.bio_summary or entity.bio_traits):
            return entity.model_copy(update={"bio_summary": "", "bio_traits": []})
        return entity

    kept = retrieval.model_copy(
        update={
            "known_entities": [unchanged(e) for e in retrieval.known_entities],
            "mentioned": [unchanged(e) for e in retrieval.mentioned],
            "recalled": [t for t in retrieval.recalled if t.turn_id not in stale][:k],
            "milestones": [m for m in retrieval.milestones if m.turn_id not in changing],
            "relations": [r for r in retrieval.relations if r.since_turn not in changing],
        }
    )
    return kept, sorted(stale)
