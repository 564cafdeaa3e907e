"""A handler's progress (``current_run().progress``): written by the worker, read by anyone.

The worker drives real handlers in both pools; the test thread reads the job
through its own connection while the handler still runs. What must hold: a
value is readable within about a second of its report, at most one write a
second goes to the database whatever the handler's rate, the last value is
written before the outcome, and a handler that never reports costs nothing.
"""

from __future__ import annotations

import itertools
import time

import pytest

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from alkstore_django.records import Job as JobRecord
from alkstore_django.records import Progress
from alkstore_django.runs import MAX_NOTE_LENGTH, Run
from tests.helpers import db_now, live_count, running_worker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

POOLS = ["threads", "processes"]


def progress_of(job_id: int) -> Progress | None:
    job = store.get_job(job_id)
    return None if job is None else job.progress


@pytest.fixture
def progress_writes(monkeypatch) -> list[tuple[int, dict, float]]:
    """Record every heartbeat statement that carries progress: (job id, value, when), in order."""
    dialect = store.dialect
    heartbeat = dialect.heartbeat
    writes: list[tuple[int, dict, float]] = []

    def counted(job_id, generation, worker_id, extend_s, progress=None):
        if progress is not None:
            writes.append((job_id, dict(progress), time.monotonic()))
        return heartbeat(job_id, generation, worker_id, extend_s, progress)

    monkeypatch.setattr(dialect, "heartbeat", counted)
    return writes


# --- read back while the handler runs ------------------------------------------------


@pytest.mark.parametrize("pool", POOLS)
def test_progress__is_read_from_another_connection_while_the_handler_runs(tmp_path, pool):
    started, release = tmp_path / "started", tmp_path / "release"
    queue = store.queue("t.progress", visibility_timeout_s=60)
    job_id = queue.enqueue(
        {"reports": [[400, 1000, "rows"]], "started": str(started), "release": str(release)}
    )
    with running_worker(["t.progress"], pool=pool, concurrency=1):
        assert wait_for(started.exists, timeout=30, interval=0.01)
        seen_from = time.monotonic()
        assert wait_for(lambda: progress_of(job_id) is not None, timeout=5, interval=0.01)
        seen_after_s = time.monotonic() - seen_from
        job = store.get_job(job_id)
        assert job.state == "processing"
        assert (job.progress.done, job.progress.total, job.progress.note) == (400, 1000, "rows")
        assert abs((db_now() - job.progress.at).total_seconds()) < 5
        release.touch()
        assert wait_for(lambda: live_count("t.progress") == 0, timeout=10)
    # The first write of a run is due a second after it began (the loop is
    # woken for it), so a job that ends sooner writes none.
    assert seen_after_s < 1.6


@pytest.mark.parametrize("pool", POOLS)
def test_progress__a_later_value_is_written_a_second_after_the_first_though_nothing_else_happens(
    tmp_path, pool
):
    """The heartbeat is 20 s away: only the loop's own wake-up can write the second value."""
    release = tmp_path / "release"
    queue = store.queue("t.progress", visibility_timeout_s=60)
    job_id = queue.enqueue(
        {"reports": [[1, 10, "a"], [2, 10, "b"]], "gap_s": 1.2, "release": str(release)}
    )
    with running_worker(["t.progress"], pool=pool, concurrency=1, poll_interval_s=5):
        assert wait_for(lambda: progress_of(job_id) is not None, timeout=30, interval=0.01)
        first = progress_of(job_id)
        assert wait_for(lambda: progress_of(job_id).done == 2, timeout=5, interval=0.01)
        second = progress_of(job_id)
        release.touch()
        assert wait_for(lambda: live_count("t.progress") == 0, timeout=10)
    assert (first.done, first.note) == (1, "a")
    assert (second.done, second.total, second.note) == (2, 10, "b")
    gap_s = (second.at - first.at).total_seconds()
    assert 0.9 <= gap_s <= 1.6, gap_s


# --- at most one write a second ----------------------------------------------------------


@pytest.mark.parametrize("pool", POOLS)
def test_progress__ten_thousand_reports_in_two_and_a_half_seconds_are_written_once_a_second(
    pool, progress_writes
):
    queue = store.queue("t.progress.spin", visibility_timeout_s=60)
    job_id = queue.enqueue({"calls": 10_000, "duration_s": 2.5})
    samples: list[Progress] = []
    with running_worker(["t.progress.spin"], pool=pool, concurrency=1):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            job = store.get_job(job_id)
            if job is None:
                break
            if job.progress is not None and (not samples or samples[-1] != job.progress):
                samples.append(job.progress)
            time.sleep(0.02)
        assert wait_for(lambda: live_count("t.progress.spin") == 0, timeout=10)
    written = [(value, at) for written_id, value, at in progress_writes if written_id == job_id]
    # Writes at about 0, 1 and 2 s; the ack takes the row with it (no last write
    # of its own). On a loaded machine the first write comes late, and the one
    # due as the job ends may carry its last report: still a second after the one before.
    assert 2 <= len(written) <= 4, written
    dones = [value["done"] for value, _ in written]
    assert dones == sorted(dones), dones
    write_gaps = [b - a for (_, a), (_, b) in itertools.pairwise(written)]
    assert min(write_gaps) >= 0.9, write_gaps
    times = sorted({sample.at for sample in samples})
    assert len(times) >= 2, samples
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.9, gaps
    assert all(sample.total == 10_000 and sample.note == "spinning" for sample in samples)


