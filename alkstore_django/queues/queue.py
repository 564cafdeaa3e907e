"""A named queue: enqueue and claim; a claim hands out ``handles.JobHandle``s."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import tracing
from ..asyncs import async_twin
from ..conf import QueueOptions, app_settings
from ..errors import InvalidArgument
from ..records import UNKEYED, EnqueueStamps, QueueStats, SweepResult
from ..signals import job_enqueued
from ..validation import (
    OnDuplicate,
    encode_payload,
    validate_duration,
    validate_int,
    validate_max_attempts,
    validate_priority,
    validate_queue_limits,
    validate_run_at,
    validate_worker_id,
)
from .enqueues import MAX_BATCH, enqueue_marks, enqueue_unique, mark, unique_keys_of, write_marked
from .handles import JobHandle

if TYPE_CHECKING:
    from ..store import Store

CHANNEL_PREFIX = "alkstore_"


def channel_for(name: str) -> str:
    """Return the NOTIFY channel of a queue or user channel name.

    A digest keeps every name, however long or odd (quotes, spaces, unicode),
    inside PostgreSQL's 63-byte identifier limit and out of reach of SQL.
    """
    return CHANNEL_PREFIX + hashlib.sha256(name.encode("utf-8")).hexdigest()[:40]


class Queue:
    """A named queue; its stamps are resolved once, here, over the derived defaults."""

    def __init__(self, store: Store, name: str, options: QueueOptions) -> None:
        self.store = store
        self.name = name
        self.options = options
        self.channel = channel_for(name)
        # max_running and rate come from settings only: every worker must agree on them.
        self.limits = validate_queue_limits(app_settings.queues.get(name) or {})
        # Under max_running_per_key every job gets a key, UNKEYED for one without.
        self.keyed = self.limits is not None and self.limits.max_running_per_key is not None
        self._plain = EnqueueStamps(
            queue=name,
            channel=self.channel,
            priority=options.priority,
            max_attempts=options.max_attempts,
            visibility_timeout_s=options.visibility_timeout_s,
            retry_base_s=options.retry_base_s,
            expires_s=options.expires_s,
            timeout_s=options.timeout_s,
            max_snoozes=options.max_snoozes,
        )

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} using={self.store.using!r}>"

    # --- enqueue -----------------------------------------------------------

    def enqueue(
        self,
        payload: Any,
        *,
        delay_s: float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        expires_s: float | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        unique_key: str | None = None,
        unique_for_s: float | None = None,
        on_duplicate: OnDuplicate = "return",
        keep_result_s: float | None = None,
        concurrency_key: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> int:
        """Write one pending job and return its id.

        Inside ``transaction.atomic()`` the job joins the caller's transaction;
        workers are woken when it commits. ``delay_s`` wins over ``run_at``.
        Raises ``PayloadError`` or ``InvalidArgument`` before writing anything.

        With ``unique_key`` nothing is written while another live job of the
        queue has that key (or holds it within its ``unique_for_s`` window
        after success): the holder's id is returned, or ``DuplicateJob`` raised
        when ``on_duplicate="raise"``.

        With ``keep_result_s`` (or the queue option) what became of the job
        is kept that long after it finished: ``Store.get_result(id)``.
        ``concurrency_key`` is what the queue's ``max_running_per_key`` limits;
        ``tags`` are kept on the job, its dead letter and its result.
        """
        self.store.check_open()
        encoded = encode_payload(
            payload, app_settings.max_payload_bytes, app_settings.payload_codec.encode
        )
        stamps = self._stamps(delay_s, run_at, priority, expires_s, max_attempts, timeout_s)
        marks = enqueue_marks(self, keep_result_s, concurrency_key, tags)
        keys = None
        if unique_key is not None or unique_for_s is not None or on_duplicate != "return":
            single = None if unique_key is None else [unique_key]
            keys = unique_keys_of(single, 1, unique_for_s, on_duplicate)
        span = tracing.start_enqueue(self.name, 1)
        if span is not None:
            return self._traced(span, stamps, [encoded], keys, unique_for_s, on_duplicate, marks)[0]
        if keys is not None or marks:
            return self._write(stamps, [encoded], keys, unique_for_s, on_duplicate, marks)[0]
        ids = self.store.dialect.enqueue(stamps, (encoded,))
        if job_enqueued.receivers:
            job_enqueued.send(self.name, job_ids=ids)
        return ids[0]

    def enqueue_many(
        self,
        payloads: Iterable[Any],
        *,
        delay_s: float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        expires_s: float | None = None,
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        unique_keys: Iterable[str] | None = None,
        unique_for_s: float | None = None,
        on_duplicate: OnDuplicate = "return",
        keep_result_s: float | None = None,
        concurrency_key: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> list[int]:
        """Write many pending jobs in one statement and return their ids in order.

        Every payload is encoded first: one bad payload refuses the whole batch.
        ``unique_keys`` gives each payload its key, as ``enqueue``'s
        ``unique_key``: a payload whose key is taken (by a live job, a window,
        or an earlier payload of the batch) is not written and its place in
        the result holds the holder's id. With ``on_duplicate="raise"`` one
        taken key writes nothing at all. ``concurrency_key`` and ``tags`` apply
        to every job of the batch.
        """
        self.store.check_open()
        if isinstance(payloads, (str, bytes, dict)) or not isinstance(payloads, Iterable):
            raise InvalidArgument(
                f"Invalid payloads of type {type(payloads).__name__}: expected a list of payloads."
            )
        limit, to_json = app_settings.max_payload_bytes, app_settings.payload_codec.encode
        encoded = [encode_payload(payload, limit, to_json) for payload in payloads]
        stamps = self._stamps(delay_s, run_at, priority, expires_s, max_attempts, timeout_s)
        marks = enqueue_marks(self, keep_result_s, concurrency_key, tags)
        keys = None
        if unique_keys is not None or unique_for_s is not None or on_duplicate != "return":
            keys = unique_keys_of(unique_keys, len(encoded), unique_for_s, on_duplicate)
        if not encoded:
            return []
        span = tracing.start_enqueue(self.name, len(encoded))
        if span is not None:
            return self._traced(span, stamps, encoded, keys, unique_for_s, on_duplicate, marks)
        return self._write(stamps, encoded, keys, unique_for_s, on_duplicate, marks)

    def _write(
        self,
        stamps: EnqueueStamps,
        encoded: list[str],
        keys: list[str] | None,
        unique_for_s: float | None,
        on_duplicate: OnDuplicate,
        marks: dict[str, Any],
    ) -> list[int]:
        """Write checked, encoded jobs (unique, marked or plain); return their ids in order."""
        if keys is not None:
            return enqueue_unique(self, stamps, encoded, keys, unique_for_s, on_duplicate, marks)
        if marks:
            return write_marked(self, stamps, encoded, marks)
        ids = self.write_encoded(encoded, stamps=stamps)
        if job_enqueued.receivers:
            job_enqueued.send(self.name, job_ids=ids)
        return ids

    def _traced(
        self,
        span: tracing.EnqueueSpan,
        stamps: EnqueueStamps,
        encoded: list[str],
        keys: list[str] | None,
        unique_for_s: float | None,
        on_duplicate: OnDuplicate,
        marks: dict[str, Any],
    ) -> list[int]:
        """``_write`` inside the enqueue's span, whose context every job written stores."""
        with span:
            stamps = replace(stamps, trace_context=span.carrier)
            ids = self._write(stamps, encoded, keys, unique_for_s, on_duplicate, marks)
            span.sent(ids)
        return ids

    def write_encoded(
        self,
        encoded: Sequence[str],
        options: dict[str, Any] | None = None,
        *,
        stamps: EnqueueStamps | None = None,
    ) -> list[int]:
        """Insert jobs whose payloads are encoded already, with enqueue ``options``; return ids.

        ``options`` are ``check_options``' (a workflow step's); past
        ``MAX_BATCH`` payloads it takes several statements, all or none. Sends
        no ``job_enqueued``: the caller does, once its transaction holds them.
        """
        if stamps is None:
            stamps = self.check_options(options or {})
        dialect = self.store.dialect
        step = options is not None and self.keyed
        if len(encoded) <= MAX_BATCH and not step:
            return dialect.enqueue(stamps, encoded)
        # Past MAX_BATCH it takes several statements: all of them or none.
        ids: list[int] = []
        with transaction.atomic(using=self.store.using):
            for start in range(0, len(encoded), MAX_BATCH):
                ids += dialect.enqueue(stamps, encoded[start : start + MAX_BATCH])
            if step:
                # A workflow's step: no key of its own, so the queue's unlimited one.
                mark(self, ids, {"concurrency_key": UNKEYED})
        return ids

    def check_options(self, options: dict[str, Any]) -> EnqueueStamps:
        """Return the stamps of an enqueue with ``options`` (by name), validated as enqueue's."""
        return self._stamps(
            options.get("delay_s"),
            None,
            options.get("priority"),
            options.get("expires_s"),
            options.get("max_attempts"),
            options.get("timeout_s"),
        )

    def _stamps(
        self,
        delay_s: float | None,
        run_at: datetime | None,
        priority: int | None,
        expires_s: float | None,
        max_attempts: int | None,
        timeout_s: float | None,
    ) -> EnqueueStamps:
        """Validate the per-call options over this queue's defaults."""
        plain = delay_s is None and run_at is None and priority is None
        if plain and expires_s is None and max_attempts is None and timeout_s is None:
            return self._plain
        # run_at is checked even when delay_s wins, so a bad value never passes silently.
        if run_at is not None:
            run_at = validate_run_at(run_at)
        if delay_s is not None:
            delay_s = validate_duration("delay_s", delay_s)
        changes: dict[str, Any] = {
            "run_at": None if delay_s is not None else run_at,
            "delay_s": delay_s,
        }
        if expires_s is not None:
            changes["expires_s"] = validate_duration("expires_s", expires_s, allow_zero=False)
        if priority is not None:
            changes["priority"] = validate_priority(priority)
        if max_attempts is not None:
            changes["max_attempts"] = validate_max_attempts(max_attempts)
        if timeout_s is not None:
            changes["timeout_s"] = validate_duration("timeout_s", timeout_s, allow_zero=False)
        return replace(self._plain, **changes)

    # --- claims --------------------------------------------------------------

    def claim_one(self, worker_id: str) -> JobHandle | None:
        """Claim the next eligible job for ``worker_id``, or return None."""
        handles = self.claim_batch(worker_id, 1)
        return handles[0] if handles else None

    def claim_batch(self, worker_id: str, n: int) -> list[JobHandle]:
        """Claim up to ``n`` eligible jobs, each handed to exactly one claimant.

        Order: priority descending, then run_at, then enqueue order. Exhausted
        lapsed claims of this queue are dead-lettered first.
        """
        self.store.check_open()
        validate_worker_id(worker_id)
        n = validate_int("n", n, minimum=-(2**31), maximum=MAX_BATCH)
        if n <= 0:
            return []
        return self.ack_and_claim(worker_id, n)[1]

    def ack_and_claim(
        self, worker_id: str, n: int, fences: Sequence[tuple[int, int]] = ()
    ) -> tuple[set[int], list[JobHandle], float | None]:
        """Ack ``fences`` (job id, generation) held by ``worker_id``, then claim up to ``n``.

        The one claim path: ``claim_batch`` and the worker both come here. One
        transaction (one statement on PostgreSQL for a queue without limits),
        so the acks are durable when it returns and the worker pays one commit
        per cycle. A paused queue claims nothing. Returns the ids acked, the
        handles claimed in claim order, and ``hold_s``: None, or how long a
        ``max_running`` or ``rate`` limit holds the queue's next claim back
        (0.0: until a running job finishes). The arguments are trusted:
        ``claim_batch`` validates them, the worker checks its id once.
        """
        dialect = self.store.dialect
        if self.limits is None:
            acked, jobs = dialect.claim_and_ack(self.name, worker_id, n, worker_id, fences)
            hold_s = None
        else:
            acked, jobs, hold_s = dialect.claim_limited(
                self.name, worker_id, n, worker_id, fences, self.limits
            )
        return set(acked), [JobHandle(self, job) for job in jobs], hold_s

    # --- controls ------------------------------------------------------------

    def pause(self) -> bool:
        """Stop every worker claiming from this queue; False when it was already paused.

        Durable (a row) and enforced inside every claim: once this commits no
        claim hands out a job of the queue. Running jobs finish; enqueue still
        works. Workers hear of it at once on PostgreSQL, within their poll
        elsewhere, and give back the jobs they hold but have not started.
        """
        self.store.check_open()
        return self.store.dialect.set_paused(self.name, True, self.channel)

    def resume(self) -> bool:
        """Let workers claim from this queue again; False when it was not paused."""
        self.store.check_open()
        return self.store.dialect.set_paused(self.name, False, self.channel)

    def is_paused(self) -> bool:
        """Return whether the queue is paused (a read of its control row)."""
        self.store.check_open()
        return self.name in self.store.dialect.paused_queues()

    def ack_batch(self, ids: Sequence[int]) -> int:
        """Ack each id that is processing under an unexpired claim; return how many."""
        self.store.check_open()
        ids = [validate_int("job id", i, minimum=1, maximum=2**63 - 1) for i in ids]
        if not ids:
            return 0
        return self.store.dialect.ack_many(self.name, ids)

    def cancel(self, job_id: int) -> bool:
        """Delete a live job whatever its state; False when there is none.

        A running handler is not interrupted: its later ack simply finds nothing.
        A workflow step's job cancels its step (and what depends on it); a
        job keeping its result keeps ``cancelled``.
        """
        self.store.check_open()
        validate_int("job id", job_id, minimum=-(2**63), maximum=2**63 - 1)
        from ..workflows.progress import cancelling

        with cancelling(self.store, [job_id]):
            return self.store.dialect.cancel(self.name, job_id)

    # --- upkeep --------------------------------------------------------------

    def sweep_expired(self) -> SweepResult:
        """Dead-letter this queue's expired live rows and purge dead letters past retention.

        Ended ``unique_for_s`` windows are deleted too (they hold nothing any more).
        """
        self.store.check_open()
        dialect = self.store.dialect
        expired = dialect.expire(self.name)
        dialect.purge_windows(self.name)
        retention = self.options.dead_letter_retention_s
        purged = 0 if retention is None else dialect.purge_dead(self.name, retention)
        return SweepResult(expired=expired, purged=purged)

    def stats(self) -> QueueStats:
        """Return the queue's counts against the database clock."""
        self.store.check_open()
        pending, scheduled, processing, overdue, dead, age = self.store.dialect.stats(self.name)
        return QueueStats(
            queue=self.name,
            pending=pending,
            scheduled=scheduled,
            processing=processing,
            dead=dead,
            oldest_pending_age_s=age,
            overdue=overdue,
        )

    # --- async twins: the sync call on Django's thread-sensitive thread (asyncs) -----------

    aenqueue = async_twin(enqueue)
    aenqueue_many = async_twin(enqueue_many)
