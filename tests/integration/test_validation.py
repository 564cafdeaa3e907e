"""Bad input: the named error, a message naming the value, and nothing written."""

from __future__ import annotations

import math
from datetime import datetime

import pytest
from django.test import override_settings

from alkstore_django import store
from alkstore_django.errors import (
    AlkstoreError,
    InvalidArgument,
    InvalidName,
    PayloadError,
    ReservedName,
)
from tests.helpers import ROUTING, dead_count, live_count

pytestmark = pytest.mark.django_db


@pytest.fixture
def nothing_written():
    yield
    assert (live_count(), dead_count()) == (0, 0)


@pytest.mark.parametrize(
    ("name", "error", "shown"),
    [
        ("", InvalidName, "''"),
        (None, InvalidName, "None"),
        (42, InvalidName, "42"),
        (b"bytes", InvalidName, "b'bytes'"),
        (["a", "list"], InvalidName, "['a', 'list']"),
        ("x" * 201, InvalidName, "201 characters"),
        ("nul\x00", InvalidName, "'nul\\x00'"),
        ("__alkstore", ReservedName, "'__alkstore'"),
        ("__alkstore_outbox:mail", ReservedName, "'__alkstore_outbox:mail'"),
    ],
)
def test_queue__refuses_a_bad_name(name, error, shown, nothing_written):
    with pytest.raises(error) as info:
        store.queue(name)
    assert shown in str(info.value)
    assert isinstance(info.value, AlkstoreError)


def test_queue__accepts_a_name_of_exactly_200_characters_and_odd_characters():
    for name in ("é" * 200, "with 'quotes' and spaces", "日本語", "_alkstore_not_reserved"):
        q = store.queue(name)
        job_id = q.enqueue({})
        assert q.claim_one("w").job.id == job_id


@pytest.mark.parametrize(
    ("opts", "shown"),
    [
        ({"visibility_timeout_s": 0}, "visibility_timeout_s 0"),
        ({"visibility_timeout_s": -1}, "visibility_timeout_s -1"),
        ({"visibility_timeout_s": math.nan}, "visibility_timeout_s nan"),
        ({"max_attempts": 0}, "max_attempts 0"),
        ({"max_attempts": 2.0}, "max_attempts 2.0"),
        ({"max_attempts": True}, "max_attempts True"),
        ({"retry_base_s": -5}, "retry_base_s -5"),
        ({"priority": 1.5}, "priority 1.5"),
        ({"priority": 2**31}, "priority 2147483648"),
        ({"expires_s": 0}, "expires_s 0"),
        ({"dead_letter_retention_s": math.inf}, "dead_letter_retention_s inf"),
        ({"visibilty_timeout_s": 5}, "'visibilty_timeout_s'"),
    ],
)
def test_queue__refuses_bad_options(opts, shown):
    with pytest.raises(InvalidArgument) as info:
        store.queue("opts", **opts)
    assert shown in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"delay_s": -1}, "delay_s -1"),
        ({"delay_s": math.nan}, "delay_s nan"),
        ({"delay_s": math.inf}, "delay_s inf"),
        ({"delay_s": "5"}, "delay_s '5'"),
        ({"delay_s": True}, "delay_s True"),
        ({"delay_s": 10**400}, "delay_s 1000"),
        ({"delay_s": 100 * 365 * 86_400 + 1}, "delay_s 3153600001"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at datetime.datetime(2030, 1, 1, 0, 0)"),
        ({"run_at": "2030-01-01T00:00:00Z"}, "run_at '2030-01-01T00:00:00Z'"),
        ({"expires_s": -3}, "expires_s -3"),
        ({"expires_s": 0}, "expires_s 0"),
        ({"max_attempts": 0}, "max_attempts 0"),
        ({"max_attempts": -2}, "max_attempts -2"),
        ({"max_attempts": 3.0}, "max_attempts 3.0"),
        ({"max_attempts": False}, "max_attempts False"),
        ({"priority": 1.0}, "priority 1.0"),
        ({"priority": "high"}, "priority 'high'"),
    ],
)
def test_enqueue__refuses_bad_arguments_and_writes_nothing(kwargs, shown, nothing_written):
    q = store.queue("bad")
    with pytest.raises(InvalidArgument) as info:
        q.enqueue({"ok": True}, **kwargs)
    assert shown in str(info.value)
    with pytest.raises(InvalidArgument):
        q.enqueue_many([1, 2, 3], **kwargs)


@pytest.mark.parametrize(
    ("payload", "shown"),
    [
        ({1, 2}, "{1, 2}"),
        (object, "<class 'object'>"),
        ({"x": math.nan}, "{'x': nan}"),
        ([math.inf], "[inf]"),
        (b"raw", "b'raw'"),
        ({"t": datetime(2030, 1, 1)}, "datetime.datetime(2030, 1, 1, 0, 0)"),
        ("nul\x00char", "U+0000"),
    ],
)
def test_enqueue__refuses_a_payload_that_is_not_json(payload, shown, nothing_written):
    with pytest.raises(PayloadError) as info:
        store.queue("bad").enqueue(payload)
    assert shown in str(info.value)


