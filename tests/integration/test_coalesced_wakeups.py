"""Queue wake-ups coalesced per process (``NOTIFY_COALESCE_S``), and no job left waiting on it.

Every commit that sends a notification takes PostgreSQL's one notification
lock, so an enqueue that follows a wake-up of the same process within the
window sends none; an idle worker claims again a window after each wake-up
it hears. The window is widened here so that the timings are not races.
"""

from __future__ import annotations

import contextlib
import time
from unittest import mock

import pytest
from django.db import transaction
from django.test import override_settings

from alkstore_django import store
from alkstore_django.notify import open_watcher
from alkstore_django.queues import channel_for
from tests.helpers import ALKSTORE_DB, ROUTING, postgres_only, running_worker, wait_for
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


@notifies
def test_enqueues_within_the_window__send_one_wake_up(window, heard):
    q = store.queue(QUEUE)
    for i in range(5):
        q.enqueue(i)
    assert heard(0.2) == 1
    time.sleep(WINDOW_S)
    q.enqueue("after the window")
    assert heard(0.2) == 1


@notifies
def test_no_window__every_enqueue_sends_its_wake_up(heard):
    with override_settings(ALKSTORE={**ROUTING, "NOTIFY_COALESCE_S": 0}):
        q = store.queue(QUEUE)
        for i in range(3):
            q.enqueue(i)
            heard_now = heard(0.1)
            assert heard_now == 1


@notifies
def test_quiet_enqueue_committed_past_the_window__sends_its_own_wake_up(window, heard):
    q = store.queue(QUEUE)
    q.enqueue("first")
    assert heard(0.1) == 1
    with transaction.atomic(using=ALKSTORE_DB):
        q.enqueue("quiet, in a long transaction")  # within the window of the first
        time.sleep(WINDOW_S)
        assert heard(0.1) == 0  # nothing is delivered before the commit
    assert heard(0.2) == 1


@notifies
def test_steady_enqueues__carry_their_wake_ups_in_the_statement():
    # A quiet enqueue that commits past the window sends a wake-up of its own,
    # a second statement: one was made at nearly every window's edge (19 in
    # 22 windows when this test was written). A quiet one is now made only
    # while it can still commit inside the window, so the wake-up rides the
    # next enqueue's statement.
    window_s = 0.005
    separate = 0
    real = store.dialect._wake

    def counted(channel: str) -> None:
        nonlocal separate
        separate += 1
        real(channel)

    q = store.queue(QUEUE)
    with (
        override_settings(ALKSTORE={**ROUTING, "NOTIFY_COALESCE_S": window_s}),
        mock.patch.object(store.dialect, "_wake", counted),
    ):
        started = time.monotonic()
        for i in range(300):
            q.enqueue(i)
        windows = (time.monotonic() - started) / window_s
    assert windows > 8  # enough windows for their edges to count
    assert separate <= windows / 4, (separate, windows)


@notifies
def test_rolled_back_enqueue__sends_nothing_and_records_no_wake_up(window, heard):
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
            assert worker.heard_at > 0  # the loop knows when to look again
        time.sleep(0.1)  # the worker has acked the first and gone idle
        second = q.enqueue("unannounced")
        started = time.monotonic()
        assert wait_for(lambda: Run.objects.filter(job_id=second).exists(), timeout=5)
        assert time.monotonic() - started < WINDOW_S + 2
