"""Exactly-once under real concurrency: threads and processes on their own connections."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest
from django.db import connections, transaction

from alkstore_django import store
from alkstore_django.models import Job
from tests.concurrency.starting_line import race, run_threads
from tests.helpers import DIALECT, ROOT, live_count, needs, sqlite_only

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]


def test_claim_one__two_sessions_racing_for_one_row_get_it_once():
    q = store.queue("race")
    for _ in range(15):
        job_id = q.enqueue({})
        barrier = threading.Barrier(2)

        def claim(index, barrier=barrier):
            barrier.wait()
            handle = store.queue("race").claim_one(f"w{index}")
            return None if handle is None else handle.job.id

        results = run_threads(2, claim)
        assert sorted(results, key=lambda r: r is None) == [job_id, None]
        assert Job.objects.get(id=job_id).attempts == 1
        q.ack_batch([job_id])


def drain(queue_name, worker_id, batch):
    q = store.queue(queue_name)
    acked = []
    while True:
        handles = q.claim_batch(worker_id, batch)
        if not handles:
            return acked
        for handle in handles:
            assert handle.ack() is True
            acked.append(handle.job.id)


def test_claim_batch__six_threads_drain_240_jobs_with_no_double_claim_and_no_loss():
    ids = store.queue("drain").enqueue_many([{"n": n} for n in range(240)])
    barrier = threading.Barrier(6)

    def worker(index):
        barrier.wait()
        return drain("drain", f"thread-{index}", 4)

    per_thread = run_threads(6, worker)
    acked = [job_id for chunk in per_thread for job_id in chunk]
    assert Counter(acked).most_common(1)[0][1] == 1
    assert sorted(acked) == sorted(ids)
    if DIALECT.supports_skip_locked:
        # SQLite's busy handler backs off with sleeps, so one thread may win
        # every round there; the exactly-once checks above hold either way.
        assert sum(1 for chunk in per_thread if chunk) >= 2
    assert live_count() == 0


def test_claim_batch__three_processes_drain_one_queue_exactly_once(
    subprocess_env, python, tmp_path
):
    ids = store.queue("procs").enqueue_many([{"n": n} for n in range(300)])
    connections.close_all()
    go_file = tmp_path / "go"
    drain = [python, "-m", "tests.concurrency.drain", "procs"]
    outputs = race(
        [[*drain, f"proc-{i}", str(go_file), "0.002"] for i in range(3)],
        go_file,
        cwd=ROOT,
        env=subprocess_env,
    )
    for returncode, _, err in outputs:
        assert "database is locked" not in err
        assert returncode == 0, err
    reports = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outputs]
    acked = [job_id for report in reports for job_id in report["acked"]]
    assert [report["refused"] for report in reports] == [[], [], []]
    assert Counter(acked).most_common(1)[0][1] == 1
    assert sorted(acked) == sorted(ids)
    assert sum(1 for report in reports if report["acked"]) >= 2
    assert live_count() == 0


@needs("supports_skip_locked", "no row locks to skip; the sibling pins its wait for the write lock")
def test_claim_one__skips_rows_locked_by_another_session():
    q = store.queue("locked")
    first, second = q.enqueue_many(["first", "second"])
    locked, release = threading.Event(), threading.Event()

    def hold_lock(_):
        with transaction.atomic():
            Job.objects.select_for_update().get(id=first)
            locked.set()
            release.wait(10)

    holder = threading.Thread(target=lambda: run_threads(1, hold_lock))
    holder.start()
    assert locked.wait(10)
    started = time.monotonic()
    handle = q.claim_one("w")
    assert handle.job.id == second
    assert time.monotonic() - started < 2
    release.set()
    holder.join(10)
    assert q.claim_one("w").job.id == first


@sqlite_only("a claim waits for the write lock instead of skipping rows")
def test_claim_one__waits_for_another_sessions_write_lock_instead_of_failing():
    # SQLite has no row locks: a claim waits (busy timeout) for the writer, then runs.
    q = store.queue("locked")
    job_id = q.enqueue({})
    locked = threading.Event()

    def hold_write_lock(_):
        with transaction.atomic():
            store.queue("other").enqueue({})
            locked.set()
            time.sleep(0.5)

    holder = threading.Thread(target=lambda: run_threads(1, hold_write_lock))
    holder.start()
    assert locked.wait(10)
    started = time.monotonic()
    handle = q.claim_one("w")
    # It waited for the writer's half-second transaction rather than failing.
    assert time.monotonic() - started > 0.3
    assert handle.job.id == job_id
    holder.join(10)


def test_enqueue__inside_atomic_is_invisible_to_other_sessions_until_commit():
    q = store.queue("joined")

    def peek(job_id):
        return run_threads(1, lambda _: store.get_job(job_id))[0]

    with transaction.atomic():
        job_id = q.enqueue({"n": 1})
        assert store.get_job(job_id) is not None
        assert peek(job_id) is None
    assert peek(job_id).state == "pending"
