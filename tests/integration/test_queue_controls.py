"""Queue controls at the claim: pause and resume, max_running, rate (every engine)."""

from __future__ import annotations

import time

import pytest

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from tests.helpers import ROUTING, lapse_claim

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def limited(settings):
    """Return ``limit(queue, **keys)``: set ``ALKSTORE['QUEUES'][queue]`` for this test."""

    def limit(queue: str, **keys: object) -> None:
        settings.ALKSTORE = {**ROUTING, **settings.ALKSTORE, "QUEUES": {queue: keys}}

    return limit


def test_a_paused_queue__claims_nothing_and_still_takes_enqueues():
    q = store.queue("ctl.pause")
    first = q.enqueue("a")
    assert q.pause() is True
    assert q.is_paused() is True
    assert q.pause() is False  # already paused
    second = q.enqueue("b")
    assert q.claim_batch("w", 10) == []
    assert {store.get_job(i).state for i in (first, second)} == {"pending"}
    assert store.queue("ctl.other").is_paused() is False


def test_resume__lets_the_claim_hand_out_the_jobs_again():
    q = store.queue("ctl.pause")
    ids = q.enqueue_many(["a", "b"])
    q.pause()
    assert q.resume() is True
    assert q.resume() is False  # not paused
    assert sorted(h.job.id for h in q.claim_batch("w", 10)) == ids


def test_a_paused_queue__revives_lapsed_claims_without_handing_them_out():
    q = store.queue("ctl.pause")
    job_id = q.enqueue("a")
    q.claim_one("w")
    lapse_claim(job_id)
    q.pause()
    assert q.claim_one("w2") is None
    assert store.get_job(job_id).state == "pending"
    q.resume()
    assert q.claim_one("w2").job.id == job_id


def test_running_jobs_of_a_paused_queue__still_ack():
    q = store.queue("ctl.pause")
    q.enqueue("a")
    handle = q.claim_one("w")
    q.pause()
    assert handle.ack() is True


def test_max_running__caps_live_claims_across_claimants(limited):
    limited("ctl.max", max_running=2)
    q = store.queue("ctl.max")
    q.enqueue_many(list(range(5)))
    first = q.claim_batch("w1", 10)
    assert len(first) == 2
    assert q.claim_batch("w2", 10) == []
    _, handles, hold_s = q.ack_and_claim("w2", 10)
    assert (handles, hold_s) == ([], 0.0)
    assert first[0].ack() is True
    assert len(q.claim_batch("w2", 10)) == 1


def test_max_running__an_ack_riding_the_claim_frees_its_place(limited):
    limited("ctl.max", max_running=1)
    q = store.queue("ctl.max")
    q.enqueue_many([1, 2])
    (held,) = q.claim_batch("w", 5)
    acked, handles, _ = q.ack_and_claim("w", 5, [(held.job.id, held.job.generation)])
    assert acked == {held.job.id}
    assert len(handles) == 1


def test_max_running__lapsed_claims_do_not_count(limited):
    limited("ctl.max", max_running=1)
    q = store.queue("ctl.max")
    q.enqueue_many([1, 2])
    (held,) = q.claim_batch("w", 5)
    lapse_claim(held.job.id)
    # The lapsed job comes back claimable and the place it held is free.
    assert len(q.claim_batch("w2", 5)) == 1


def test_max_running__a_drained_queue_is_not_held(limited):
    limited("ctl.max", max_running=5)
    q = store.queue("ctl.max")
    q.enqueue("a")
    _, handles, hold_s = q.ack_and_claim("w", 10)
    assert (len(handles), hold_s) == (1, None)


def test_rate__allows_n_starts_per_window_then_holds_until_it_closes(limited):
    limited("ctl.rate", rate="3/s")
    q = store.queue("ctl.rate")
    q.enqueue_many(list(range(8)))
    started = time.monotonic()
    _, handles, hold_s = q.ack_and_claim("w", 10)
    assert len(handles) == 3
    assert 0 < hold_s <= 1.0
    _, more, _ = q.ack_and_claim("w", 10)
    if time.monotonic() - started < 0.9:  # still inside the window
        assert more == []
    time.sleep(hold_s + 0.05)
    _, later, _ = q.ack_and_claim("w", 10)
    assert len(later) + len(more) == 3
    # Released and retried jobs wait for the rate without spending attempts.
    assert all(h.job.attempts == 1 for h in [*handles, *more, *later])


def test_rate_and_max_running__the_tighter_one_wins(limited):
    limited("ctl.both", rate="10/h", max_running=2)
    q = store.queue("ctl.both")
    q.enqueue_many(list(range(20)))
    assert len(q.claim_batch("w", 20)) == 2
    assert q.claim_batch("w", 20) == []


def test_a_paused_limited_queue__claims_nothing(limited):
    limited("ctl.max", max_running=3)
    q = store.queue("ctl.max")
    q.enqueue("a")
    q.pause()
    assert q.ack_and_claim("w", 5) == (set(), [], None)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"max_running": 0}, "Invalid max_running 0"),
        ({"max_running": "2"}, "Invalid max_running '2'"),
        ({"rate": "100/d"}, "Invalid rate '100/d'"),
        ({"rate": "0/s"}, "Invalid rate '0/s'"),
        ({"rate": 5}, "Invalid rate 5"),
    ],
)
def test_bad_limits__are_refused_by_name_before_any_claim(limited, keys, message):
    limited("ctl.bad", **keys)
    with pytest.raises(InvalidArgument, match=message):
        store.queue("ctl.bad")


def test_limits_are_settings_only__not_a_queue_handle_option():
    with pytest.raises(InvalidArgument, match="Unknown queue option 'max_running'"):
        store.queue("ctl.max", max_running=2)
