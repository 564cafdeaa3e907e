"""Queue wake-ups coalesced per process (``NOTIFY_COALESCE_S``) and sent only while a
worker waits, and no job left waiting on either.

Every commit that sends a notification takes PostgreSQL's one notification
lock, so an enqueue that follows a wake-up of the same process within the
window sends none, and neither does one while no worker of its queue waits
(``LiveWorker.waiting``); an idle worker claims again one and two windows
after each wake-up it hears and after it starts to wait. The window is
widened here so that the timings are not races.
"""

from __future__ import annotations

import contextlib
import threading
import time
from unittest import mock

import pytest
from django.db import connections, transaction
from django.test import override_settings

from alkstore_django import presence, store
from alkstore_django.models import LiveWorker
from alkstore_django.notify import open_watcher
from alkstore_django.queues import channel_for
from alkstore_django.worker import Worker
from tests.helpers import (
    ALKSTORE_DB,
    ROUTING,
    postgres_only,
    running_worker,
    wait_for,
    waiting_worker,
)
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW_S = 0.5
QUEUE = "t.record"
notifies = postgres_only(
    "only PostgreSQL sends a notification with each enqueue (SQLite's workers watch "
    "the file, MariaDB's poll): the worker tests below are every engine's sibling"
)


@pytest.fixture
def window():
    with override_settings(ALKSTORE={**ROUTING, "NOTIFY_COALESCE_S": WINDOW_S}):
        time.sleep(WINDOW_S)  # past the window of any wake-up an earlier test sent
        yield


@pytest.fixture
def heard():
    """Return a function that collects the queue's notifications for a while."""
    watcher = open_watcher(store, [channel_for(QUEUE)])

    def collect(for_s: float) -> int:
        count, deadline = 0, time.monotonic() + for_s
        while (left := deadline - time.monotonic()) > 0:
            count += len(watcher.receive(left))
        return count

    yield collect
    watcher.close()


@pytest.fixture
def waiter():
    """A worker of the queue that waits for wake-ups (its live-worker row)."""
    with waiting_worker(QUEUE) as worker_id:
        yield worker_id


@notifies
def test_enqueues_within_the_window__send_one_wake_up(window, heard, waiter):
    q = store.queue(QUEUE)
    for i in range(5):
        q.enqueue(i)
    assert heard(0.2) == 1
    time.sleep(WINDOW_S)
    q.enqueue("after the window")
    assert heard(0.2) == 1


@notifies
def test_no_window__every_enqueue_sends_its_wake_up__waiting_or_not(heard):
    with override_settings(ALKSTORE={**ROUTING, "NOTIFY_COALESCE_S": 0}):
        q = store.queue(QUEUE)
        for i in range(3):
            q.enqueue(i)
            heard_now = heard(0.1)
            assert heard_now == 1


@notifies
@pytest.mark.parametrize(
    ("open_windows", "wake_ups"),
    # A slow commit (a loaded server) past the first window is still covered:
    # the workers claim again one and two windows after the first's wake-up.
    # A commit later than that is announced by a notification of its own.
    [(1.2, 0), (2, 1)],
    ids=["within-two-windows-sends-nothing", "past-two-windows-sends-its-own"],
)
def test_quiet_enqueue_in_a_long_transaction(window, heard, waiter, open_windows, wake_ups):
    q = store.queue(QUEUE)
    q.enqueue("first")
    assert heard(0.1) == 1
    with transaction.atomic(using=ALKSTORE_DB):
        q.enqueue("quiet, in a long transaction")  # within the window of the first
        time.sleep(open_windows * WINDOW_S)
        assert heard(0.1) == 0  # nothing is delivered before the commit
    assert heard(0.2) == wake_ups


@notifies
def test_steady_enqueues__carry_their_wake_ups_in_the_statement():
    # A quiet enqueue that commits past the window sends a wake-up of its own,
    # a second statement: one was made at nearly every window's edge (19 in
    # 22 windows when this test was written). A quiet one is now made only
    # while it can still commit inside the window, so the wake-up rides the
    # next enqueue's statement.
    window_s = 0.005
    separate = 0
    real = store.dialect.wake_if_waiting

    def counted(queue: str, channel: str) -> None:
        nonlocal separate
        separate += 1
        real(queue, channel)

    q = store.queue(QUEUE)
    with (
        override_settings(ALKSTORE={**ROUTING, "NOTIFY_COALESCE_S": window_s}),
        mock.patch.object(store.dialect, "wake_if_waiting", counted),
        waiting_worker(QUEUE),
    ):
        started = time.monotonic()
        for i in range(300):
            q.enqueue(i)
        windows = (time.monotonic() - started) / window_s
    assert windows > 8  # enough windows for their edges to count
    assert separate <= windows / 4, (separate, windows)


