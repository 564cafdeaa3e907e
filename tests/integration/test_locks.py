"""Named leases: exclusivity, expiry takeover, absolute renew, release, fencing tokens."""

from __future__ import annotations

import subprocess
import textwrap
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.db.models.functions import Now

from alkstore_django import store
from alkstore_django.errors import InvalidArgument, InvalidName, LockNotAcquired, ReservedName
from alkstore_django.models import Lock
from tests.helpers import db_now

pytestmark = pytest.mark.django_db


def lapse_lock(name: str, seconds_ago: float = 1.0) -> None:
    """Put the lease of lock ``name`` in the past, against the database clock."""
    Lock.objects.filter(name=name).update(expires_at=Now() - timedelta(seconds=seconds_ago))


def test_try_lock__takes_a_free_lock_and_refuses_another_owner():
    held = store.try_lock("report", ttl_s=30, owner="a")

    assert held is not None
    assert (held.name, held.owner, held.fence) == ("report", "a", 1)
    assert 29 <= (held.expires_at - db_now()).total_seconds() <= 30
    assert store.try_lock("report", ttl_s=30, owner="b") is None
    row = Lock.objects.get(name="report")
    assert (row.owner, row.fence, row.expires_at) == ("a", 1, held.expires_at)


def test_try_lock__same_owner_again_renews_without_a_new_fence():
    first = store.try_lock("report", ttl_s=5, owner="a")
    again = store.try_lock("report", ttl_s=60, owner="a")

    assert again is not None
    assert again.fence == first.fence
    assert again.expires_at > first.expires_at
    assert Lock.objects.get(name="report").acquired_at <= first.expires_at


def test_try_lock__default_owner_is_unique_per_call():
    first = store.try_lock("report", ttl_s=30)

    assert first is not None
    assert store.try_lock("report", ttl_s=30) is None
    host, pid, token = first.owner.rsplit(":", 2)
    assert host and pid.isdigit() and len(token) == 16


def test_try_lock__takes_over_an_expired_lease_with_a_bigger_fence():
    old = store.try_lock("report", ttl_s=30, owner="a")
    lapse_lock("report")

    new = store.try_lock("report", ttl_s=30, owner="b")

    assert new is not None
    assert new.fence == old.fence + 1
    assert old.renew() is False
    assert old.release() is False
    assert Lock.objects.get(name="report").owner == "b"


def test_try_lock__own_expired_lease_is_a_new_lease():
    old = store.try_lock("report", ttl_s=30, owner="a")
    lapse_lock("report")

    again = store.try_lock("report", ttl_s=30, owner="a")

    assert again.fence == old.fence + 1
    assert old.renew() is False


def test_renew__resets_the_lease_absolutely():
    held = store.try_lock("report", ttl_s=60, owner="a")

    assert held.renew(ttl_s=5) is True

    left_s = (held.expires_at - db_now()).total_seconds()
    assert 4 <= left_s <= 5
    assert Lock.objects.get(name="report").expires_at == held.expires_at
    assert held.renew() is True  # the TTL it was taken with
    assert 59 <= (held.expires_at - db_now()).total_seconds() <= 60
    assert held.fence == 1


def test_release__frees_the_lock_at_once_and_only_once():
    held = store.try_lock("report", ttl_s=60, owner="a")

    assert held.release() is True
    assert held.release() is False
    assert held.renew() is False

    taken = store.try_lock("report", ttl_s=60, owner="b")
    assert taken is not None
    assert taken.fence == held.fence + 1


def test_fence__grows_at_every_change_of_hands_and_only_then():
    fences = []
    a = store.try_lock("report", ttl_s=60, owner="a")
    fences.append(a.fence)
    a.renew()
    fences.append(store.try_lock("report", ttl_s=60, owner="a").fence)
    a.release()
    b = store.try_lock("report", ttl_s=60, owner="b")
    fences.append(b.fence)
    lapse_lock("report")
    c = store.try_lock("report", ttl_s=60, owner="c")
    fences.append(c.fence)
    c.release()
    fences.append(store.try_lock("report", ttl_s=60, owner="a").fence)

    assert fences == [1, 1, 2, 3, 4]


