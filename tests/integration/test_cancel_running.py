"""``Store.cancel_job``: a pending job is deleted, a running one is asked, heard and stopped.

Real workers (threads and child processes) on the real database: the request
reaches the handler through the notification (PostgreSQL, MariaDB) or the
worker's poll of the claims it holds (every engine), within the bound the
docs promise; a handler that ignores it is stopped after ``cancel_grace_s``.
However the run ends, the job ends cancelled: no retry, no dead letter, its
attempt in the history, its result ``cancelled`` where kept.
"""

from __future__ import annotations

import time

import pytest

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from alkstore_django.history import attempts_of
from alkstore_django.models import DeadJob, Job, UniqueWindow
from tests.helpers import (
    ALKSTORE_DB,
    ROUTING,
    VENDOR,
    alkstore_connection,
    database_url,
    lapse_claim,
    listener_pids,
    postgres_only,
    running_worker,
    wait_for,
)
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

POLL_S = 0.2
GRACE_S = 0.5
# PostgreSQL pushes the request (NOTIFY): the bound. Elsewhere the worker's
# poll of its held claims finds it within POLL_S, and the loop wakes every 0.25 s.
BOUND_S = 1.0 if VENDOR == "postgresql" else POLL_S + 1.0


@pytest.fixture(autouse=True)
def _short_poll_and_grace(settings):
    settings.ALKSTORE = {
        **ROUTING,
        "POLL_INTERVAL_S": POLL_S,
        "QUEUES": {q: {"cancel_grace_s": GRACE_S} for q in ("c.heed", "c.ignore", "c.sleep")},
    }


@pytest.fixture
def children_on_the_test_database(monkeypatch):
    """A process pool's children record their runs: they must open the test database too."""
    monkeypatch.setenv("DATABASE_URL", database_url())


def started(job_id: int) -> bool:
    return Run.objects.filter(job_id=job_id).exists()


def runs_of(job_id: int) -> list[int]:
    return sorted(Run.objects.filter(job_id=job_id).values_list("attempt", flat=True))


def gone(job_id: int) -> bool:
    return not Job.objects.filter(id=job_id).exists()


def assert_cancelled_once(job_id: int) -> None:
    """Ended cancelled: no live row, no dead letter, one attempt recorded as cancelled."""
    assert gone(job_id)
    assert not DeadJob.objects.filter(id=job_id).exists()
    history = attempts_of(job_id, ALKSTORE_DB)
    assert [a.attempt for a in history] == [1]
    assert "cancelled" in history[0].error
    assert runs_of(job_id) == [1]


def cancel_and_time(job_id: int) -> float:
    """Cancel ``job_id`` (running) and return how long until its row was gone."""
    began = time.monotonic()
    assert store.cancel_job(job_id) is True
    assert wait_for(lambda: gone(job_id), timeout=10, interval=0.01)
    return time.monotonic() - began


# --- a handler that heeds the request --------------------------------------------------


@pytest.mark.usefixtures("children_on_the_test_database")
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_cancel_job__a_polling_handler_ends_cancelled_within_the_bound(pool):
    queue = store.queue("c.heed", max_attempts=3, retry_base_s=0)
    job_id = queue.enqueue({"run_s": 30})
    with running_worker(["c.heed"], pool=pool, poll_interval_s=POLL_S) as worker:
        assert wait_for(lambda: started(job_id), timeout=30)
        took = cancel_and_time(job_id)
        assert wait_for(lambda: worker.stats.cancelled == 1, timeout=5)
        time.sleep(POLL_S * 2)  # a retry would have started by now
    assert took <= BOUND_S, f"{VENDOR}: cancelled {took:.3f} s after cancel_job"
    assert_cancelled_once(job_id)
    assert (worker.stats.retried, worker.stats.dead, worker.stats.acked) == (0, 0, 0)
    assert "cancelled while it ran" in attempts_of(job_id, ALKSTORE_DB)[0].error


def test_cancel_job__a_handler_returning_after_the_request_ends_cancelled_and_keeps_that_result():
    queue = store.queue("c.heed", keep_result_s=60)
    job_id = queue.enqueue({"run_s": 30, "return": True})
    with running_worker(["c.heed"], poll_interval_s=POLL_S) as worker:
        assert wait_for(lambda: started(job_id), timeout=10)
        cancel_and_time(job_id)
    assert_cancelled_once(job_id)
    assert worker.stats.cancelled == 1
    result = store.get_result(job_id)
    assert result is not None
    assert result.state == "cancelled"
    assert result.value is None
    assert "cancelled" in result.error


