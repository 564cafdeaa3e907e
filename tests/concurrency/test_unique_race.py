"""Unique keys under real concurrency: two sessions enqueue one key at once, one job is written."""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connection, connections, transaction

from alkstore_django import store
from alkstore_django.models import Job
from tests.concurrency.starting_line import race, run_threads
from tests.helpers import ROOT, mysql_only, needs, servers_only

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

ENQUEUES = 200


def live_ids(queue: str) -> list[int]:
    return list(Job.objects.filter(queue=queue).values_list("id", flat=True))


def test_two_threads_enqueue_one_key_200_times_each__exactly_one_live_job():
    barrier = threading.Barrier(2)

    def enqueue(index):
        q = store.queue("race.unique")
        barrier.wait()
        return [q.enqueue({"by": index, "n": n}, unique_key="k") for n in range(ENQUEUES)]

    results = run_threads(2, enqueue)
    (job_id,) = live_ids("race.unique")
    assert {i for ids in results for i in ids} == {job_id}


def test_two_processes_enqueue_one_key_200_times_each__exactly_one_live_job(
    subprocess_env, python, tmp_path
):
    connections.close_all()
    go_file = tmp_path / "go"
    module = [python, "-m", "tests.concurrency.enqueue_key", "race.unique", "k", str(ENQUEUES)]
    outputs = race(
        [[*module, str(go_file), f"p{i}"] for i in range(2)], go_file, cwd=ROOT, env=subprocess_env
    )
    for returncode, _, err in outputs:
        assert returncode == 0, err
    returned = {i for _, out, _ in outputs for i in json.loads(out.strip().splitlines()[-1])}
    (job_id,) = live_ids("race.unique")
    assert returned == {job_id}


def test_an_enqueue_racing_a_rolled_back_holder__writes_its_own_job():
    # The second session's insert waits on the first's uncommitted key (SQLite:
    # on its write lock), then writes once the first rolls back.
    holding, other_done = threading.Event(), threading.Event()
    got: list[int] = []

    def holder(_):
        with pytest.raises(RuntimeError), transaction.atomic():
            store.queue("race.unique").enqueue({"by": "holder"}, unique_key="k")
            holding.set()
            time.sleep(0.5)
            raise RuntimeError("roll back")

    def other(_):
        assert holding.wait(10)
        got.append(store.queue("race.unique").enqueue({"by": "other"}, unique_key="k"))
        other_done.set()

    run_threads(2, lambda i: holder(i) if i == 0 else other(i))
    assert live_ids("race.unique") == got
    assert store.get_job(got[0]).payload == {"by": "other"}


def test_two_enqueues_waiting_on_a_rolled_back_holder__one_writes_the_other_returns_it():
    # InnoDB's duplicate-key deadlock: both waiters take a shared lock on the
    # holder's key, and when it rolls back each needs the exclusive one. The
    # loser's transaction is rolled back whole; an enqueue in its own
    # transaction runs again and finds the winner.
    holding = threading.Event()
    got: list[int] = []

    def holder():
        with pytest.raises(RuntimeError), transaction.atomic():
            store.queue("race.unique").enqueue({"by": "holder"}, unique_key="k")
            holding.set()
            time.sleep(0.5)
            raise RuntimeError("roll back")

    def waiter():
        assert holding.wait(10)
        got.append(store.queue("race.unique").enqueue({"by": "waiter"}, unique_key="k"))

    run_threads(3, lambda i: holder() if i == 0 else waiter())
    (job_id,) = live_ids("race.unique")
    assert got == [job_id, job_id]


def test_enqueues_racing_acks__never_two_live_jobs_and_each_id_was_a_holder():
    # One session acks whatever it claims while two enqueue the key: every
    # enqueue either writes the one live job or returns the current one's id.
    stop = threading.Event()
    acked: list[int] = []

    def enqueue(_):
        q = store.queue("race.unique")
        ids = [q.enqueue({}, unique_key="k") for _ in range(100)]
        return ids

    def drain(_):
        q = store.queue("race.unique")
        while not stop.is_set():
            for handle in q.claim_batch("drainer", 5):
                assert len(live_ids("race.unique")) <= 1
                if handle.ack():
                    acked.append(handle.job.id)
            time.sleep(0.001)

    drainer = threading.Thread(target=lambda: run_threads(1, drain))
    drainer.start()
    try:
        results = run_threads(2, enqueue)
    finally:
        stop.set()
        drainer.join(30)
    remaining = live_ids("race.unique")
    assert len(remaining) <= 1
    returned = {i for ids in results for i in ids}
    assert returned == set(acked) | set(remaining)


def enqueue_after_another_session_took_the_key():
    """Inside a transaction that has already read, enqueue a key another session took since."""
    q = store.queue("race.unique")
    with transaction.atomic():
        assert not Job.objects.filter(queue="race.unique").exists()  # the snapshot, if any
        (other,) = run_threads(1, lambda _: q.enqueue({"by": "other"}, unique_key="k"))
        assert q.enqueue({"by": "me"}, unique_key="k") == other
    return other


@needs("supports_skip_locked", "a second writer would wait for this transaction's write lock")
def test_a_key_taken_after_the_transaction_began__returns_the_holder():
    other = enqueue_after_another_session_took_the_key()
    assert live_ids("race.unique") == [other]


@mysql_only("REPEATABLE READ is InnoDB's default; the others refuse the read or serialize")
def test_a_key_taken_after_a_repeatable_read_snapshot__returns_the_holder():
    # A plain read would not see the holder in this snapshot and the enqueue
    # would never find who took the key: the holder is read with a locking read.
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        other = enqueue_after_another_session_took_the_key()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    assert live_ids("race.unique") == [other]


@servers_only("SQLite cannot turn a read snapshot older than another commit into a write")
def test_an_enqueue_in_a_transaction_whose_snapshot_predates_a_window__gets_the_holder():
    # The other session's transaction reads first (under REPEATABLE READ on
    # MariaDB, that fixes its snapshot); the key's holder is
    # enqueued with a window and succeeds after; the late enqueue must see the window.
    snapshot_taken, window_committed = threading.Event(), threading.Event()
    got: list[int] = []

    def late_enqueue() -> None:
        try:
            if connection.vendor == "mysql":
                # MariaDB's own default, which a site may keep (Django sets READ COMMITTED).
                with connection.cursor() as cursor:
                    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            with transaction.atomic():
                Job.objects.filter(queue="race.window").count()
                snapshot_taken.set()
                assert window_committed.wait(30)
                got.append(store.queue("race.window").enqueue({"late": 1}, unique_key="k"))
        finally:
            connection.close()

    thread = threading.Thread(target=late_enqueue)
    thread.start()
    assert snapshot_taken.wait(30)
    q = store.queue("race.window")
    holder = q.enqueue({}, unique_key="k", unique_for_s=3600)
    assert q.claim_one("w").ack()
    window_committed.set()
    thread.join(60)

    assert got == [holder]
    assert live_ids("race.window") == []