def test_lock__holds_for_the_block_and_releases_after():
    with store.lock("report", ttl_s=60) as held:
        assert store.try_lock("report", ttl_s=60, owner="other") is None
        assert Lock.objects.get(name="report").owner == held.owner

    assert store.try_lock("report", ttl_s=60, owner="other") is not None


def test_lock__raises_when_another_owner_holds_it():
    store.try_lock("report", ttl_s=60, owner="a")

    with pytest.raises(LockNotAcquired, match="'report'"), store.lock("report", ttl_s=60):
        pass


def test_lock__releases_when_the_block_raises():
    with pytest.raises(RuntimeError), store.lock("report", ttl_s=60):
        raise RuntimeError("boom")

    assert store.try_lock("report", ttl_s=60, owner="other") is not None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": "", "ttl_s": 1}, InvalidName),
        ({"name": None, "ttl_s": 1}, InvalidName),
        ({"name": "__alkstore_scheduler", "ttl_s": 1}, ReservedName),
        ({"name": "x", "ttl_s": 0}, InvalidArgument),
        ({"name": "x", "ttl_s": -1}, InvalidArgument),
        ({"name": "x", "ttl_s": float("nan")}, InvalidArgument),
        ({"name": "x", "ttl_s": "10"}, InvalidArgument),
        ({"name": "x", "ttl_s": 1, "owner": ""}, InvalidArgument),
        ({"name": "x", "ttl_s": 1, "owner": "o" * 201}, InvalidArgument),
    ],
)
def test_try_lock__refuses_bad_arguments_before_any_query(kwargs, error, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(error):
        store.try_lock(**kwargs)


def test_renew__refuses_a_bad_ttl():
    held = store.try_lock("report", ttl_s=60)

    with pytest.raises(InvalidArgument, match="ttl_s"):
        held.renew(ttl_s=0)


@pytest.mark.django_db(transaction=True)
def test_try_lock__is_exclusive_under_concurrent_threads():
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    results = []

    def contend(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results.append(store.try_lock("contended", ttl_s=60, owner=f"thread-{i}"))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    winners = [held for held in results if held is not None]
    assert len(results) == threads_n
    assert len(winners) == 1
    assert Lock.objects.get(name="contended").owner == winners[0].owner
    assert winners[0].fence == 1


CONTENDER = textwrap.dedent(
    """
    import sys, time
    import django
    django.setup()
    from alkstore_django import store
    time.sleep(max(float(sys.argv[1]) - time.time(), 0))
    held = store.try_lock("contended", ttl_s=60, owner=sys.argv[2])
    print("won" if held else "lost", flush=True)
    """
)


@pytest.mark.django_db(transaction=True)
def test_try_lock__is_exclusive_under_concurrent_processes(subprocess_env, python):
    start_at = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [python, "-c", CONTENDER, str(start_at), f"process-{i}"],
            env=subprocess_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outcomes.append(out.strip())

    assert sorted(outcomes) == ["lost"] * 5 + ["won"]
    owner = Lock.objects.get(name="contended").owner
    assert outcomes[int(owner.split("-")[1])] == "won"


def test_closed_store__refuses_locks_schedules_and_outboxes(django_assert_num_queries):
    from alkstore_django import Store
    from alkstore_django.errors import StoreClosed

    closed = Store()
    held = closed.try_lock("report", ttl_s=60)
    closed.close()

    with django_assert_num_queries(0):
        for call in (
            lambda: closed.try_lock("report", ttl_s=60),
            held.renew,
            held.release,
            lambda: closed.schedule("beat", "@every 1s", "beats"),
            lambda: closed.unschedule("beat"),
            lambda: closed.outbox("webhooks"),
            lambda: closed.run_schedules(threading.Event()),
        ):
            with pytest.raises(StoreClosed):
                call()
