"""The per-conversation lock: a lease node claimed with a compare-and-set, stealable once
expired, deleted on release (see kg/dialogue/__init__.py); waiting for it polls with capped
backoff through tenacity.

The lease is short (seconds) and its holder renews it from a heartbeat thread while its turn
runs (`Heartbeat`): a live holder, however slow its turn, keeps the conversation; a dead one
(SIGKILL, power loss, a host gone) stops renewing, and the conversation is free again one
lease later, not after the longest a turn may take. Expiry is on the graph's clock, so
sidecars on several hosts sharing one graph agree on it. The owner is the fencing token: the
commit transaction deletes the lease by owner as its first statement and aborts when it is
gone, so a holder that lost its lease (a stalled heartbeat) can never commit."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import tenacity
from neo4j import ManagedTransaction

from core.errors import GraphWriteError
from kg.dialogue import cypher as dq
from kg.dialogue.keys import lock_key
from kg.dialogue.models import LOCK_STATUS, TURN_COMMITTED, LockClaim, LostLockError, StoredTurn
from kg.dialogue.records import stored_turn
from kg.store import GraphStore

log = logging.getLogger("skald.dialogue")

# Errors that mean "someone else got there first" while claiming a lease: retry the claim.
CLAIM_RACE_CODES = (
    "Neo.ClientError.Schema.ConstraintValidationFailed",
    "Neo.ClientError.Statement.EntityNotFound",
)


def _read_stored(tx: ManagedTransaction, key: str | None) -> StoredTurn | None:
    if key is None:
        return None
    row = tx.run(dq.READ_TURN, key=key).single()
    return _committed(row["props"] if row else None)


def _committed(props: dict[str, Any] | None) -> StoredTurn | None:
    if props is None or props.get("status") != TURN_COMMITTED:
        return None
    return stored_turn(props)


def create_lock_tx(
    tx: ManagedTransaction,
    key: str,
    conversation_id: str,
    owner: str,
    lease_ms: int,
    turn: str | None,
) -> LockClaim:
    props = {"key": key, "status": LOCK_STATUS, "lock_of": conversation_id, "owner": owner}
    if turn is None:
        tx.run(dq.LOCK_CREATE, props=props, lease_ms=lease_ms).consume()
        return LockClaim(acquired=True, owner=owner)
    row = tx.run(dq.LOCK_CREATE_READ_TURN, props=props, lease_ms=lease_ms, turn=turn).single()
    return LockClaim(acquired=True, owner=owner, stored=_committed(row["props"] if row else None))


def take_lock_tx(
    tx: ManagedTransaction, key: str, owner: str, lease_ms: int, turn: str | None
) -> LockClaim:
    row = tx.run(dq.LOCK_PROBE, key=key).single()
    if row is None:
        # Released between our failed CREATE and this probe: the caller simply tries again.
        return LockClaim(acquired=False, owner=owner, holder="(just released)")
    holder, expires_at, now = row["owner"], row["expires_at"], int(row["now"])
    if holder == owner or expires_at is None or int(expires_at) <= now:
        tx.run(dq.LOCK_TAKE, key=key, owner=owner, now=now, expires_at=now + lease_ms).consume()
        stolen = holder if holder not in (None, owner) else None
        return LockClaim(
            acquired=True, owner=owner, stolen_from=stolen, stored=_read_stored(tx, turn)
        )
    return LockClaim(
        acquired=False, owner=owner, holder=holder, expires_in_ms=int(expires_at) - now
    )


#: A heartbeat renews the lease this many times per lease period: two renewals can be lost
#: or late before the lease runs out under a live holder.
RENEWALS_PER_LEASE = 3
#: Pause before a failed renewal is sent again (the driver's own retry waits ~1 s).
RENEW_RETRY_S = 0.05


class Heartbeat:
    """Renews a held lease every `lease_s / RENEWALS_PER_LEASE` seconds on a daemon thread
    until stopped (a context manager). `lost` is set once a renewal finds the lease no longer
    ours (taken over after a stall): the turn may go on, its commit is refused by the fence."""

    def __init__(
        self,
        lease: ConversationLease,
        conversation_id: str,
        owner: str,
        lease_s: float,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self._lease, self._conversation_id, self._owner = lease, conversation_id, owner
        self._lease_s, self._guard = lease_s, guard
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.renewals = 0
        self._thread = threading.Thread(
            target=self._run, name=f"lease-heartbeat:{conversation_id}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # A renewal stuck on an unreachable graph must not hold the turn's answer back long.
        self._thread.join(timeout=max(1.0, self._lease_s))

    def _run(self) -> None:
        interval = self._lease_s / RENEWALS_PER_LEASE
        while not self._stop.wait(interval):
            held = self._renew(time.monotonic() + interval)
            if held is None:
                continue  # the graph did not answer before the next beat: that beat tries again
            if not held:
                # Released by the commit transaction a moment ago, or taken over after a stall
                # (then the commit's fence refuses the turn): nothing more to renew either way.
                log.info(
                    "conversation %s: lease no longer held by %s",
                    self._conversation_id,
                    self._owner,
                )
                self.lost.set()
                return
            self.renewals += 1

    def _renew(self, until: float) -> bool | None:
        """One renewal, sent again at once while it fails (a conflict with a concurrent change to
        the lease node on ArcadeDB, a dropped connection) until `until`; None if it never went through."""
        while not self._stop.is_set():
            try:
                with self._guard():
                    if self._stop.is_set():  # released meanwhile: nothing to renew
                        return True
                    return self._lease.renew_lock(self._conversation_id, self._owner, self._lease_s)
            except Exception as exc:  # noqa: BLE001 - any failure: try again until the next beat
                if time.monotonic() + RENEW_RETRY_S >= until:
                    log.warning(
                        "conversation %s: lease renewal failed: %s", self._conversation_id, exc
                    )
                    return None
                time.sleep(RENEW_RETRY_S)
        return True


class ConversationLease:
    """The lease operations of DialogueRepository (its base): claim once, wait, release."""

    store: GraphStore

    def claim_lock(
        self,
        conversation_id: str,
        owner: str,
        lease_s: float,
        *,
        turn_key: str | None = None,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> LockClaim:
        """One attempt to take the lease; `acquired=False` names the current holder.

        With `turn_key`, the turn's committed record is read in the same transaction, under
        the lock (`LockClaim.stored`), so a turn committed while we waited is not redone.
        `guard` wraps the write transactions only (the peek before them is a read)."""
        key, lease_ms = lock_key(conversation_id), int(lease_s * 1000)
        # Test before test-and-set: a live lease of another owner is refused without a write.
        peeked = self.store.read(dq.LOCK_PEEK, key=key)
        if (
            peeked
            and peeked[0]["owner"] not in (None, owner)
            and peeked[0]["expires_at"] is not None
        ):
            expires_in = int(peeked[0]["expires_at"]) - int(peeked[0]["now"])
            if expires_in > 0:
                return LockClaim(
                    acquired=False, owner=owner, holder=peeked[0]["owner"], expires_in_ms=expires_in
                )
        try:
            with guard():
                return self.store.execute_write(
                    create_lock_tx, key, conversation_id, owner, lease_ms, turn_key
                )
        except GraphWriteError as exc:
            if getattr(exc.__cause__, "code", None) not in CLAIM_RACE_CODES:
                raise
        try:
            with guard():
                return self.store.execute_write(take_lock_tx, key, owner, lease_ms, turn_key)
        except GraphWriteError as exc:
            if getattr(exc.__cause__, "code", None) in CLAIM_RACE_CODES:
                return LockClaim(acquired=False, owner=owner, holder="(racing claimant)")
            raise

    def acquire_lock(
        self,
        conversation_id: str,
        owner: str,
        *,
        lease_s: float,
        wait_s: float,
        turn_key: str | None = None,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> LockClaim:
        """Claim the lease, polling with capped backoff (20 ms growing 1.6x to 250 ms) for up
        to `wait_s` seconds; the last attempt falls on the deadline. `guard` wraps each claim's
        write transactions (e.g. the caller's write serialisation). Returns the last claim."""
        deadline = time.monotonic() + max(0.0, wait_s)

        def claim() -> LockClaim:
            return self.claim_lock(conversation_id, owner, lease_s, turn_key=turn_key, guard=guard)

        def pause(state: tenacity.RetryCallState) -> float:
            backoff = min(0.02 * 1.6 ** (state.attempt_number - 1), 0.25)
            return max(0.0, min(backoff, deadline - time.monotonic()))

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda c: not c.acquired),
            stop=lambda state: time.monotonic() >= deadline,
            wait=pause,
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
        )
        return retrying(claim)

    def renew_lock(self, conversation_id: str, owner: str, lease_s: float) -> bool:
        """Move the lease's expiry to `lease_s` from now if `owner` still holds it."""
        rows = self.store.write_once(
            dq.LOCK_RENEW, key=lock_key(conversation_id), owner=owner, lease_ms=int(lease_s * 1000)
        )
        return bool(rows and int(rows[0]["renewed"]))

    def heartbeat(
        self,
        conversation_id: str,
        owner: str,
        lease_s: float,
        *,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> Heartbeat:
        """A context manager that keeps `owner`'s lease alive while it is open."""
        return Heartbeat(self, conversation_id, owner, lease_s, guard)

    def release_lock(self, conversation_id: str, owner: str) -> bool:
        rows = self.store.write(dq.LOCK_RELEASE, key=lock_key(conversation_id), owner=owner)
        return bool(rows and int(rows[0]["released"]))


def require_lease(
    tx: ManagedTransaction, conversation_id: str, owner: str, *, doing: str, hint: str
) -> None:
    """Inside a write transaction that needs the conversation's lease: LostLockError unless
    `owner` still holds it (`doing`: what was about to happen, for the one-line error)."""
    held = tx.run(dq.LOCK_HELD, key=lock_key(conversation_id), owner=owner).single()
    if not held or not int(held["held"]):
        raise LostLockError(
            f"conversation {conversation_id!r}: the lock lease expired and was taken over "
            f"before {doing}",
            hint=hint,
        )