def test_cancel_job__found_by_the_poll_when_the_notification_is_missed():
    """The watcher is never told (its event is swapped): the poll of held claims finds it."""
    job_id = store.queue("c.heed").enqueue({"run_s": 30})
    with running_worker(["c.heed"], poll_interval_s=POLL_S) as worker:
        worker.cancels.heard = type(worker.cancels.heard)()  # the main thread's copy only
        assert wait_for(lambda: started(job_id), timeout=10)
        took = cancel_and_time(job_id)
    assert took <= POLL_S + 1.0
    assert_cancelled_once(job_id)


@postgres_only("only PostgreSQL's listener carries the request: elsewhere the poll finds it")
def test_cancel_job__sent_while_the_listener_was_down__is_read_once_it_is_back(monkeypatch):
    # The request's notification is lost while the worker's LISTEN connection
    # is down; its poll is 30 s away. Once the listener is back the worker
    # reads its cancel requests at once, as it claims at once.
    from psycopg import OperationalError

    from alkstore_django.dialects.postgresql.watch import PostgresWatcher

    job_id = store.queue("c.heed").enqueue({"run_s": 30})
    with running_worker(["c.heed"], poll_interval_s=30):
        assert wait_for(lambda: started(job_id), timeout=10)
        refusals = [1]  # the server refuses the listener once: it is back a second later
        connect = PostgresWatcher._connect

        def refused_at_first(watcher):
            if refusals:
                refusals.pop()
                raise OperationalError("the server is restarting")
            return connect(watcher)

        monkeypatch.setattr(PostgresWatcher, "_connect", refused_at_first)
        listeners = listener_pids()
        assert listeners, "no listener to cut"
        with alkstore_connection().cursor() as cursor:
            for pid in listeners:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert wait_for(lambda: not refusals, timeout=5)  # the worker saw it go
        took = cancel_and_time(job_id)  # sent while the listener is down
    assert took < 5, f"cancelled {took:.1f} s after cancel_job: at the poll"
    assert_cancelled_once(job_id)


# --- a handler that ignores it: stopped after the grace -------------------------------


@pytest.mark.usefixtures("children_on_the_test_database")
@pytest.mark.parametrize(
    ("pool", "queue_name"), [("threads", "c.ignore"), ("processes", "c.sleep")]
)
def test_grace__a_handler_ignoring_the_request_is_stopped_and_the_worker_serves_the_next(
    pool, queue_name
):
    queue = store.queue(queue_name, max_attempts=3, retry_base_s=0)
    job_id = queue.enqueue({"run_s": 60})
    with running_worker([queue_name, "t.record"], pool=pool, concurrency=1, batch=1) as worker:
        assert wait_for(lambda: started(job_id), timeout=30)
        began = time.monotonic()
        assert store.cancel_job(job_id) is True
        assert wait_for(lambda: gone(job_id), timeout=15, interval=0.01)
        took = time.monotonic() - began
        after = store.queue("t.record").enqueue("after")
        assert wait_for(lambda: gone(after), timeout=30)
        assert not worker.timed_out
    assert GRACE_S <= took <= GRACE_S + BOUND_S + 2.0, took
    assert_cancelled_once(job_id)
    assert (worker.stats.cancelled, worker.stats.acked, worker.stats.retried) == (1, 1, 0)
    assert runs_of(after) == [1]


# --- what cancel_job does without a worker ---------------------------------------------


def test_cancel_job__a_pending_job_is_deleted_at_once_with_its_unique_window_and_result():
    queue = store.queue("c.heed", keep_result_s=60)
    job_id = queue.enqueue({"n": 1}, unique_key="order:7", unique_for_s=3600)
    assert UniqueWindow.objects.filter(job_id=job_id).exists()
    assert store.cancel_job(job_id) is True
    assert gone(job_id)
    assert not UniqueWindow.objects.filter(job_id=job_id).exists()
    assert store.get_result(job_id).state == "cancelled"
    # The key is free again: a new job takes it.
    assert queue.enqueue({"n": 2}, unique_key="order:7", unique_for_s=3600) != job_id
    assert store.cancel_job(job_id) is False


