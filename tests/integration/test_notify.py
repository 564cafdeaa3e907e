"""Wake-ups: delivered on commit, never on rollback, over a second connection.

PostgreSQL delivers ``NOTIFY`` to a ``LISTEN`` connection. SQLite has no
NOTIFY, so ``store.notify`` writes a ``ChannelMessage`` row and a queue's
wake-up is the file's ``PRAGMA data_version`` changing; MariaDB/MySQL write
the same rows and wake a queue's watcher by polling its claimable rows. The
``wait()`` and ``store.listen`` tests run on every engine; each engine's own
mechanism is pinned by a test of its own.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from alkstore_django import notify, store
from alkstore_django.models import Job
from alkstore_django.notify import HALT_CHECK_S, QueueWatch, open_watcher, watch_queues
from alkstore_django.queues import channel_for
from tests.helpers import ALKSTORE_DB, alkstore_connection, mysql_only, needs, waiting_worker

pytestmark = pytest.mark.django_db(transaction=True)

QUIET_S = 0.3
WAIT_S = 5.0


@pytest.fixture
def queue_watcher():
    # Producers wake only a waiting worker; its row is written before the
    # watch starts (SQLite's watcher wakes on any commit).
    with waiting_worker("woken"):
        watcher = open_watcher(store, [channel_for("woken")], queues=["woken"])
        yield watcher
        watcher.close()


@needs("supports_listen_notify", "its wake-up is polled, not a message (wait() tests below)")
def test_enqueue__notifies_the_queue_channel_only_on_commit(queue_watcher):
    q = store.queue("woken")
    assert queue_watcher.receive(0) == []
    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        q.enqueue({})
        raise RuntimeError("rollback")
    assert queue_watcher.receive(QUIET_S) == []
    with transaction.atomic(using=ALKSTORE_DB):
        q.enqueue({})
        # Not yet: the notification travels with the commit.
        assert queue_watcher.receive(QUIET_S) == []
    assert queue_watcher.receive(WAIT_S) == [(channel_for("woken"), "")]


@needs("supports_listen_notify", "its wake-up is polled, not a message (wait() tests below)")
def test_enqueue__outside_a_transaction_notifies_at_once(queue_watcher):
    store.queue("woken").enqueue_many([1, 2, 3])
    assert queue_watcher.receive(WAIT_S) == [(channel_for("woken"), "")]


@needs("supports_listen_notify", "its wake-up is polled, not a message (wait() tests below)")
def test_enqueue__on_another_queue_does_not_notify(queue_watcher):
    store.queue("elsewhere").enqueue({})
    assert queue_watcher.receive(QUIET_S) == []


def test_enqueue__wakes_the_queue_watcher_only_on_commit(queue_watcher):
    q = store.queue("woken")
    connection.ensure_connection()
    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        q.enqueue({})
        raise RuntimeError("rollback")
    assert queue_watcher.wait(QUIET_S) is False
    with transaction.atomic(using=ALKSTORE_DB):
        q.enqueue({})
        assert queue_watcher.wait(QUIET_S) is False
    assert queue_watcher.wait(WAIT_S) is True


@mysql_only("the ready probe: PostgreSQL's sibling is the channel test above")
def test_enqueue__on_another_queue_does_not_wake_the_probe(queue_watcher):
    store.queue("elsewhere").enqueue({})
    assert queue_watcher.wait(QUIET_S) is False


@mysql_only("the ready probe sees a delayed job become due; elsewhere the worker's timer does")
def test_delayed_job__wakes_the_probe_once_due(queue_watcher):
    job_id = store.queue("woken").enqueue({}, delay_s=3600)
    assert queue_watcher.wait(QUIET_S) is False
    Job.objects.filter(id=job_id).update(run_at=Now())
    assert queue_watcher.wait(WAIT_S) is True


def test_listen__receives_a_notify_sent_on_commit():
    listener = store.listen(["odd 'chan' ✓"], WAIT_S)
    with transaction.atomic(using=ALKSTORE_DB):
        store.notify("odd 'chan' ✓", "hello")
    note = next(listener)
    assert (note.channel, note.payload) == ("odd 'chan' ✓", "hello")
    listener.close()


@needs("supports_listen_notify", "its watcher polls the table, it reads no messages")
def test_watcher__reads_each_notification_once_and_hears_again_after_its_backend_is_cut():
    # After its first read the watcher reads libpq's notifications itself,
    # not through psycopg's notifies() (dialects/postgresql/watch.py).
    channel = channel_for("wé")
    watcher = open_watcher(store, [channel])

    def send(payload: str) -> None:
        # On alkstore's database: a notification reaches listeners of its own database only.
        with alkstore_connection().cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])

    def heard(count: int) -> list[tuple[str, str]]:
        got: list[tuple[str, str]] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < count and time.monotonic() < deadline:
            got += watcher.receive(0.2)
        return got

    try:
        send("first")
        assert heard(1) == [(channel, "first")]
        for payload in ("a", "b", "ç ✓"):
            send(payload)
        assert heard(3) == [(channel, "a"), (channel, "b"), (channel, "ç ✓")]
        assert watcher.receive(QUIET_S) == []
        with alkstore_connection().cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [watcher._conn.info.backend_pid])
        # The loss is seen; the reconnect reports a wake-up, since what was
        # sent meanwhile is lost, and the new session hears again.
        assert heard(1) == [("", "")]
        send("after")
        assert heard(1) == [(channel, "after")]
    finally:
        watcher.close()


def test_listen__does_not_receive_a_rolled_back_notify():
    listener = store.listen(["events"], QUIET_S)
    with pytest.raises(RuntimeError), transaction.atomic(using=ALKSTORE_DB):
        store.notify("events", "lost")
        raise RuntimeError("rollback")
    assert list(listener) == []


def test_listen__ignores_other_channels_and_handles_long_names():
    long_name = "x" * 200
    listener = store.listen([long_name], WAIT_S)
    store.notify("unrelated", "no")
    store.notify(long_name, "yes")
    note = next(listener)
    assert (note.channel, note.payload) == (long_name, "yes")
    listener.close()


def test_channel_for__fits_postgres_identifiers_for_any_name():
    names = ["a", "x" * 200, "é" * 200, "quote\"d'", "sp ace", "__alkstore_outbox:x"]
    channels = {channel_for(name) for name in names}
    assert len(channels) == len(names)
    assert all(len(c.encode()) <= 63 and c.isascii() and c.isidentifier() for c in channels)


def test_watch_queues__stops_within_a_tenth_of_a_second_of_its_halt():
    # A stopping worker joins this thread: a --burst drain used to exit up to a
    # second after its last ack while the watcher finished a one-second wait.
    wake, halt, controls = threading.Event(), threading.Event(), threading.Event()
    thread = threading.Thread(
        target=watch_queues,
        args=(QueueWatch(store, [store.queue("woken")], wake, controls), halt),
        daemon=True,
    )
    thread.start()
    time.sleep(0.3)  # the watcher is inside a wait
    halted = time.monotonic()
    halt.set()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - halted < HALT_CHECK_S + 0.3


def test_watch_queues__once_a_failed_watcher_is_back__the_worker_looks_at_once(monkeypatch):
    # Whatever was sent while the watcher was down is lost: without this the
    # worker would find the jobs, the pauses and the cancels only at its poll.
    opened = []

    def first_one_breaks(*args, **kwargs):
        watcher = open_watcher(*args, **kwargs)
        if not opened:

            def broken(timeout_s):
                raise RuntimeError("the watcher broke")

            watcher.wait_for_payloads = broken
        opened.append(watcher)
        return watcher

    monkeypatch.setattr(notify, "open_watcher", first_one_breaks)
    wake, halt, controls, cancels = (threading.Event() for _ in range(4))
    thread = threading.Thread(
        target=watch_queues,
        args=(QueueWatch(store, [store.queue("woken")], wake, controls, cancels), halt),
        daemon=True,
    )
    thread.start()
    try:
        assert wake.wait(5)
        assert len(opened) == 2
        assert controls.is_set() and cancels.is_set()
    finally:
        halt.set()
        thread.join(5)
