"""Every table bounded: each prune deletes in batches, keeps what it must, runs on one worker.

A batch size of 2 (``PRUNE_BATCH_SIZE``) makes several rows go in several
statements; the rows each prune must keep are written beside the ones it
deletes. The attempt history's safety net is pinned by counting the rows it
reads: one pass reads each row once, whatever the runs.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from alkstore_django import presence, results, store
from alkstore_django.dialects import batches
from alkstore_django.history import OrphanSweep, forget_acked
from alkstore_django.models import (
    Attempt,
    ChannelMessage,
    DeadJob,
    JobResult,
    LiveWorker,
    OutcomeMinute,
    ScheduleFire,
    TaskResult,
    UniqueWindow,
    Workflow,
    WorkflowStep,
)
from alkstore_django.records import Job as JobRecord
from alkstore_django.throughput import prune_throughput
from alkstore_django.worker import Worker
from alkstore_django.worker.upkeep import UPKEEP_LOCK
from alkstore_django.workflows.progress import prune_finished
from tests.factories import DeadJobFactory
from tests.helpers import (
    ALKSTORE_DB,
    ROUTING,
    age_dead,
    alkstore_connection,
    db_now,
    make_due,
    mysql_only,
    needs_django_tasks,
    postgres_only,
    running_worker,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)

SMALL_BATCHES = override_settings(ALKSTORE={**ROUTING, "PRUNE_BATCH_SIZE": 2})


def deletes(captured) -> int:
    """Return how many DELETE statements ``captured`` saw."""
    return sum(
        1 for q in captured.captured_queries if q["sql"].lstrip().upper().startswith("DELETE")
    )


def ago(seconds: float):
    return db_now() - timedelta(seconds=seconds)


def add_attempts(job_ids, per_job: int = 1) -> None:
    Attempt.objects.bulk_create(
        Attempt(job_id=job_id, queue="dead.q", attempt=n, error="boom")
        for job_id in job_ids
        for n in range(1, per_job + 1)
    )


# --- each table's prune: batched, keeping what it must ----------------------------------


@SMALL_BATCHES
def test_results_prune__deletes_the_expired_in_batches_and_keeps_the_rest():
    now = db_now()
    JobResult.objects.bulk_create(
        JobResult(
            job_id=i,
            queue="q",
            state="succeeded",
            attempts=1,
            finished_at=now,
            expires_at=now + timedelta(seconds=-60 if i < 5 else 3600),
        )
        for i in range(8)
    )
    with CaptureQueriesContext(alkstore_connection()) as captured:
        assert results.prune(store) == 5
    assert deletes(captured) == 3  # 2 + 2 + 1: the short batch ends the run
    assert sorted(JobResult.objects.values_list("job_id", flat=True)) == [5, 6, 7]


@SMALL_BATCHES
def test_throughput_prune__deletes_counters_past_the_retention_in_batches():
    now = db_now().replace(second=0, microsecond=0)
    OutcomeMinute.objects.bulk_create(
        OutcomeMinute(queue="q", minute=now - timedelta(days=2, minutes=i), acked=1)
        for i in range(5)
    )
    OutcomeMinute.objects.create(queue="q", minute=now, acked=1)
    with CaptureQueriesContext(alkstore_connection()) as captured:
        assert prune_throughput(ALKSTORE_DB) == 5
    assert deletes(captured) == 3
    assert list(OutcomeMinute.objects.values_list("minute", flat=True)) == [now]


@override_settings(ALKSTORE={**ROUTING, "PRUNE_BATCH_SIZE": 2, "THROUGHPUT_RETENTION_S": 60})
def test_throughput_prune__follows_the_retention_setting():
    now = db_now().replace(second=0, microsecond=0)
    OutcomeMinute.objects.create(queue="q", minute=now - timedelta(minutes=5), acked=1)
    OutcomeMinute.objects.create(queue="q", minute=now, acked=1)
    assert prune_throughput(ALKSTORE_DB) == 1


@SMALL_BATCHES
def test_worker_purge__deletes_long_silent_workers_in_batches():
    for n in range(5):
        presence.announce(ALKSTORE_DB, f"gone-{n}", queues=["q"], pool="threads", concurrency=1,
                          counts=(0, 0, 0))  # fmt: skip
    LiveWorker.objects.update(last_seen_at=Now() - timedelta(hours=1))
    presence.announce(ALKSTORE_DB, "alive", queues=["q"], pool="threads", concurrency=1,
                      counts=(0, 0, 0))  # fmt: skip
    with CaptureQueriesContext(alkstore_connection()) as captured:
        assert presence.purge_gone(ALKSTORE_DB) == 5
    assert deletes(captured) == 3
    assert list(LiveWorker.objects.values_list("worker_id", flat=True)) == ["alive"]


@SMALL_BATCHES
def test_window_purge__deletes_ended_windows_of_the_queue_in_batches():
    now = db_now()
    UniqueWindow.objects.bulk_create(
        UniqueWindow(queue=queue, unique_key=f"k{i}", job_id=i, held_until=now + offset)
        for i, (queue, offset) in enumerate(
            [("w.q", timedelta(seconds=-5))] * 5
            + [("w.q", timedelta(hours=1)), ("w.other", timedelta(seconds=-5))]
        )
    )
    with CaptureQueriesContext(alkstore_connection()) as captured:
        assert store.dialect.purge_windows("w.q") == 5
    assert deletes(captured) == 3
    assert sorted(UniqueWindow.objects.values_list("unique_key", flat=True)) == ["k5", "k6"]


def test_fire_prune__deletes_one_batch_of_fires_older_than_the_cutoff():
    now = db_now()
    ScheduleFire.objects.bulk_create(
        ScheduleFire(job_id=i, schedule="s", boundary=now - timedelta(days=40 if i < 5 else 1))
        for i in range(7)
    )
    with store.dialect.write_transaction():
        assert store.dialect.prune_fires(now - timedelta(days=30), 2) == 2
    assert ScheduleFire.objects.count() == 5
    with store.dialect.write_transaction():
        assert store.dialect.prune_fires(now - timedelta(days=30), 100) == 3
    assert sorted(ScheduleFire.objects.values_list("job_id", flat=True)) == [5, 6]


@SMALL_BATCHES
def test_workflow_prune__deletes_old_finished_workflows_with_their_steps_in_batches():
    old, recent = ago(8 * 86_400), ago(60)
    made = []
    for finished_at in [old] * 3 + [recent, None]:
        wf = Workflow.objects.create(
            state="running" if finished_at is None else "succeeded",
            steps_total=1, steps_open=0 if finished_at else 1, finished_at=finished_at,
        )  # fmt: skip
        WorkflowStep.objects.create(workflow=wf, name="a", queue="q", payload="{}",
                                    state="succeeded", blocked_by=0)  # fmt: skip
        made.append(wf.id)
    assert prune_finished(store) == 3
    assert sorted(Workflow.objects.values_list("id", flat=True)) == made[3:]
    assert WorkflowStep.objects.count() == 2


@needs_django_tasks("the Tasks backend's results")
@SMALL_BATCHES
def test_task_result_prune__deletes_the_backends_old_results_in_batches():
    from django.tasks import task_backends

    from alkstore_django.tasks.results import prune_results

    now = db_now()
    rows = [("default", 8), ("default", 8), ("default", 8), ("default", 0), ("retry", 8)]
    TaskResult.objects.bulk_create(
        TaskResult(id=i, backend=backend, queue="q", task_path="t.x", enqueued_at=now,
                   finished_at=now - timedelta(days=days), status="SUCCESSFUL")
        for i, (backend, days) in enumerate(rows)
    )  # fmt: skip
    with CaptureQueriesContext(alkstore_connection()) as captured:
        assert prune_results(task_backends["default"]) == 3  # kept 7 days by default
    assert deletes(captured) == 2
    assert sorted(TaskResult.objects.values_list("id", flat=True)) == [3, 4]


@SMALL_BATCHES
def test_a_prune_run_stops_at_its_batch_cap_and_the_next_run_goes_on(monkeypatch):
    monkeypatch.setattr(batches, "PRUNE_MAX_BATCHES", 2)
    JobResult.objects.bulk_create(
        JobResult(job_id=i, queue="q", state="succeeded", attempts=1, finished_at=ago(0),
                  expires_at=ago(60))
        for i in range(7)
    )  # fmt: skip
    assert results.prune(store) == 4
    assert results.prune(store) == 3
    assert not JobResult.objects.exists()


@mysql_only(
    "the message table is trimmed by MariaDB/MySQL's watcher; SQLite's notify keeps a tail "
    "itself, PostgreSQL has NOTIFY and no table"
)
def test_the_watcher_trims_old_messages_batch_after_batch():
    ChannelMessage.objects.bulk_create(
        ChannelMessage(channel="c", payload="", created_at=ago(120)) for _ in range(2_500)
    )
    ChannelMessage.objects.create(channel="c", payload="", created_at=ago(0))
    watcher = store.dialect.open_watcher(["c"])
    try:
        watcher.receive(0.05)
    finally:
        watcher.close()
    assert ChannelMessage.objects.count() == 1


# --- dead letters: batched, their history in the same transaction ----------------------


@SMALL_BATCHES
def test_dead_letter_purge__deletes_old_dead_letters_with_their_history_in_batches():
    old = [DeadJobFactory(queue="dead.q").id for _ in range(5)]
    kept = [DeadJobFactory(queue="dead.q").id, DeadJobFactory(queue="dead.other").id]
    for job_id in old:
        age_dead(job_id, 8 * 86_400)
    age_dead(kept[1], 8 * 86_400)  # another queue's: not this queue's purge
    add_attempts(old + kept, per_job=2)
    with CaptureQueriesContext(alkstore_connection()) as captured:
        assert store.queue("dead.q").sweep_expired().purged == 5
    # Each batch: its windows, its attempts, its dead letters (3 batches: 2, 2, 1).
    history = [q for q in captured.captured_queries if Attempt._meta.db_table in q["sql"]]
    assert len(history) == 3
    assert sorted(DeadJob.objects.values_list("id", flat=True)) == sorted(kept)
    assert sorted(set(Attempt.objects.values_list("job_id", flat=True))) == sorted(kept)


def test_operator_delete_of_dead_letters__takes_their_history_too():
    gone, kept = DeadJobFactory().id, DeadJobFactory().id
    add_attempts([gone, kept])
    from alkstore_django import operations

    assert operations.delete_dead([gone]) == 1
    assert list(Attempt.objects.values_list("job_id", flat=True)) == [kept]


# --- the attempt history of acked jobs -------------------------------------------------


def test_forget_acked__jobs_that_never_failed_cost_no_statement():
    job = JobRecord.__new__(JobRecord)
    object.__setattr__(job, "id", 1)
    object.__setattr__(job, "attempts", 1)
    with CaptureQueriesContext(alkstore_connection()) as captured:
        assert forget_acked(ALKSTORE_DB, [job]) == 0
    assert captured.captured_queries == []


def test_a_worker_deletes_the_history_of_a_job_it_acks_after_a_failed_attempt():
    from alkstore_django.models import Job

    failed, clean = store.queue("t.record").enqueue_many([1, 2], delay_s=3600)
    # A first attempt that failed (its claim lapsed, say): one attempt spent, one recorded.
    Job.objects.filter(id=failed).update(attempts=1)
    add_attempts([failed])
    with running_worker(["t.record"]) as worker:
        # Its first upkeep (the orphan sweep's run of the hour included) is done:
        # the lease is taken before that run, and the loop's next upkeep time is
        # set once every chore of the round has run.
        upkeep = worker.upkeep
        assert wait_for(lambda: upkeep.leadership.handle is not None and upkeep._next_at > 0)
        Attempt.objects.create(job_id=10**12, queue="q", attempt=1, error="an orphan")
        make_due(failed)
        make_due(clean)
        assert wait_for(lambda: worker.stats.acked == 2)
        assert wait_for(lambda: not Attempt.objects.filter(job_id=failed).exists())
    # Only the acked job's history went: the orphan is left to the next sweep.
    assert list(Attempt.objects.values_list("job_id", flat=True)) == [10**12]


# --- the safety net: a walk by id that reads each row once a pass -----------------------


def test_orphan_sweep__deletes_exactly_the_orphans_reading_each_row_once_a_pass(monkeypatch):
    monkeypatch.setattr(batches, "PRUNE_MAX_BATCHES", 3)
    retained = [DeadJobFactory().id for _ in range(60)]
    add_attempts(retained, per_job=5)  # 300 kept rows: the dead letters' history
    live = store.queue("t.raise").enqueue("p")
    add_attempts([live])
    orphans = [10**12 + n for n in range(4)]
    add_attempts(orphans)
    sweep = OrphanSweep()
    reads = []
    deleted = 0
    while True:
        deleted += sweep.run(ALKSTORE_DB, size=20)
        reads.append(sweep.read)
        if sweep.after_id == 0:
            break
    assert deleted == 4
    # Every run reads at most its cap (3 batches of 20), and the pass reads each row once.
    assert max(reads) <= 60
    assert sum(reads) == 305
    assert Attempt.objects.count() == 301
    assert not Attempt.objects.filter(job_id__in=orphans).exists()
    # The next pass starts from the lowest id again, finding nothing to delete.
    assert sweep.run(ALKSTORE_DB, size=20) == 0 and sweep.read == 60


@postgres_only("EXPLAIN ANALYZE's actual row counts are PostgreSQL's; the row-count sibling above")
def test_orphan_sweep__reads_an_index_range_of_its_batch_not_the_retained_table():
    retained = [DeadJobFactory().id for _ in range(200)]
    add_attempts(retained, per_job=10)
    with alkstore_connection().cursor() as cursor:
        cursor.execute(f"ANALYZE {Attempt._meta.db_table}")
    with CaptureQueriesContext(alkstore_connection()) as captured:
        store.dialect.attempts_after(0, 50)
    sql = captured.captured_queries[-1]["sql"]  # its parameters inlined
    with alkstore_connection().cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
    text = json.dumps(plan)
    table = Attempt._meta.db_table
    scans = [n for n in walk_nodes(plan[0]["Plan"]) if n.get("Relation Name") == table]
    assert [s["Node Type"] for s in scans] == ["Index Scan"], text
    # The batch, of 2,000 rows: the rest of the table is not read. (How the
    # probes of the live and dead tables run is the planner's choice by their size.)
    assert scans[0]["Index Name"] == f"{table}_pkey", text
    assert scans[0]["Actual Rows"] == 50, text


def walk_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from walk_nodes(child)


# --- one worker prunes: the upkeep leader ----------------------------------------------


def expired_result(job_id: int) -> None:
    JobResult.objects.create(job_id=job_id, queue="q", state="succeeded", attempts=1,
                             finished_at=ago(0), expires_at=ago(60))  # fmt: skip


def test_two_workers_upkeep__only_the_leader_runs_the_table_wide_prunes():
    first = Worker(["t.record"], worker_id="first")
    second = Worker(["t.record"], worker_id="second")
    expired_result(1)
    first.upkeep.run_due([])
    assert not JobResult.objects.exists()
    expired_result(2)
    second.upkeep.run_due([])
    assert list(JobResult.objects.values_list("job_id", flat=True)) == [2]  # not its to prune
    # The leader renews its lease at each of its sweeps and prunes on.
    first.upkeep.hurry("prune_results")
    first.upkeep.run_due([])
    assert not JobResult.objects.exists()
    # Once the leader leaves, the other worker leads at its next sweep.
    first.upkeep.leave()
    expired_result(3)
    second.upkeep.hurry("prune_results")
    second.upkeep.run_due([])
    assert not JobResult.objects.exists()
    assert second.upkeep.leadership.handle is not None
    second.upkeep.leave()


def test_two_workers_asking_at_once__one_leads():
    workers = [Worker(["t.record"], worker_id=f"w{n}") for n in range(2)]
    barrier = threading.Barrier(2)
    led: list[bool] = []

    def ask(worker: Worker) -> None:
        barrier.wait()
        led.append(worker.upkeep.leadership.held())
        connections.close_all()

    threads = [threading.Thread(target=ask, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(led) == [False, True]


def test_a_stopping_worker_gives_up_the_upkeep_lease():
    with running_worker(["t.record"], worker_id="leader") as worker:
        assert wait_for(lambda: worker.upkeep.leadership.handle is not None)
    from alkstore_django.models import Lock

    lease = Lock.objects.get(name=UPKEEP_LOCK)
    assert lease.expires_at <= db_now()


# --- settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "bad"),
    [
        ({"PRUNE_BATCH_SIZE": 0}, "alkstore.E005"),
        ({"PRUNE_BATCH_SIZE": "5000"}, "alkstore.E005"),
        ({"THROUGHPUT_RETENTION_S": -1}, "alkstore.E004"),
        ({"SCHEDULE_FIRE_RETENTION_S": "30d"}, "alkstore.E004"),
    ],
)
def test_retention_settings__are_checked(raw, bad):
    from alkstore_django.checks import check_settings

    with override_settings(ALKSTORE=raw):
        ids = [m.id for m in check_settings()]
    assert bad in ids