def test_enqueue_many__one_bad_payload_refuses_the_whole_batch(nothing_written):
    with pytest.raises(PayloadError):
        store.queue("bad").enqueue_many([{"ok": 1}, {"ok": 2}, {"bad": math.nan}])


@override_settings(ALKSTORE={**ROUTING, "MAX_PAYLOAD_BYTES": 100})
def test_enqueue__refuses_a_payload_over_the_size_limit(nothing_written):
    q = store.queue("bad")
    with pytest.raises(PayloadError) as info:
        q.enqueue("x" * 99)  # 101 bytes once quoted
    assert "101 bytes" in str(info.value) and "(100)" in str(info.value)


@override_settings(ALKSTORE={**ROUTING, "MAX_PAYLOAD_BYTES": 100})
def test_enqueue__accepts_a_payload_of_exactly_the_size_limit():
    job_id = store.queue("edge").enqueue("x" * 98)
    assert store.get_job(job_id).payload == "x" * 98


def test_enqueue__follows_the_size_limit_into_and_out_of_override_settings():
    # Settings are read at each call, never kept: the limit follows the override
    # in and back out.
    q = store.queue("limits")
    q.enqueue("x" * 20)
    with (
        override_settings(ALKSTORE={**ROUTING, "MAX_PAYLOAD_BYTES": 10}),
        pytest.raises(PayloadError, match=r"\(10\)"),
    ):
        q.enqueue("x" * 20)
    q.enqueue("x" * 20)
    assert live_count() == 2


@override_settings(ALKSTORE={**ROUTING, "MAX_PAYLOAD_BYTES": 10})
def test_enqueue__counts_the_size_in_utf8_bytes(nothing_written):
    with pytest.raises(PayloadError, match="14 bytes"):
        store.queue("bad").enqueue("éééééé")


@pytest.mark.parametrize("payloads", ["abc", b"abc", {"a": 1}])
def test_enqueue_many__refuses_a_single_value_where_a_list_is_expected(payloads, nothing_written):
    with pytest.raises(InvalidArgument, match="expected a list of payloads"):
        store.queue("bad").enqueue_many(payloads)


@pytest.mark.parametrize("worker_id", ["", None, 7, "w" * 201])
def test_claim__refuses_a_bad_worker_id(worker_id):
    q = store.queue("bad")
    job_id = q.enqueue({})
    with pytest.raises(InvalidArgument) as info:
        q.claim_one(worker_id)
    assert repr(worker_id)[:20] in str(info.value)
    with pytest.raises(InvalidArgument):
        q.claim_batch(worker_id, 5)
    assert store.get_job(job_id).state == "pending"


@pytest.mark.parametrize("n", [1.0, "3", True, None, 10_001])
def test_claim_batch__refuses_a_bad_count(n):
    q = store.queue("bad")
    job_id = q.enqueue({})
    with pytest.raises(InvalidArgument, match=f"n {n!r}"):
        q.claim_batch("w", n)
    assert store.get_job(job_id).attempts == 0


@pytest.mark.parametrize(
    ("call", "shown"),
    [
        (lambda h: h.heartbeat(0), "extend_s 0"),
        (lambda h: h.heartbeat(-1), "extend_s -1"),
        (lambda h: h.heartbeat(math.nan), "extend_s nan"),
        (lambda h: h.retry(delay_s=-1), "delay_s -1"),
        (lambda h: h.retry(delay_s=math.inf), "delay_s inf"),
    ],
)
def test_handle__refuses_bad_durations_and_changes_nothing(call, shown):
    q = store.queue("bad")
    q.enqueue({})
    handle = q.claim_one("w")
    before = store.get_job(handle.job.id)
    with pytest.raises(InvalidArgument) as info:
        call(handle)
    assert shown in str(info.value)
    assert store.get_job(handle.job.id) == before
    assert handle.spent is False and handle.ack() is True


@pytest.mark.parametrize("ids", [["1"], [1.0], [True], [None]])
def test_ack_batch__refuses_ids_that_are_not_integers(ids):
    with pytest.raises(InvalidArgument):
        store.queue("bad").ack_batch(ids)


@pytest.mark.parametrize("job_id", ["1", 1.5, None])
def test_cancel__refuses_an_id_that_is_not_an_integer(job_id):
    with pytest.raises(InvalidArgument, match=f"job id {job_id!r}"):
        store.queue("bad").cancel(job_id)


@pytest.mark.parametrize("job_id", ["1", 1.5, None])
def test_get_job__refuses_an_id_that_is_not_an_integer(job_id):
    with pytest.raises(InvalidArgument, match=f"job id {job_id!r}"):
        store.get_job(job_id)


def test_enqueue__refuses_a_naive_run_at_even_when_delay_s_wins(nothing_written):
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        store.queue("bad").enqueue({}, delay_s=5, run_at=datetime(2030, 1, 1))


@pytest.mark.parametrize("payloads", [None, 5, 1.5])
def test_enqueue_many__refuses_payloads_that_are_not_a_collection(payloads, nothing_written):
    with pytest.raises(InvalidArgument, match=f"type {type(payloads).__name__}"):
        store.queue("bad").enqueue_many(payloads)
