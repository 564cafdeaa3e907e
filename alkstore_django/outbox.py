"""The transactional outbox: messages that publish exactly when the caller's transaction commits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .conf import ENGINE_DEFAULTS, QueueOptions
from .error_text import loggable
from .executor import OutcomeKind, run_handler, settle
from .handlers import outbox_queue_name, validate_outbox_name
from .queues import Queue
from .queues.handles import JobHandle
from .validation import OnDuplicate, validate_worker_id

if TYPE_CHECKING:
    from .store import Store

logger = logging.getLogger(__name__)

# Fixed stamps: an outbox is not configured through ALKSTORE["QUEUES"].
OUTBOX_OPTIONS = QueueOptions(
    visibility_timeout_s=60,
    max_attempts=5,
    retry_base_s=5,
    priority=0,
    expires_s=None,
    dead_letter_retention_s=ENGINE_DEFAULTS.dead_letter_retention_s,
)

Delivery = Callable[[JobHandle], Any]


class Outbox:
    """A named outbox over its reserved backing queue ``__alkstore_outbox:{name}``.

    ``queue`` is that backing queue (stamps fixed: visibility 60 s, 5 attempts,
    retry base 5 s); the worker runs ``@handler.outbox(name)`` handlers on it.
    """

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = validate_outbox_name(name)
        self.queue = Queue(store, outbox_queue_name(name), OUTBOX_OPTIONS)

    def __repr__(self) -> str:
        return f"<Outbox {self.name!r} using={self.store.using!r}>"

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
    ) -> int:
        """Write one message and return its id; resolution as ``Queue.enqueue``.

        Inside ``transaction.atomic()`` the message commits or rolls back with
        the caller's business writes; the worker is woken on commit.
        ``max_attempts`` and ``timeout_s`` are the per-message overrides of the
        fixed stamps. ``unique_key`` (with ``unique_for_s`` and
        ``on_duplicate``) keeps one undelivered message per key, as for a queue.
        """
        return self.queue.enqueue(
            payload,
            delay_s=delay_s,
            run_at=run_at,
            priority=priority,
            expires_s=expires_s,
            max_attempts=max_attempts,
            timeout_s=timeout_s,
            unique_key=unique_key,
            unique_for_s=unique_for_s,
            on_duplicate=on_duplicate,
        )

    def run_once(self, worker_id: str, delivery: Delivery) -> bool:
        """Claim one message and deliver it; False when nothing was claimable.

        ``delivery(handle)`` returning acks the message. Raising retries it
        with the backoff curve, its error kept as ``ExceptionType: message``
        (the worker's text), so the last attempt dead-letters with that text.
        Raising ``Fail`` dead-letters it at once with its message. No
        heartbeat is issued for you: a slow delivery calls
        ``handle.heartbeat(extend_s)``. A delivery that settles the handle
        itself (ack, retry, fail, release) is left as it settled it.
        """
        validate_worker_id(worker_id)
        handle = self.queue.claim_one(worker_id)
        if handle is None:
            return False
        outcome = run_handler(delivery, handle, handle.job)
        result = "settled by the delivery"
        if not handle.spent:
            result = settle(handle, outcome, None, self.store.using)
        logger.log(
            logging.INFO if outcome.kind == OutcomeKind.ACK else logging.WARNING,
            "outbox message outbox=%s job=%s attempt=%d outcome=%s%s",
            self.name,
            handle.job.id,
            handle.job.attempts,
            result,
            f" error={loggable(outcome.error)!r}" if outcome.error else "",
        )
        return True