def test_cancel_job__a_finished_dead_or_unknown_job_returns_false_and_changes_nothing():
    job_id = store.queue("t.record").enqueue("x")
    with running_worker(["t.record"]):
        assert wait_for(lambda: gone(job_id), timeout=10)
    assert store.cancel_job(job_id) is False
    dead_id = store.queue("t.fail", max_attempts=1).enqueue("y")
    with running_worker(["t.fail"]):
        assert wait_for(lambda: DeadJob.objects.filter(id=dead_id).exists(), timeout=10)
    assert store.cancel_job(dead_id) is False
    assert DeadJob.objects.filter(id=dead_id).exists()
    assert store.cancel_job(2**62) is False


@pytest.mark.parametrize("bad", ["7", 1.5, True, None, 2**63])
def test_cancel_job__refuses_an_id_that_is_not_a_64_bit_integer(bad):
    with pytest.raises(InvalidArgument, match="Invalid job id"):
        store.cancel_job(bad)


def test_cancel_job__a_running_job_keeps_its_row_with_the_request_stamped_once():
    queue = store.queue("c.heed")
    job_id = queue.enqueue({})
    handle = queue.claim_one("someone")
    assert store.cancel_job(job_id) is True
    first = Job.objects.get(id=job_id).cancel_requested_at
    assert first is not None
    assert Job.objects.get(id=job_id).state == "processing"
    assert store.cancel_job(job_id) is True
    assert Job.objects.get(id=job_id).cancel_requested_at == first
    # A request for a job that finishes first changes nothing: its ack goes through.
    assert handle.ack() is True
    assert store.cancel_job(job_id) is False


def test_cancel_job__a_lapsed_claim_is_deleted_at_once():
    """No worker can settle a lapsed claim: nothing is left to ask."""
    queue = store.queue("c.heed")
    job_id = queue.enqueue({})
    handle = queue.claim_one("gone-worker")
    lapse_claim(job_id)
    assert store.cancel_job(job_id) is True
    assert gone(job_id)
    assert handle.ack() is False


def test_cancel_job__a_claim_with_a_request_from_before_it_is_cancelled_without_running():
    """The worker that was asked died mid-cancel; its claim lapsed; the next claim cancels."""
    queue = store.queue("c.heed", max_attempts=3)
    job_id = queue.enqueue({"run_s": 30}, keep_result_s=60)
    queue.claim_one("died-mid-cancel")
    assert store.cancel_job(job_id) is True  # a request: the claim was live
    lapse_claim(job_id)
    with running_worker(["c.heed"], poll_interval_s=POLL_S) as worker:
        assert wait_for(lambda: gone(job_id), timeout=10)
    assert not started(job_id)
    assert worker.stats.cancelled == 1
    assert not DeadJob.objects.filter(id=job_id).exists()
    history = attempts_of(job_id, ALKSTORE_DB)
    assert len(history) == 1 and "cancelled before it started" in history[0].error
    assert store.get_result(job_id).state == "cancelled"


def test_cancel_job__a_running_workflow_step_is_cancelled_with_its_dependants():
    from alkstore_django import Workflow

    wf = Workflow()
    wf.add("long", queue="c.heed", payload={"run_s": 30})
    wf.add("after_long", queue="t.record", after=["long"])
    workflow_id = store.enqueue_workflow(wf)
    long_job = store.get_workflow(workflow_id).steps["long"].job_id
    with running_worker(["c.heed", "t.record"], poll_interval_s=POLL_S):
        assert wait_for(lambda: started(long_job), timeout=10)
        cancel_and_time(long_job)
    workflow = store.get_workflow(workflow_id)
    assert workflow.state == "cancelled"
    assert {name: s.state for name, s in workflow.steps.items()} == {
        "long": "cancelled",
        "after_long": "cancelled",
    }
    assert "cancelled" in workflow.steps["long"].error
    assert workflow.steps["after_long"].job_id is None


def test_handle_cancel__deletes_only_under_its_claim_and_frees_the_unique_window():
    queue = store.queue("c.heed")
    job_id = queue.enqueue({}, unique_key="k:1", unique_for_s=3600)
    handle = queue.claim_one("w1")
    lapse_claim(job_id)
    assert handle.cancel() is False  # lapsed: not this claim's any more
    again = queue.claim_one("w2")
    assert again.cancel() is True
    assert gone(job_id)
    assert not UniqueWindow.objects.filter(job_id=job_id).exists()
    assert again.cancel() is False
