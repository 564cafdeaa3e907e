"""``max_running_per_key``: one claim at a time, read against the database, on every engine.

The claims here are the API's own (``claim_batch``), so each test sees
exactly what one claim round hands out; the limit under real worker
processes is in ``tests/concurrency/test_per_key_limits.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.core import checks
from django.test import override_settings

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from alkstore_django.models import Job, QueueControl
from alkstore_django.records import UNKEYED
from alkstore_django.worker.upkeep import adopt_unkeyed
from tests.helpers import ROUTING

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "t.keyed"


def keyed(per_key: int = 2, **more: object) -> override_settings:
    return override_settings(
        ALKSTORE={**ROUTING, "QUEUES": {QUEUE: {"max_running_per_key": per_key, **more}}}
    )


def keys_of(handles) -> list[str | None]:
    return [handle.job.concurrency_key for handle in handles]


def test_a_key_at_its_limit__is_not_claimed_past_and_its_jobs_wait():
    with keyed(2):
        q = store.queue(QUEUE)
        q.enqueue_many([{"n": i} for i in range(5)], concurrency_key="customer:7")
        first = q.claim_batch("w1", 10)
        assert keys_of(first) == ["customer:7"] * 2
        _, more, hold_s = q.ack_and_claim("w1", 10)
        assert more == [] and hold_s == 0.0  # held until one of the two finishes
        assert first[0].ack() is True
        assert keys_of(q.claim_batch("w2", 10)) == ["customer:7"]
        assert Job.objects.filter(queue=QUEUE, state="processing").count() == 2


def test_a_single_job_of_a_new_key__is_claimed_in_the_first_round_behind_10000_of_another():
    with keyed(2):
        q = store.queue(QUEUE)
        q.enqueue_many([{"n": i} for i in range(10_000)], concurrency_key="big")
        small = q.enqueue({"n": "small"}, concurrency_key="small")
        # Enqueued last, due last: in plain claim order it is the 10,001st job.
        claimed = q.claim_batch("w1", 2)
        assert small in [handle.job.id for handle in claimed]
        assert sorted(keys_of(claimed)) == ["big", "small"]


def test_keys_take_turns__one_job_a_claim_goes_round_every_key():
    with keyed(10):
        q = store.queue(QUEUE)
        for key in ("a", "b", "c"):
            q.enqueue_many([{"k": key}] * 4, concurrency_key=key)
        order = []
        for _ in range(9):
            (handle,) = q.claim_batch("w", 1)
            order.append(handle.job.concurrency_key)
            assert handle.ack() is True
        assert order == ["a", "b", "c"] * 3


def test_a_claim_of_many__takes_every_keys_first_job_before_any_second():
    with keyed(3):
        q = store.queue(QUEUE)
        for key in ("a", "b", "c", "d"):
            q.enqueue_many([{"k": key}] * 5, concurrency_key=key)
        counts = Counter(keys_of(q.claim_batch("w", 6)))
        assert sorted(counts.values()) == [1, 1, 2, 2]
        counts += Counter(keys_of(q.claim_batch("w", 100)))
        assert counts == {"a": 3, "b": 3, "c": 3, "d": 3}  # the limit, and no more


def test_jobs_without_a_key__are_not_limited_and_take_their_turn():
    with keyed(1):
        q = store.queue(QUEUE)
        q.enqueue_many([{"free": i} for i in range(5)])
        q.enqueue_many([{"k": 1}] * 3, concurrency_key="k")
        claimed = keys_of(q.claim_batch("w", 100))
        assert Counter(claimed) == {None: 5, "k": 1}


def test_priority__decides_within_a_turn():
    with keyed(5):
        q = store.queue(QUEUE)
        q.enqueue({"k": "a"}, concurrency_key="a")
        urgent = q.enqueue({"k": "b"}, concurrency_key="b", priority=9)
        (handle,) = q.claim_batch("w", 1)
        assert handle.job.id == urgent


def test_a_lapsed_claim__does_not_count_against_its_key(django_db_blocker):
    with keyed(1, visibility_timeout_s=0.2):
        q = store.queue(QUEUE)
        q.enqueue_many([{"k": 1}] * 2, concurrency_key="k")
        (first,) = q.claim_batch("w1", 5)
        import time

        time.sleep(0.4)  # the database clock passes the claim deadline
        claimed = q.claim_batch("w2", 5)
        # The lapsed job came back and competes again; still one at a time.
        assert keys_of(claimed) == ["k"]
        assert first.ack() is False


def test_the_cursor__is_kept_on_the_control_row_and_a_paused_queue_claims_nothing():
    with keyed(1):
        q = store.queue(QUEUE)
        for key in ("a", "b"):
            q.enqueue({"k": key}, concurrency_key=key)
        (handle,) = q.claim_batch("w", 1)
        assert QueueControl.objects.get(queue=QUEUE).key_cursor == handle.job.concurrency_key
        assert q.pause() is True
        assert q.claim_batch("w", 5) == []


def test_a_key_on_a_queue_without_the_limit__is_stored_and_not_limiting():
    q = store.queue("t.unkeyed")
    q.enqueue_many([{"n": i} for i in range(3)], concurrency_key="c")
    assert keys_of(q.claim_batch("w", 10)) == ["c", "c", "c"]


@pytest.mark.parametrize("bad", ["", "x" * 201, 7, "a\x00b"])
def test_a_bad_concurrency_key__is_refused_by_name_and_nothing_is_written(bad):
    with pytest.raises(InvalidArgument, match="Invalid concurrency_key"):
        store.queue(QUEUE).enqueue({}, concurrency_key=bad)
    with pytest.raises(InvalidArgument, match="Invalid concurrency_key"):
        store.queue(QUEUE).enqueue_many([{}], concurrency_key=bad)
    assert not Job.objects.exists()


# Every alias: the system checks Django runs here ask each SQLite database about JSON.
@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
@pytest.mark.parametrize("bad", [0, -1, "2", 1.5, True])
def test_a_bad_max_running_per_key__is_a_named_error_and_a_system_check(bad):
    with override_settings(ALKSTORE={**ROUTING, "QUEUES": {QUEUE: {"max_running_per_key": bad}}}):
        with pytest.raises(InvalidArgument, match="max_running_per_key"):
            store.queue(QUEUE)
        found = [m for m in checks.run_checks() if m.id == "alkstore.E013"]
        assert len(found) == 1 and "max_running_per_key" in found[0].msg


def test_a_job_without_a_key__is_stored_unkeyed_and_shows_none():
    with keyed(1):
        q = store.queue(QUEUE)
        job_id = q.enqueue({"free": 1})
        assert Job.objects.get(id=job_id).concurrency_key == UNKEYED  # in alk_job_key
        assert store.get_job(job_id).concurrency_key is None
        (handle,) = q.claim_batch("w", 5)
        assert handle.job.concurrency_key is None


def test_a_job_left_with_no_key__is_adopted_by_the_upkeep_and_then_claimed():
    # Enqueued before the queue had the limit: no key at all.
    job_id = store.queue(QUEUE).enqueue({"early": 1})
    with keyed(1):
        q = store.queue(QUEUE)
        assert q.claim_batch("w", 5) == []  # the keyed claim reads alk_job_key only
        adopt_unkeyed(store, [q])
        assert [handle.job.id for handle in q.claim_batch("w", 5)] == [job_id]
