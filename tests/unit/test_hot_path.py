"""The worker's per-job shortcuts give what the plain way gives.

Each one replaces a general mechanism on the path every job takes (a frozen
record's ``__init__``, ``logging.Formatter.formatTime``, ``logger.log``'s
search for its caller, a connection tidy before each job, Django's timestamp
loader): these tests pin that the result is the same.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections

from alkstore_django import executor, store
from alkstore_django.dialects.base import JOB_COLUMNS
from alkstore_django.executor import Settled
from alkstore_django.management.service import LOG_FORMAT, VERBOSE_LOG_FORMAT, _Formatter
from alkstore_django.models import Job as JobRow
from alkstore_django.records import Job
from alkstore_django.worker import tally
from alkstore_django.worker.tally import Tally


def test_job_from_row__builds_the_record_its_constructor_builds():
    now = datetime(2026, 12, 1, 2, 3, 4, 567000, tzinfo=UTC)
    values = {
        "id": 7, "queue": "q", "payload": '{"a": [1]}', "priority": 3, "run_at": now,
        "attempts": 2, "max_attempts": 5, "visibility_timeout_s": 30.0, "retry_base_s": 1.5,
        "expires_at": None, "state": "processing", "worker_id": "w", "claim_expires_at": now,
        "last_error": "ValueError: x", "enqueued_at": now, "generation": 9, "timeout_s": 2.5,
        "snoozes": 1, "max_snoozes": 4, "unique_key": "k", "workflow_id": 11, "step": "s",
        "keep_result_s": 60.0, "concurrency_key": "c", "tags": ",a,b,",
        "cancel_requested_at": now, "trace_context": '{"traceparent":"00-ab-cd-01"}',
    }  # fmt: skip
    row = [values[name] for name in JOB_COLUMNS]
    built = store.dialect.job_from_row(row)
    assert built == Job(**{**values, "payload": {"a": [1]}, "tags": ("a", "b")})
    # A field the row does not carry would silently keep its class default
    # (a claim reads no progress: the run reports it).
    assert {f.name for f in fields(Job)} == {*JOB_COLUMNS, "died_at", "progress"}
    with pytest.raises(ValueError, match="zip"):
        store.dialect.job_from_row(row[:-1])


@pytest.mark.parametrize("fmt", [LOG_FORMAT, VERBOSE_LOG_FORMAT])
def test_formatter__writes_the_standard_asctime_across_seconds(fmt):
    ours, standard = _Formatter(fmt), logging.Formatter(fmt)
    start = time.time()
    for offset in (0.0, 0.001, 0.999, 1.0, 1.5, 61.25, 3600.0, 0.5):
        record = logging.LogRecord("alkstore_django.worker", logging.INFO, "p", 1, "m", (), None)
        record.created = start + offset
        record.msecs = (record.created - int(record.created)) * 1000
        assert ours.format(record) == standard.format(record)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("idle_s", "tidied"), [(0.0, False), (executor.TIDY_FRESH_S, True)])
def test_run_job__tidies_connections_first_only_after_an_idle_spell(idle_s, tidied):
    # A connection that aged past its CONN_MAX_AGE while the thread was idle
    # is replaced before the next job; right after a job's own tidy it is not
    # looked at again.
    seen = {}

    def handler(job):
        seen["open"] = connections["default"].connection is not None

    def thread():
        wrapper = connections["default"]
        wrapper.ensure_connection()
        wrapper.close_at = time.monotonic() - 1  # past its maximum age
        executor._tidied.at = time.monotonic() - idle_s
        job = store.dialect.job_from_row([None] * 2 + ["null"] + [None] * (len(JOB_COLUMNS) - 3))
        seen["outcome"] = executor.run_job(handler, job).kind
        connections.close_all()

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    assert seen == {"open": not tidied, "outcome": "ack"}


@pytest.mark.parametrize(
    ("result", "error", "level", "tail"),
    [
        (Settled.ACKED, None, logging.INFO, ""),
        (Settled.DEAD, "ValueError: no", logging.WARNING, " error='ValueError: no'"),
    ],
)
def test_job_log_line__is_the_record_logger_log_makes(result, error, level, tail):
    # The record is made without the stack walk that finds its caller: the
    # fields a handler or filter reads are the ones logger.log would give.
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    worker_logger = logging.getLogger("alkstore_django.worker")
    worker_logger.addHandler(handler)
    old_level = worker_logger.level
    worker_logger.setLevel(logging.INFO)
    job = store.dialect.job_from_row([41, "q.log", "null"] + [None] * (len(JOB_COLUMNS) - 3))
    job = replace(job, attempts=2)
    outcome = executor.Outcome(executor.OutcomeKind.FAIL, error=error)
    outcome.duration_ms = 1.25
    try:
        Tally("default").record(job, outcome, result)
        worker_logger.setLevel(logging.ERROR)
        Tally("default").record(job, outcome, result)  # below the level: no record
    finally:
        worker_logger.setLevel(old_level)
        worker_logger.removeHandler(handler)
    [record] = records
    assert record.getMessage() == (
        f"job id=41 queue=q.log outcome={result.value} attempts=2 duration_ms=1.2{tail}"
    )
    assert (record.levelno, record.name) == (level, "alkstore_django.worker")
    assert (record.funcName, record.pathname) == ("record", tally.__file__)
    code = Tally.record.__code__
    assert code.co_firstlineno <= record.lineno < code.co_firstlineno + 40
    assert record.threadName == threading.current_thread().name
    assert record.exc_info is None


@pytest.mark.django_db(transaction=True)
def test_claim__reads_the_timestamps_the_orm_reads():
    # The worker's claim decodes timestamps with psycopg's loader on
    # PostgreSQL (Django's elsewhere): the same instants as the ORM's.
    q = store.queue("q.stamps")
    [job_id] = q.enqueue_many([None])
    _, [claimed] = store.dialect.claim_and_ack("q.stamps", "w", 1, "w", [])
    row = JobRow.objects.get(id=job_id)
    for name in ("run_at", "enqueued_at", "claim_expires_at"):
        value = getattr(claimed, name)
        assert value == getattr(row, name), name
        assert value.utcoffset() == timedelta(0), name
