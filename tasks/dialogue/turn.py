"""One turn through the six slots, the commit gate and the commit transaction, one method per
step of the state machine (spec 000):

    RETRIEVING   retrieve()             graph snapshot + hybrid recall of earlier turns
    INJECTING    inject()               the injection_packet within the token budget
    ACTING       act()                  the reply (generate) or the recorded messages
    EXTRACTING   extract()              entities, relation actions, bio patches, facts
    JUDGING      judge_and_chronicle()  identity conflicts and contradictions ...
    HISTORIANING                        ... and events and milestones, both at once
    PREPARED     prepare()              the commit gate decides; blocked(): text remembered only
    COMMITTING   commit()               one transaction: turn, memory row, facts; releases the lease
    COMMITTED    committed()

`TurnRun.run` walks the steps and turns any failure into ROLLED_BACK with nothing written
(its kind and whether it is retryable from core.errors.classify). The caller holds the conversation's lock and lease
(tasks.dialogue.pipeline); `run` also says whether the lease is still held, since the commit
transaction releases it whatever it finds.

Round trips per recorded turn: the query embedding (overlapping the retriever's graph read),
the extractor, max(judge, historian); the commit embedding reuses the retriever's query vector
(the same text in recorded mode) or is computed while the extractor runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core.errors import SkaldError
from core.llm import LLMGateway
from core.priority import QUERIES
from kg.dialogue import AppliedAction, CommitOutcome, DialogueRepository, TurnWrite
from kg.store import GraphStore
from prompts.dialogue.models import TurnExtraction
from tasks.dialogue.actor import ActorOutput, act
from tasks.dialogue.extractor import ExtractionPlan, extract
from tasks.dialogue.gate import commit_gate
from tasks.dialogue.historian import Chronicle, historian
from tasks.dialogue.injector import build_packet
from tasks.dialogue.judge import judge, proposal_lines
from tasks.dialogue.models import TurnCommitRequest, TurnResult
from tasks.dialogue.outcomes import Outcomes
from tasks.dialogue.parts import BioPatchResult, InjectionPacket, JudgeSummary, TurnState
from tasks.dialogue.retriever import (
    Retrieval,
    VectorIndexRegistry,
    memory_row,
    retrieve,
    row_text,
    start_query_vectors,
    turn_text,
)
from tasks.dialogue.routing import Route
from tasks.dialogue.slots import SlotScheduler
from tasks.dialogue.trace import TraceRecorder

log = logging.getLogger("skald.dialogue")

_COMMIT_ROUTE = Route(slot="commit", tier="embedding", source="none")


@dataclass(frozen=True)
class TurnContext:
    """What a turn uses of its service."""

    gateway: LLMGateway
    vectors: VectorIndexRegistry
    outcomes: Outcomes
    write_guard: Callable[[], AbstractContextManager[Any]]
    owner: str
    relation_limit: int


class TurnRun:
    """One turn, from RETRIEVING to COMMITTED or ROLLED_BACK."""

    def __init__(
        self,
        request: TurnCommitRequest,
        *,
        repo: DialogueRepository,
        store: GraphStore,
        trace: TraceRecorder,
        payload_hash: str,
        scheduler: SlotScheduler,
        routes: dict[str, Route],
        context: TurnContext,
    ) -> None:
        self.request = request
        self.config = request.config
        self.repo = repo
        self.store = store
        self.trace = trace
        self.payload_hash = payload_hash
        self.slots = scheduler
        self.routes = routes
        self.ctx = context
        self.gateway = context.gateway
        self.index = context.vectors.get(store.endpoint.label, request.conversation_id)

    # ------------------------------------------------------------------ the walk
    def run(self) -> tuple[TurnResult, bool]:
        """(result, whether the lease is still held): the commit transaction releases it."""
        try:
            # Each CPU step of a turn starts only once the memory queries in flight are answered
            # (bounded: core.priority); the slots yield the same way (tasks.dialogue.slots).
            QUERIES.yield_to_queries()
            retrieval = self.retrieve()
            packet = self.inject(retrieval)
            acted = self.act(packet)
            commit_embedding = self.embed_for_commit(retrieval, acted)
            raw, plan = self.extract(acted, retrieval)
            verdict, chronicle = self.judge_and_chronicle(acted, retrieval, raw, plan)
            base = self.prepare(packet, acted, plan, verdict, chronicle)
            if base.gate is not None and not base.gate.passed:
                return self.blocked(base, acted, retrieval, commit_embedding), True
            self.slots.check_deadline(TurnState.COMMITTING)
            QUERIES.yield_to_queries()  # before the serialised writes: no other commit waits on it
            outcome = self.commit(base, acted, plan, chronicle, retrieval, commit_embedding)
        except Exception as exc:  # a bug must not leave a lease behind or kill the server
            return self.ctx.outcomes.failed(self.request.ids(), self.trace, exc), True
        return self.committed(base, outcome), False

    # ------------------------------------------------------------------ the steps
    def retrieve(self) -> Retrieval:
        """RETRIEVING: the graph's view of the conversation and the recalled earlier turns."""
        request, config = self.request, self.config
        # The query embedding overlaps the retriever's graph read (it needs only the text and
        # the speakers the index holds); after a memory query for the same messages the
        # embedder has it already (core.embedder `encode_recent`).
        purpose = self.trace.purpose("retriever")
        query_vectors = start_query_vectors(
            self.index,
            request.messages,
            request.window,
            config.recall_k,
            lambda texts: self.gateway.embed(texts, purpose=purpose),
            self.slots.submit,
        )
        return self.slots.step(
            TurnState.RETRIEVING,
            "retriever",
            lambda: retrieve(
                self.repo,
                self.gateway,
                self.index,
                request.conversation_id,
                request.messages,
                window=request.window,
                recall_k=config.recall_k,
                relation_limit=self.ctx.relation_limit,
                purpose=purpose,
                query_vectors=query_vectors,
                said_now=not request.transcript,
            ),
        )

    def inject(self, retrieval: Retrieval) -> InjectionPacket:
        """INJECTING: what the front end puts into its next prompt."""
        return self.slots.step(
            TurnState.INJECTING,
            "injector",
            lambda: build_packet(retrieval, self.config.token_budget),
        )

    def act(self, packet: InjectionPacket) -> ActorOutput:
        """ACTING: the actor's reply joins the messages (generate), or they are final (recorded)."""
        return self.slots.step(
            TurnState.ACTING,
            "actor",
            lambda: act(
                self.gateway,
                self.routes["actor"],
                self.request,
                packet,
                purpose=self.trace.purpose("actor"),
            ),
        )

    def embed_for_commit(self, retrieval: Retrieval, acted: ActorOutput) -> Future[Any] | None:
        """The embedding of the turn's row text (`row_text`), started now so it overlaps the
        extractor; None when the retriever's query vector is already that (recorded mode, not
        the first turn)."""
        if retrieval.query_vector is not None and turn_text(acted.messages) == turn_text(
            self.request.messages
        ):
            return None
        return self.slots.submit(
            self.gateway.embed,
            [row_text(acted.messages, retrieval.speakers)],
            purpose=self.trace.purpose("commit"),
        )

    def extract(
        self, acted: ActorOutput, retrieval: Retrieval
    ) -> tuple[TurnExtraction, ExtractionPlan]:
        """EXTRACTING: the model's proposals and the plan grounded in the known entities."""
        return self.slots.step(
            TurnState.EXTRACTING,
            "extractor",
            lambda: extract(
                self.gateway,
                self.routes["extractor"],
                acted.messages,
                self.request.window,
                retrieval,
                purpose=self.trace.purpose("extractor"),
            ),
        )

    def judge_and_chronicle(
        self, acted: ActorOutput, retrieval: Retrieval, raw: TurnExtraction, plan: ExtractionPlan
    ) -> tuple[JudgeSummary, Chronicle]:
        """JUDGING and HISTORIANING at the same time: both depend on the extractor alone."""
        proposals = proposal_lines(raw, plan)
        started = time.monotonic()
        judging = self.slots.start(
            TurnState.JUDGING,
            "judge",
            lambda: judge(
                self.gateway,
                self.routes["judge"],
                acted.messages,
                retrieval,
                raw,
                plan,
                purpose=self.trace.purpose("judge"),
            ),
        )
        chronicling = self.slots.start(
            TurnState.HISTORIANING,
            "historian",
            lambda: historian(
                self.gateway,
                self.routes["historian"],
                acted.messages,
                retrieval,
                plan,
                proposals,
                purpose=self.trace.purpose("historian"),
            ),
        )
        try:
            return self.slots.wait("judge", judging, started), self.slots.wait(
                "historian", chronicling, started
            )
        except BaseException:
            chronicling.cancel()
            raise

    def prepare(
        self,
        packet: InjectionPacket,
        acted: ActorOutput,
        plan: ExtractionPlan,
        verdict: JudgeSummary,
        chronicle: Chronicle,
    ) -> TurnResult:
        """PREPARED: everything the turn would write, and the commit gate's decision on it."""
        self.trace.dropped([*plan.dropped, *chronicle.dropped])  # grounding refused these: counted
        self.trace.enter(TurnState.PREPARED)
        return TurnResult(
            ok=False,
            state=TurnState.PREPARED,
            **self.request.ids(),
            injection_packet=packet,
            reply=acted.reply,
            entities=[e.name for e in plan.entities],
            bio_patches=[BioPatchResult(**p.model_dump()) for p in plan.bio_patches],
            events=chronicle.events,
            milestones=[m.text for m in chronicle.milestones],
            facts=plan.facts,
            judge=verdict,
            gate=commit_gate(plan, verdict, require_actions=self.config.require_actions),
        )

    def blocked(
        self,
        base: TurnResult,
        acted: ActorOutput,
        retrieval: Retrieval,
        commit_embedding: Future[Any] | None,
    ) -> TurnResult:
        """The gate blocked the turn: its facts are dropped, its text is still remembered (the
        gate governs graph facts only). ROLLED_BACK, not retryable: the same input would be
        blocked again. If its text cannot be remembered (the graph is down, its disk full), the
        turn fails as that failure does, retryable: a front end told "blocked, not retryable"
        would never send it again, and memory would never hold its text."""
        assert base.gate is not None
        known = retrieval.query_vector if commit_embedding is None else None
        try:
            self._remember(acted.messages, known, retrieval.speakers)
        except SkaldError as exc:
            log.warning(
                "turn %s: blocked by the gate (%s) and its text could not be remembered: %s",
                self.request.key,
                "; ".join(base.gate.reasons),
                exc,
            )
            raise
        return self.ctx.outcomes.finish_rolled_back(
            base,
            self.trace,
            f"commit gate: {'; '.join(base.gate.reasons)}",
            retryable=False,
            kind="gate",
        )

    def commit(
        self,
        base: TurnResult,
        acted: ActorOutput,
        plan: ExtractionPlan,
        chronicle: Chronicle,
        retrieval: Retrieval,
        commit_embedding: Future[Any] | None,
    ) -> CommitOutcome:
        """COMMITTING: one transaction writes the turn, its memory row and its facts, and
        releases the lease (it refuses to write when the lease was taken over)."""
        request = self.request
        self.trace.enter(TurnState.COMMITTING)
        with self.trace.slot(_COMMIT_ROUTE):
            if commit_embedding is None:
                embedding = retrieval.query_vector
            else:
                embedding = self.slots.wait("commit", commit_embedding, time.monotonic())[0]
            assert embedding is not None
            write = TurnWrite(
                **request.ids(),
                payload_hash=self.payload_hash,
                speaker=", ".join(dict.fromkeys(m.speaker for m in acted.messages)),
                text=turn_text(acted.messages),
                source_refs=[m.message_id for m in acted.messages if m.message_id],
                facts=plan.facts,
                events=chronicle.events,
                committed_at=datetime.now(UTC).isoformat(),
                memory=memory_row(
                    request.conversation_id,
                    request.key,
                    request.turn,
                    acted.messages,
                    embedding=list(embedding),
                    embedded_by=self.gateway.embedding_fingerprint(),
                    facts=plan.facts,
                    committed=True,
                    said_now=not request.transcript,
                ),
                entities=plan.entities,
                actions=plan.actions,
                bio_patches=plan.bio_patches,
                milestones=chronicle.milestones,
            )

            def stored_result(seq: int, applied: list[AppliedAction]) -> tuple[str, str]:
                # The trace is kept apart from the result: timings are operational, and the
                # export leaves them out (kg.vocabulary.OPERATIONAL_PROPERTIES).
                stored = base.model_copy(
                    update={
                        "ok": True,
                        "state": TurnState.COMMITTED,
                        "committed": True,
                        "seq": seq,
                        "actions": applied,
                    }
                )
                return stored.model_dump_json(), self.ctx.outcomes.finish_trace(
                    self.trace, keep=True
                ).model_dump_json()

            with self.ctx.write_guard():
                return self.repo.commit_turn(write, self.ctx.owner, stored_result)

    def committed(self, base: TurnResult, outcome: CommitOutcome) -> TurnResult:
        """COMMITTED, or what the transaction found instead: the key committed meanwhile by
        another process (a replay, or a conflict when its payload differs)."""
        request = self.request
        if outcome.status == "conflict":
            return self.ctx.outcomes.conflict(request.ids())
        if outcome.status == "duplicate" and outcome.stored is not None:
            return self.ctx.outcomes.replay(
                request.ids(), outcome.stored, self.payload_hash, self.trace
            )
        self.trace.enter(TurnState.COMMITTED)
        # A turn remembered before this commit (blocked by the gate or rolled back, then sent
        # again) was just marked committed with its facts; a cached index still has the old
        # row: rebuild it from the graph when next asked (rare, and a rebuild is by position).
        self.ctx.vectors.forget_if_held(
            self.store.endpoint.label, request.conversation_id, request.key
        )
        trace = self.ctx.outcomes.finish_trace(self.trace)
        log.debug(
            "turn %s committed (%d actions) in %.0f ms",
            request.key,
            len(outcome.applied),
            trace.total_ms,
        )
        return base.model_copy(
            update={
                "ok": True,
                "state": TurnState.COMMITTED,
                "committed": True,
                "seq": outcome.seq,
                "actions": outcome.applied,
                "trace": trace,
            }
        )

    # ------------------------------------------------------------------ helpers
    def remember_text(self) -> None:
        """Remember the turn's text without its facts (an edit whose slots failed), its
        embedding call kept out of the gateway's records (the turn's trace is finished)."""
        # No retrieval ran to completion: the speakers are those the conversation's index holds.
        try:
            self._remember(self.request.messages, None, sorted(self.index.pinned().speakers))
        except SkaldError as exc:
            # The turn failed already, retryable: its retry remembers the text with its facts.
            log.warning("turn %s: its new text could not be remembered: %s", self.request.key, exc)
        self.ctx.outcomes.drop_records(self.trace)

    def _remember(
        self, messages: list[Any], vector: list[float] | None, speakers: list[str]
    ) -> None:
        """Remember a turn's text without its facts (its own small transaction, idempotent by
        key). `speakers`: those of the rows before it (`row_text`)."""
        request = self.request
        if vector is None:  # the retriever's query vector is this row's when it had one
            vector = list(
                self.gateway.embed(
                    [row_text(messages, speakers)], purpose=self.trace.purpose("remember")
                )[0]
            )
        row = memory_row(
            request.conversation_id,
            request.key,
            request.turn,
            messages,
            embedding=list(vector),
            embedded_by=self.gateway.embedding_fingerprint(),
            said_now=not request.transcript,
        )
        with self.ctx.write_guard():
            self.repo.remember(request.conversation_id, [row])
