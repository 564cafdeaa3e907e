"""The transactional outbox: messages that publish exactly when the caller's transaction commits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .conf import ENGINE_DEFAULTS, QueueOptions
from .errors import Fail
from .handlers import outbox_queue_name, validate_outbox_name
from .queues import JobHandle, Queue
from .validation import validate_worker_id

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
    ) -> int:
        """Write one message and return its id; resolution as ``Queue.enqueue``.

        Inside ``transaction.atomic()`` the message commits or rolls back with
        the caller's business writes; the worker is woken on commit.
        ``max_attempts`` is the one per-message override of the fixed stamps.
        """
        return self.queue.enqueue(
            payload,
            delay_s=delay_s,
            run_at=run_at,
            priority=priority,
            expires_s=expires_s,
            max_attempts=max_attempts,
        )

    def run_once(self, worker_id: str, delivery: Delivery) -> bool:
        """Claim one message and deliver it; False when nothing was claimable.

        ``delivery(handle)`` returning acks the message. Raising retries it
        with the backoff curve, ``str(exception)`` kept as its error, so the
        last attempt dead-letters with that text. Raising ``Fail``
        dead-letters it at once. No heartbeat is issued for you: a slow
        delivery calls ``handle.heartbeat(extend_s)``. A delivery that settles
        the handle itself (ack, retry, fail, release) is left as it settled it.
        """
        validate_worker_id(worker_id)
        handle = self.queue.claim_one(worker_id)
        if handle is None:
            return False
        job = handle.job
        try:
            delivery(handle)
        except Fail as exc:
            if not handle.spent:
                handle.fail(str(exc) or None)
            logger.warning(
                "outbox message failed outbox=%s job=%s attempt=%d error=%s",
                self.name,
                job.id,
                job.attempts,
                exc,
            )
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            if not handle.spent:
                handle.retry(error=error)
            logger.error(
                "outbox delivery raised outbox=%s job=%s attempt=%d max_attempts=%d error=%s",
                self.name,
                job.id,
                job.attempts,
                job.max_attempts,
                error,
                exc_info=True,
            )
        else:
            if not handle.spent:
                handle.ack()
            logger.info("outbox message delivered outbox=%s job=%s", self.name, job.id)
        return True
