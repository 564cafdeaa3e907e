"""Cancel a job wherever it stands: deleted while it waits, stopped while it runs.

``Queue.cancel`` deletes a live row and leaves a running handler to find its
ack refused. ``cancel_job`` reaches the handler: a job under a live claim
gets a durable request (``cancel_requested_at``) and a notification on its
queue's channel, committed together. The worker holding it hears of it (the
notification, or its poll of the claims it holds), tells the handler's run
(``current_run().cancel_requested``), and stops a run that ignores it once
the queue's ``cancel_grace_s`` has passed. However the run then ends, the
job ends ``cancelled``: no retry, no dead letter (``executor.settle``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..dialects.cancels import CANCEL_PAYLOAD_PREFIX, CancelResult
from ..validation import validate_int
from ..workflows.progress import cancelling
from .queue import channel_for

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["CANCEL_PAYLOAD_PREFIX", "CancelResult", "cancel_job", "cancel_jobs"]


def cancel_job(store: Store, job_id: int) -> CancelResult | None:
    """Cancel live job ``job_id``; return what was done, or None when it is not live.

    ``cancelled``: it was pending (or its claim had lapsed) and is deleted
    at once, with the effects of ``Queue.cancel`` (its unique key freed, its
    kept result ``cancelled``, its workflow step cancelled with what depends
    on it). ``requested``: a worker runs it and is asked to stop it. None:
    finished, dead-lettered or unknown; nothing changes. One transaction
    (joining the caller's; the notification is delivered on commit).
    Raises ``InvalidArgument`` for an id that is not a 64-bit integer.
    """
    store.check_open()
    job_id = validate_int("job id", job_id, minimum=-(2**63), maximum=2**63 - 1)
    with cancelling(store, [job_id]):
        found = store.dialect.cancel_live(job_id)
        if found is None:
            return None
        queue, result = found
        if result == CancelResult.REQUESTED:
            store.dialect.notify(channel_for(queue), f"{CANCEL_PAYLOAD_PREFIX}{job_id}")
        return result


def cancel_jobs(store: Store, ids: Iterable[int]) -> dict[int, CancelResult | None]:
    """Cancel each of ``ids`` as ``cancel_job`` does; return what was done to each, by id.

    One transaction per job: a request for one is not held back by another's
    row lock. Every id is checked before anything is written.
    """
    checked = [validate_int("job id", i, minimum=-(2**63), maximum=2**63 - 1) for i in ids]
    return {job_id: cancel_job(store, job_id) for job_id in dict.fromkeys(checked)}