@notifies
def test_rolled_back_enqueue__sends_nothing_and_records_no_wake_up(window, heard, waiter):
    q = store.queue(QUEUE)
    with contextlib.suppress(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        q.enqueue("rolled back")
        raise RuntimeError
    assert heard(0.1) == 0
    q.enqueue("next")  # no committed wake-up covers it: it sends one
    assert heard(0.2) == 1


def test_idle_worker__runs_a_job_enqueued_without_a_wake_up_within_the_window(window):
    # The second job commits after the worker's claim for the first, inside
    # the first one's window: no notification announces it, and the poll is
    # 30 s away. The worker's claim one window after the wake-up finds it.
    q = store.queue(QUEUE)
    with running_worker([QUEUE], poll_interval_s=30) as worker:
        time.sleep(0.3)
        first = q.enqueue("announced")
        assert wait_for(lambda: Run.objects.filter(job_id=first).exists(), timeout=3)
        if store.dialect.supports_listen_notify:
            assert worker.cadence.heard_at > 0  # the loop knows when to look again
        time.sleep(0.1)  # the worker has acked the first and gone idle
        second = q.enqueue("unannounced")
        started = time.monotonic()
        assert wait_for(lambda: Run.objects.filter(job_id=second).exists(), timeout=5)
        assert time.monotonic() - started < WINDOW_S + 2


@notifies
def test_idle_worker__claims_again_one_and_two_windows_after_the_wake_up_it_heard(window):
    # A quiet enqueue may commit up to two windows after the wake-up that
    # covers it (a slow commit under load), so a worker that has claimed
    # since the first window passed still waits for the second, not for its
    # poll 30 s away. The loop's own wait is asked, on a worker not started.
    worker = Worker([QUEUE], poll_interval_s=30)
    now = time.monotonic()
    worker.cadence.heard_at = now - 0.5 * WINDOW_S
    worker.cadence.filled_at = now - 0.4 * WINDOW_S  # its claim on hearing it
    assert worker.cadence.idle_timeout() <= 0.5 * WINDOW_S
    worker.cadence.heard_at = now - 1.5 * WINDOW_S
    worker.cadence.filled_at = now - 0.4 * WINDOW_S  # its claim one window after
    assert worker.cadence.idle_timeout() <= 0.5 * WINDOW_S
    worker.cadence.heard_at = now - 2.5 * WINDOW_S
    worker.cadence.filled_at = now - 0.4 * WINDOW_S  # its claim two windows after: the poll is next
    assert worker.cadence.idle_timeout() > 2 * WINDOW_S


@notifies
def test_no_worker_waiting__an_enqueue_sends_no_wake_up(window, heard):
    # Every worker of the queue is busy (or none runs): each claims again as
    # it frees up, so the notification's lock would buy nothing.
    q = store.queue(QUEUE)
    q.enqueue("nobody waits")
    with waiting_worker(QUEUE, waiting=False):
        time.sleep(WINDOW_S)
        q.enqueue("its worker is busy")
        assert heard(0.3) == 0
    with waiting_worker("t.other"):
        time.sleep(WINDOW_S)
        q.enqueue("a worker of another queue waits")
        assert heard(0.3) == 0
    with waiting_worker("t.other", QUEUE):
        time.sleep(WINDOW_S)
        q.enqueue("a worker of this queue and another waits")
        assert heard(0.3) == 1


@notifies
def test_enqueue_that_found_no_waiter__asks_again_when_it_commits_past_two_windows(window, heard):
    # It looked before a worker started to wait, and committed later than
    # that worker's claim two windows after its flag: it sends a wake-up itself.
    with waiting_worker(QUEUE, waiting=False) as worker_id:
        with transaction.atomic(using=ALKSTORE_DB):
            store.queue(QUEUE).enqueue("looked while nobody waited")

            def starts_to_wait() -> None:  # on a connection of its own, committed at once
                presence.set_waiting(ALKSTORE_DB, worker_id, True)
                connections.close_all()

            flip = threading.Thread(target=starts_to_wait)
            flip.start()
            flip.join()
            time.sleep(2 * WINDOW_S)
            assert heard(0.1) == 0
        assert heard(0.3) == 1


def test_worker__waits_only_while_its_last_claim_drained_the_queue(window):
    # One slot, one job held: while the slow job runs and another waits in
    # the queue, the worker does not wait for wake-ups; once both ran it does.
    slow = store.queue("t.slow")
    with running_worker(["t.slow"], concurrency=1, batch=1, poll_interval_s=30) as worker:

        def flag() -> bool | None:
            row = LiveWorker.objects.using(ALKSTORE_DB).filter(worker_id=worker.worker_id)
            return row.values_list("waiting", flat=True).first()

        assert wait_for(lambda: flag() is True, timeout=5)
        first = slow.enqueue({"sleep_s": 1.0})
        second = slow.enqueue({"sleep_s": 0})
        if store.dialect.supports_listen_notify:
            assert wait_for(lambda: flag() is False, timeout=3)
        assert wait_for(lambda: Run.objects.filter(job_id=second).exists(), timeout=5)
        assert Run.objects.filter(job_id=first).exists()
        assert wait_for(lambda: flag() is True, timeout=5)


@notifies
def test_worker_that_starts_to_wait__runs_a_job_committed_by_a_producer_that_saw_it_busy(window):
    # The producer enqueues while the worker's one slot is busy (no wake-up:
    # nobody waits) and commits after the worker has started to wait. The
    # poll is 30 s away: the worker's claim a window after its flag, or the
    # wake-up the producer asks for at its commit, runs the job.
    slow = store.queue("t.slow")
    with running_worker(["t.slow"], concurrency=1, batch=1, poll_interval_s=30) as worker:
        time.sleep(0.3)
        slow.enqueue({"sleep_s": 0.3})
        assert wait_for(lambda: Run.objects.filter(queue="t.slow").exists(), timeout=5)
        with transaction.atomic(using=ALKSTORE_DB):
            late = slow.enqueue({"sleep_s": 0})
            assert wait_for(lambda: worker.stats.acked == 1, timeout=5)
            time.sleep(0.05)  # the worker found nothing and waits
        committed = time.monotonic()
        assert wait_for(lambda: Run.objects.filter(job_id=late).exists(), timeout=10)
        assert time.monotonic() - committed < WINDOW_S + 2
