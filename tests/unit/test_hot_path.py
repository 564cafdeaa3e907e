"""The worker's per-job shortcuts give what the plain way gives.

Each one replaces a general mechanism on the path every job takes (a frozen
record's ``__init__``, ``logging.Formatter.formatTime``, ``logger.log``'s
search for its caller, a connection tidy before each job, Django's timestamp
loader): these tests pin that the result is the same.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from dataclasses import fields, replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections

from alkstore_django import executor, store
from alkstore_django.codecs import load_json
from alkstore_django.dialects.base import JOB_COLUMNS
from alkstore_django.executor import Settled
from alkstore_django.management.service import (
    LOG_FORMAT,
    VERBOSE_LOG_FORMAT,
    _DefaultHandler,
    _Formatter,
)
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


@pytest.mark.parametrize(
    "text",
    ["null", '{"i": 1}', '[1, "ç ✓", {"a": null}]', ' {"i": 1}', '{"i": 1} ', "\n3\t", "1e400"],
)
def test_load_json__decodes_what_json_loads_decodes(text):
    assert load_json(text) == json.loads(text)
    assert load_json(text.encode()) == json.loads(text)


@pytest.mark.parametrize("text", ["", " ", '{"i": 1} x', '{"i": 1}{}', "nul", "[1,"])
def test_load_json__refuses_what_json_loads_refuses(text):
    with pytest.raises(json.JSONDecodeError) as refused:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as ours:
        load_json(text)
    assert (ours.value.msg, ours.value.pos) == (refused.value.msg, refused.value.pos)


def test_load_json__passes_a_decoded_value_through():
    decoded = {"i": [1]}
    assert load_json(decoded) is decoded


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


@pytest.mark.django_db(transaction=True)
def test_run_job__tidies_connections_once_its_thread_has_made_one(monkeypatch):
    # A thread that never made a connection has none to close: its jobs skip
    # the tidies; once one of its handlers connects, every job is tidied after.
    tidies = []
    close = executor.close_old_connections
    monkeypatch.setattr(executor, "close_old_connections", lambda: tidies.append(1) or close())
    seen = {}

    def queries(job):
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")

    def thread():
        job = store.dialect.job_from_row([None] * 2 + ["null"] + [None] * (len(JOB_COLUMNS) - 3))
        executor._tidied.at = time.monotonic() - executor.TIDY_FRESH_S  # idle: due before too
        seen["outcomes"] = [executor.run_job(lambda job: None, job).kind]
        seen["without a connection"] = len(tidies)
        seen["outcomes"].append(executor.run_job(queries, job).kind)
        seen["outcomes"].append(executor.run_job(lambda job: None, job).kind)
        seen["after one"] = len(tidies)
        connections.close_all()

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    assert seen == {"outcomes": ["ack"] * 3, "without a connection": 0, "after one": 2}


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


@pytest.mark.django_db(transaction=True)
def test_claim__sends_the_acked_ids_once_not_on_every_claimed_row(monkeypatch):
    # The ids a claim acked were sent (and decoded, in Python) on each row it
    # claimed: a tenth of a no-op job's worker CPU at batch 32.
    dialect = store.dialect
    if connections[dialect.using].vendor != "postgresql":
        pytest.skip(
            "SQLite and MariaDB claim in several statements: their acks are rows of their own"
        )
    q = store.queue("q.acks")
    q.enqueue_many([None] * 7)
    acked, first = dialect.claim_and_ack("q.acks", "w", 3, "w", [])
    assert acked == []
    rows: list[tuple] = []
    fetch = dialect.fetch_generic

    def kept(*args):
        rows[:] = fetch(*args)
        return list(rows)

    monkeypatch.setattr(dialect, "fetch_generic", kept)
    fences = [(job.id, job.generation) for job in first]
    acked, second = dialect.claim_and_ack("q.acks", "w", 3, "w", fences)
    assert sorted(acked) == sorted(job.id for job in first)
    assert [job.id for job in second] == sorted(job.id for job in second)
    assert len(second) == 3 and len(rows) == 4
    assert [row[0] is not None for row in rows].count(True) == 1
    # Acks with nothing left to claim: the acked row alone.
    _, third = dialect.claim_and_ack("q.acks", "w", 3, "w", [(j.id, j.generation) for j in second])
    acked, fourth = dialect.claim_and_ack(
        "q.acks", "w", 3, "w", [(j.id, j.generation) for j in third]
    )
    assert (len(third), acked, fourth, len(rows)) == (1, [third[0].id], [], 1)


class _Writes(io.StringIO):
    """A stream that counts its writes."""

    writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.fixture
def alone():
    """The commands' stderr handler as the only one the worker's lines reach, on a stream."""
    handler = _DefaultHandler(_Writes())
    ours = logging.getLogger("alkstore_django")
    saved = (ours.handlers, ours.level, ours.propagate)
    ours.setLevel(logging.INFO)
    try:
        yield lambda: _alone(ours, handler)
    finally:
        ours.handlers, ours.level, ours.propagate = saved


def _alone(ours: logging.Logger, handler: _DefaultHandler) -> _DefaultHandler:
    # In place of the test settings' handler and pytest's capture handlers,
    # which pytest adds as each test's body starts.
    ours.handlers, ours.propagate = [handler], False
    return handler


def _job(job_id: int) -> Job:
    return replace(
        store.dialect.job_from_row([job_id, "q.log", "null"] + [None] * (len(JOB_COLUMNS) - 3)),
        attempts=1,
    )


def _record(tally_: Tally, job_id: int, result: Settled) -> None:
    error = "E: x" if result == Settled.RETRIED else None
    outcome = executor.Outcome(executor.OutcomeKind.FAIL, error=error)
    outcome.duration_ms = 0.5
    tally_.record(_job(job_id), outcome, result)


def _messages(text: str) -> list[str]:
    # What follows the asctime: "INFO job id=…", or with -v 2, the logger's and thread's names too.
    return [line[24:] for line in text.splitlines()]


@pytest.mark.parametrize("fmt", [LOG_FORMAT, VERBOSE_LOG_FORMAT])
def test_batched_lines__are_the_lines_the_records_write_with_one_write(alone, fmt):
    # A claim's acks are reported together: their lines go out as one write,
    # and read as the records' lines do, in the same order, stamped the moment
    # they were reported (after the commit).
    handler = alone()
    handler.setFormatter(_Formatter(fmt))
    stream = handler.stream
    one_at_a_time = Tally("default")
    for job_id in range(32):
        _record(one_at_a_time, job_id, Settled.RETRIED if job_id == 3 else Settled.ACKED)
    one_by_one, stream.writes = stream.getvalue(), 0
    stream.seek(0)
    stream.truncate()
    before = time.time()
    batching = Tally("default")
    with batching.batched():
        for job_id in range(32):
            _record(batching, job_id, Settled.RETRIED if job_id == 3 else Settled.ACKED)
    after = time.time()
    assert stream.writes == 1
    assert _messages(stream.getvalue()) == _messages(one_by_one)
    assert len(_messages(one_by_one)) == 32
    assert "id=3 queue=q.log outcome=retried attempts=1 duration_ms=0.5 error='E: x'" in one_by_one
    stamps = {line[:23] for line in stream.getvalue().splitlines()}
    assert len(stamps) == 1
    stamp = datetime.strptime(stamps.pop(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert int(before * 1000) / 1000 <= stamp <= after
    assert batching.stats.acked == 31
    assert batching.stats.retried == 1


def test_batched_lines__keep_their_order_around_a_warning(alone):
    handler = alone()
    handler.setFormatter(_Formatter(LOG_FORMAT))
    tally_ = Tally("default")
    with tally_.batched():
        _record(tally_, 1, Settled.ACKED)
        _record(tally_, 2, Settled.LOST)
        _record(tally_, 3, Settled.ACKED)
    lines = handler.stream.getvalue().splitlines()
    assert [line.split()[2:5] for line in lines] == [
        ["INFO", "job", "id=1"],
        ["WARNING", "job", "id=2"],
        ["INFO", "job", "id=3"],
    ]


@pytest.mark.parametrize(
    "where", ["a filter on the handler", "a filter on the logger", "a site handler"]
)
def test_batched_lines__leave_a_site_handler_or_filter_a_record_per_job(alone, where):
    # Only the commands' own handler, reached alone, takes a batch as text:
    # anything else between the worker and the stream gets its records.
    commands_handler = alone()
    commands_handler.setFormatter(_Formatter(LOG_FORMAT))
    seen: list[logging.LogRecord] = []
    site = logging.Handler()
    site.emit = seen.append  # type: ignore[method-assign]
    worker_logger = logging.getLogger("alkstore_django.worker")

    def keep(record: logging.LogRecord) -> bool:
        seen.append(record)
        return True

    target = {
        "a filter on the handler": (
            commands_handler.addFilter,
            commands_handler.removeFilter,
            keep,
        ),
        "a filter on the logger": (worker_logger.addFilter, worker_logger.removeFilter, keep),
        "a site handler": (worker_logger.addHandler, worker_logger.removeHandler, site),
    }[where]
    add, remove, what = target
    add(what)
    try:
        tally_ = Tally("default")
        with tally_.batched():
            for job_id in range(4):
                _record(tally_, job_id, Settled.ACKED)
    finally:
        remove(what)
    assert [r.getMessage().split()[1] for r in seen] == [f"id={n}" for n in range(4)]
    assert commands_handler.stream.writes == 4


def _acked(job_id: int) -> tuple[Job, executor.Outcome]:
    outcome = executor.Outcome(executor.OutcomeKind.ACK)
    outcome.duration_ms = 0.5
    return _job(job_id), outcome


@pytest.mark.parametrize("batched", [True, False])
def test_record_acked__counts_and_logs_what_record_does(alone, batched):
    # A claim's committed acks are counted and logged together: the same
    # lines, counts and throughput counters as ``record`` gives each.
    handler = alone()
    handler.setFormatter(_Formatter(LOG_FORMAT))
    one_at_a_time = Tally("default")
    for job, outcome in map(_acked, range(5)):
        one_at_a_time.record(job, outcome, Settled.ACKED)
    one_by_one = handler.stream.getvalue()
    handler.stream.seek(0)
    handler.stream.truncate()
    together = Tally("default")
    if batched:
        with together.batched():
            together.record_acked([_acked(n) for n in range(5)])
    else:
        together.record_acked([_acked(n) for n in range(5)])
    assert _messages(handler.stream.getvalue()) == _messages(one_by_one)
    assert len(_messages(one_by_one)) == 5
    assert together.stats == one_at_a_time.stats
    assert together._counts == one_at_a_time._counts == {("q.log", "acked"): 5}


def test_record_acked__feeds_the_workers_metrics(alone):
    from prometheus_client import CollectorRegistry

    from alkstore_django.worker.instruments import Instruments

    alone()
    registry = CollectorRegistry()
    together = Tally("default", Instruments(registry))
    with together.batched():
        together.record_acked([_acked(n) for n in range(3)])
    labels = {"queue": "q.log", "outcome": "acked"}
    assert registry.get_sample_value("alkstore_worker_jobs_total", labels) == 3
    assert together.stats.acked == 3


def test_report_acks__keeps_a_lost_claims_line_in_its_place_and_finishes_each(alone):
    # One committed claim acked jobs 1 and 3; job 2's claim was gone. The
    # lines keep the batch's order, and every job is announced with its result.
    from alkstore_django.queues.handles import JobHandle
    from alkstore_django.signals import job_finished
    from alkstore_django.worker.completer import Completer
    from alkstore_django.worker.controls import Controls
    from alkstore_django.worker.holdings import Done, Holdings

    handler = alone()
    handler.setFormatter(_Formatter(LOG_FORMAT))
    holdings, tally_ = Holdings(4), Tally("default")
    completer = Completer("w", store, holdings, tally_, Controls(["q.log"], 1.0), 4)
    queue = store.queue("q.log")
    now = time.monotonic()
    done = []
    for job_id in (1, 2, 3):
        job, outcome = _acked(job_id)
        job = replace(job, visibility_timeout_s=30.0, generation=1)
        done.append(Done(holdings.add(JobHandle(queue, job), None, now), outcome))
    finished: list[tuple[int, Settled]] = []

    def receiver(sender, job, outcome, result, **kwargs):
        finished.append((job.id, result))

    job_finished.connect(receiver)
    try:
        completer.report_acks(done, {1, 3})
    finally:
        job_finished.disconnect(receiver)
    lines = handler.stream.getvalue().splitlines()
    assert [line.split()[2:6] for line in lines] == [
        ["INFO", "job", "id=1", "queue=q.log"],
        ["WARNING", "job", "id=2", "queue=q.log"],
        ["INFO", "job", "id=3", "queue=q.log"],
    ]
    assert "outcome=lost" in lines[1]
    assert handler.stream.writes == 3  # id=1's line, the warning, id=3's line
    assert finished == [(1, Settled.ACKED), (2, Settled.LOST), (3, Settled.ACKED)]
    assert (tally_.stats.acked, tally_.stats.lost) == (2, 1)
    assert len(holdings) == 0
    assert all(d.held.handle.spent for d in done)