def test_progress__a_handler_that_never_reports_writes_none(progress_writes):
    queue = store.queue("t.progress", visibility_timeout_s=60, max_attempts=3, retry_base_s=3600)
    acked = queue.enqueue({})
    retried = queue.enqueue({"raise": True})
    with running_worker(["t.progress"], concurrency=2) as worker:
        assert wait_for(lambda: worker.stats.acked == 1 and worker.stats.retried == 1, timeout=20)
    assert store.get_job(acked) is None
    job = store.get_job(retried)
    assert job.state == "pending" and job.progress is None
    assert progress_writes == []


# --- the last value before the outcome -------------------------------------------------------


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("ending", ["raise", "snooze"])
def test_progress__the_last_value_is_written_before_a_retry_or_a_snooze(
    pool, ending, progress_writes
):
    """5 is written at once; 7 comes too soon after to be written but by the outcome."""
    queue = store.queue("t.progress", visibility_timeout_s=60, max_attempts=3, retry_base_s=3600)
    job_id = queue.enqueue({"reports": [[5, 10, "five"], [7, 10, "seven"]], ending: True})
    with running_worker(["t.progress"], pool=pool, concurrency=1) as worker:
        assert wait_for(lambda: worker.stats.retried + worker.stats.snoozed == 1, timeout=30)
    job = store.get_job(job_id)
    assert job.state == "pending"
    assert job.snoozes == (1 if ending == "snooze" else 0)
    assert (job.progress.done, job.progress.total, job.progress.note) == (7, 10, "seven")
    assert job.progress.at is not None
    assert [value["done"] for _, value, _ in progress_writes][-1] == 7


# --- bad values -----------------------------------------------------------------------------------


BAD = [
    ((-1,), "Invalid progress done -1"),
    ((True,), "Invalid progress done True"),
    ((1.5,), "Invalid progress done 1.5"),
    ((2**63,), f"Invalid progress done {2**63}"),
    ((1, "10"), "Invalid progress total '10'"),
    ((1, -3), "Invalid progress total -3"),
    ((1, None, 7), "Invalid progress note 7"),
    ((1, None, "a\x00b"), "Invalid progress note 'a\\x00b'"),
]


# What a payload can carry on every engine (PostgreSQL's jsonb refuses a NUL).
BAD_IN_PAYLOAD = [case for case in BAD if not any("\x00" in str(arg) for arg in case[0])]


@pytest.mark.parametrize("pool", POOLS)
def test_progress__a_bad_value_raises_invalid_argument_naming_it_in_the_handler(pool):
    queue = store.queue("t.progress.bad", keep_result_s=600)
    ids = queue.enqueue_many([{"args": list(args)} for args, _ in BAD_IN_PAYLOAD])
    with running_worker(["t.progress.bad"], pool=pool, concurrency=1) as worker:
        assert wait_for(lambda: worker.stats.acked == len(BAD_IN_PAYLOAD), timeout=30)
    for job_id, (_, expected) in zip(ids, BAD_IN_PAYLOAD, strict=True):
        assert store.get_result(job_id).value.startswith(expected)


def _record() -> JobRecord:
    queue = store.queue("t.progress")
    return store.get_job(queue.enqueue({}))


@pytest.mark.parametrize(("args", "expected"), BAD)
def test_progress__a_bad_value_is_refused_and_keeps_what_was_reported(args, expected):
    run = Run(_record())
    run.progress(3, 4, "kept")
    with pytest.raises(InvalidArgument, match="^" + expected.replace("\\", "\\\\")):
        run.progress(*args)
    assert run.take_progress() == {"done": 3, "total": 4, "note": "kept"}


def test_progress__a_note_over_the_limit_is_refused_naming_the_limit():
    run = Run(_record())
    with pytest.raises(InvalidArgument, match=f"at most {MAX_NOTE_LENGTH} characters"):
        run.progress(1, None, "x" * (MAX_NOTE_LENGTH + 1))
    run.progress(1, None, "x" * MAX_NOTE_LENGTH)
    assert run.progress_pending


def test_progress__the_worker_is_told_once_per_write_not_once_per_report():
    """The callback that wakes the worker runs only when a report finds nothing unwritten."""
    calls: list[Run] = []
    run = Run(_record(), calls.append)
    for done in range(1000):
        run.progress(done)
    assert calls == [run]
    assert run.take_progress()["done"] == 999
    run.progress(1000)
    assert calls == [run, run]


def test_the_test_helpers__give_each_job_a_run_of_its_own():
    """``run_ready_jobs`` runs handlers with a run, as the worker does (progress kept in memory)."""
    from alkstore_django import current_run
    from alkstore_django.testing import run_ready_jobs

    store.queue("t.progress.bad").enqueue({"args": [3, 10, "x"]})
    (ran,) = run_ready_jobs(["t.progress.bad"])
    # Without a run, current_run() is None and the handler fails on its call.
    assert (ran.outcome, ran.error, ran.value) == ("acked", None, None)
    assert current_run() is None  # outside a handler again
