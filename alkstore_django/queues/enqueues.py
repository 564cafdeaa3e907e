"""The enqueue paths past the plain insert: unique keys, and the columns it leaves null.

A plain enqueue is one ``INSERT`` (``Queue.enqueue``); these are the
others, kept apart so that the common path reads in one place: a unique
key's insert-or-holder (``enqueue_unique``, over ``dialects/unique.py``), and
the marks (kept results, concurrency keys, tags) written on the new rows in
the insert's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ..errors import DuplicateJob, InvalidArgument
from ..records import UNKEYED, EnqueueStamps, join_tags
from ..signals import job_enqueued
from ..validation import (
    OnDuplicate,
    validate_concurrency_key,
    validate_duration,
    validate_on_duplicate,
    validate_tags,
    validate_unique_key,
)

if TYPE_CHECKING:
    from .queue import Queue

# The most rows one insert statement writes; past it, several in one transaction.
MAX_BATCH = 10_000


def unique_keys_of(
    keys: Iterable[str | None] | None,
    count: int,
    unique_for_s: float | None,
    on_duplicate: OnDuplicate,
) -> list[str]:
    """Validate the unique options of an enqueue of ``count`` payloads; return the keys."""
    validate_on_duplicate(on_duplicate)
    if keys is None:
        raise InvalidArgument(
            "unique_for_s and on_duplicate apply to jobs with a unique key: give unique_key "
            "(unique_keys for enqueue_many)."
        )
    if isinstance(keys, (str, bytes, dict)) or not isinstance(keys, Iterable):
        raise InvalidArgument(
            f"Invalid unique_keys of type {type(keys).__name__}: expected a list of keys, "
            "one per payload."
        )
    checked = [validate_unique_key(key) for key in keys]
    if len(checked) != count:
        raise InvalidArgument(
            f"Invalid unique_keys: {len(checked)} keys for {count} payloads; expected one per "
            "payload."
        )
    if unique_for_s is not None:
        validate_duration("unique_for_s", unique_for_s, allow_zero=False)
    return checked


def enqueue_marks(
    queue: Queue,
    keep_result_s: float | None,
    concurrency_key: str | None,
    tags: Sequence[str] | None,
) -> dict[str, Any]:
    """Validate the columns a plain insert leaves null; return those this enqueue sets.

    ``keep_result_s`` is the call's, or the queue's.
    """
    marks: dict[str, Any] = {}
    if keep_result_s is not None:
        marks["keep_result_s"] = validate_duration("keep_result_s", keep_result_s, allow_zero=False)
    elif queue.options.keep_result_s is not None:
        marks["keep_result_s"] = queue.options.keep_result_s
    if concurrency_key is not None:
        marks["concurrency_key"] = validate_concurrency_key(concurrency_key)
    elif queue.keyed:
        marks["concurrency_key"] = UNKEYED
    if tags is not None:
        stored = join_tags(validate_tags(tags))
        if stored is not None:
            marks["tags"] = stored
    return marks


def write_marked(
    queue: Queue, stamps: EnqueueStamps, encoded: list[str], marks: dict[str, Any]
) -> list[int]:
    """Write jobs with ``marks``: the insert, then their marks, in one transaction."""
    with queue.store.dialect.atomic_write():
        ids = queue.write_encoded(encoded, stamps=stamps)
        mark(queue, ids, marks)
    if job_enqueued.receivers:
        job_enqueued.send(queue.name, job_ids=ids)
    return ids


def mark(queue: Queue, ids: list[int], marks: dict[str, Any]) -> None:
    # Columns the plain insert leaves null, so the common enqueue's statement is unchanged.
    from ..models import Job

    Job.objects.using(queue.store.using).filter(id__in=ids).update(**marks)


def enqueue_unique(
    queue: Queue,
    stamps: EnqueueStamps,
    encoded: list[str],
    keys: list[str],
    unique_for_s: float | None,
    on_duplicate: OnDuplicate,
    marks: dict[str, Any],
) -> list[int]:
    """Write the payloads whose key is free; return each payload's job id or its key's holder's.

    Keys already validated. With ``on_duplicate="raise"`` it is all or
    nothing: the batch runs in its own atomic block (a savepoint inside
    the caller's) that ``DuplicateJob`` rolls back.
    """
    keyed: dict[str, str] = {}
    for key, payload in zip(keys, encoded, strict=True):
        if on_duplicate == "raise" and key in keyed:
            raise DuplicateJob(
                f"Unique key {key!r} appears twice in the batch for queue {queue.name!r}: "
                "nothing enqueued."
            )
        keyed.setdefault(key, payload)
    if not keyed:
        return []
    dialect = queue.store.dialect
    items = list(keyed.items())
    result: dict[str, tuple[int, bool]] = {}

    def write() -> list[int]:
        result.clear()
        with transaction.atomic(using=queue.store.using):
            for start in range(0, len(items), MAX_BATCH):
                chunk = dict(items[start : start + MAX_BATCH])
                result.update(dialect.enqueue_unique(stamps, chunk, unique_for_s))
            if on_duplicate == "raise":
                for key, (job_id, created) in result.items():
                    if not created:
                        raise DuplicateJob(
                            f"Unique key {key!r} of queue {queue.name!r} is held by job "
                            f"{job_id} (live, or within its unique_for_s window): "
                            "nothing enqueued.",
                            job_id=job_id,
                        )
            created_ids = [job_id for job_id, created in result.values() if created]
            if marks:
                mark(queue, created_ids, marks)
        return created_ids

    # Two enqueues waiting on one key's holder can deadlock (InnoDB); ours runs again.
    created_ids = dialect.run_again_on_lock_race(write)
    if created_ids and job_enqueued.receivers:
        job_enqueued.send(queue.name, job_ids=created_ids)
    return [result[key][0] for key in keys]
