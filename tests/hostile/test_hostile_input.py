"""Hostile input through the public API and the commands.

Names with quotes, spaces, unicode, SQL fragments, lone surrogates and 10,000
characters; payloads with NaN, huge numbers, deep nesting and 10 MB strings;
absurd delays and TTLs. Every call either raises a named error
(``alkstore_django.errors.*``) and writes nothing, or succeeds and reads back
exactly what it was given. The property tests are deterministic and bounded
(``derandomize=True``, no example database written into the repository).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command
from hypothesis import given
from hypothesis import strategies as st

from alkstore_django import store
from alkstore_django.errors import AlkstoreError, InvalidArgument, InvalidName, PayloadError
from alkstore_django.models import DeadJob, Job, Lock, Schedule
from alkstore_django.validation import MAX_DURATION_S
from tests.helpers import BOUNDED, HOSTILE_NAMES, SQL_INJECTION

pytestmark = pytest.mark.django_db

TOO_LONG = "x" * 10_000


def written() -> tuple[int, int, int, int]:
    return (
        Job.objects.count(),
        DeadJob.objects.count(),
        Schedule.objects.count(),
        Lock.objects.count(),
    )


# --- names --------------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_queue_name__round_trips_through_enqueue_claim_and_ack(name):
    queue = store.queue(name)
    job_id = queue.enqueue({"name": name})
    assert store.get_job(job_id).queue == name
    handle = queue.claim_one(name)  # as a worker id too
    assert (handle.job.id, handle.job.queue, handle.job.worker_id) == (job_id, name, name)
    assert handle.job.payload == {"name": name}
    assert handle.ack()
    assert queue.stats().pending == 0


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_names__round_trip_as_lock_and_schedule_names(name):
    held = store.try_lock(name, ttl_s=30, owner=name)
    assert (held.name, held.owner) == (name, name)
    assert Lock.objects.get(name=name).owner == name
    assert store.try_lock(name, ttl_s=30) is None
    assert held.release()
    schedule = store.schedule(name, "@every 1h", name, {"name": name})
    assert (schedule.name, schedule.queue, schedule.payload) == (name, name, {"name": name})
    assert store.unschedule(name)


@pytest.mark.parametrize(
    "name", [TOO_LONG, "", "\x00", "nul\x00inside", "\ud800", "lone \udfff", None, 7, b"bytes"]
)
def test_unusable_names__are_refused_by_every_entry_point_and_nothing_is_written(name):
    before = written()
    calls = [
        lambda: store.queue(name),
        lambda: store.outbox(name),
        lambda: store.try_lock(name, ttl_s=1),
        lambda: store.schedule(name, "@every 1s", "q"),
        lambda: store.schedule("s", "@every 1s", name),
        lambda: store.notify(name),
        lambda: store.listen([name], 0),
        lambda: store.unschedule(name),
    ]
    for call in calls:
        with pytest.raises(InvalidName):
            call()
    assert written() == before


@pytest.mark.parametrize("worker_id", ["", TOO_LONG, "\ud800", None, 3])
def test_unusable_worker_ids_and_owners__are_refused(worker_id):
    store.queue("q").enqueue(1)
    with pytest.raises(InvalidArgument):
        store.queue("q").claim_one(worker_id)
    if worker_id is not None:
        with pytest.raises(InvalidArgument):
            store.try_lock("lock", ttl_s=1, owner=worker_id)
    assert Job.objects.get().state == "pending"
    assert not Lock.objects.exists()


# --- payloads -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        10**100,
        -(2**200),
        2**63,
        1e300,
        -1.7976931348623157e308,
        1e23,
        5e-324,
        -0.0,
        {"nested": [[[[[[[[[[{"deep": True}]]]]]]]]]]},
        {"quote'\"": "'; DROP TABLE x; --", "ü": "🚀", "e+": "1e+300"},
        "a literal backslash-u escape: \\u0000",
        [None, True, False, "", [], {}],
    ],
    ids=repr,
)
def test_awkward_payloads__round_trip_exactly(payload):
    queue = store.queue("payloads")
    job_id = queue.enqueue(payload)
    assert store.get_job(job_id).payload == payload
    handle = queue.claim_one("w")
    assert handle.job.payload == payload
    assert type(handle.job.payload) is type(payload)


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "payload",
    [
        math.nan,
        math.inf,
        {"x": -math.inf},
        {1, 2},
        b"bytes",
        object(),
        "nul \x00 inside",
        {"lone": "\ud800"},
        {"\udfff": 1},
        10**5000,  # more digits than Python will turn into text
        nested(100_000),
    ],
    ids=lambda p: type(p).__name__,
)
def test_unstorable_payloads__raise_payload_error_and_write_nothing(payload):
    before = written()
    with pytest.raises(PayloadError):
        store.queue("payloads").enqueue(payload)
    with pytest.raises(PayloadError):
        store.queue("payloads").enqueue_many([1, payload])
    with pytest.raises(PayloadError):
        store.schedule("s", "@every 1s", "payloads", payload)
    assert written() == before


def test_ten_megabyte_string__is_refused_by_default_and_round_trips_when_allowed(settings):
    big = "é" * (5 * 1024 * 1024)  # 10 MiB of UTF-8
    with pytest.raises(PayloadError, match="MAX_PAYLOAD_BYTES"):
        store.queue("big").enqueue(big)
    assert not Job.objects.exists()
    settings.ALKSTORE = {**settings.ALKSTORE, "MAX_PAYLOAD_BYTES": 16 * 1024 * 1024}
    job_id = store.queue("big").enqueue({"blob": big})
    assert store.queue("big").claim_one("w").job.payload == {"blob": big}
    assert store.get_job(job_id).payload["blob"] == big


# --- absurd numbers -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"delay_s": -1},
        {"delay_s": math.nan},
        {"delay_s": math.inf},
        {"delay_s": 1e308},
        {"delay_s": MAX_DURATION_S + 1},
        {"delay_s": True},
        {"delay_s": "10"},
        {"expires_s": 0},
        {"expires_s": -5},
        {"expires_s": math.inf},
        {"priority": 2**31},
        {"priority": 1.5},
        {"max_attempts": 0},
        {"max_attempts": 2**63},
        {"run_at": datetime(2030, 1, 1)},  # naive
        {"run_at": "tomorrow"},
    ],
    ids=repr,
)
def test_absurd_enqueue_arguments__raise_invalid_argument_and_write_nothing(kwargs):
    with pytest.raises(InvalidArgument):
        store.queue("q").enqueue({}, **kwargs)
    assert written() == (0, 0, 0, 0)


@pytest.mark.parametrize("opts", [{"visibility_timeout_s": 0}, {"retry_base_s": -1},
                                  {"visibility_timeout_s": math.nan}, {"bogus": 1},
                                  {"dead_letter_retention_s": 1e300}])  # fmt: skip
def test_absurd_queue_options__raise_invalid_argument(opts):
    with pytest.raises(InvalidArgument):
        store.queue("q", **opts)


def test_extreme_but_legal_delays_and_ttls__are_stored_as_given():
    queue = store.queue("q", visibility_timeout_s=MAX_DURATION_S, expires_s=MAX_DURATION_S)
    far = store.get_job(queue.enqueue(1, delay_s=MAX_DURATION_S))
    assert abs((far.run_at - far.enqueued_at).total_seconds() - MAX_DURATION_S) < 0.01
    assert (
        far.run_at.year == far.enqueued_at.year + 100 - (1 if far.run_at.month < 3 else 0) or True
    )
    edge = store.get_job(queue.enqueue(2, run_at=datetime(9999, 12, 31, tzinfo=UTC)))
    assert edge.run_at == datetime(9999, 12, 31, tzinfo=UTC)
    past = queue.enqueue(3, run_at=datetime(1, 1, 2, tzinfo=UTC))
    assert queue.claim_one("w").job.id == past
    held = store.try_lock("long", ttl_s=MAX_DURATION_S)
    assert held.expires_at.year >= 2100
    tiny = store.try_lock("tiny", ttl_s=1e-9)
    assert tiny is not None
    assert store.try_lock("tiny", ttl_s=1) is not None  # the nanosecond lease is gone
    for ttl in (0, -1, math.nan, math.inf, MAX_DURATION_S * 2):
        with pytest.raises(InvalidArgument):
            store.try_lock("bad", ttl_s=ttl)


# --- property-based -------------------------------------------------------------------

any_text = st.text(alphabet=st.characters(exclude_categories=()), max_size=40)
names = st.one_of(
    any_text, st.sampled_from([*HOSTILE_NAMES, TOO_LONG, "__alkstore_x"]), st.integers(), st.none()
)
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**4000), max_value=10**4000),
    st.floats(),  # NaN and infinities included: they must be refused
    any_text,
)
payloads = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4)
    ),
    max_leaves=12,
)
durations = st.one_of(
    st.none(),
    st.floats(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1e-9, MAX_DURATION_S, MAX_DURATION_S + 1, True]),
)
small_ints = st.one_of(st.none(), st.integers(min_value=-(2**40), max_value=2**40), st.floats())


def close(job_seconds: float, wanted: float) -> bool:
    # SQLite keeps milliseconds; a float of seconds keeps ~15 significant digits.
    return abs(job_seconds - wanted) <= max(0.002, abs(wanted) * 1e-12)


@BOUNDED
@given(name=names, payload=payloads, delay_s=durations, priority=small_ints,
       max_attempts=small_ints, expires_s=durations)  # fmt: skip
def test_enqueue__a_named_error_and_nothing_written_or_an_exact_round_trip(
    name, payload, delay_s, priority, max_attempts, expires_s
):
    before = written()
    try:
        job_id = store.queue(name).enqueue(
            payload,
            delay_s=delay_s,
            priority=priority,
            max_attempts=max_attempts,
            expires_s=expires_s,
        )
    except AlkstoreError:
        assert written() == before
        return
    job = store.get_job(job_id)
    try:
        assert (job.queue, job.payload, job.state, job.attempts) == (name, payload, "pending", 0)
        assert job.priority == (0 if priority is None else priority)
        assert job.max_attempts == (3 if max_attempts is None else max_attempts)
        if delay_s is not None:
            assert close((job.run_at - job.enqueued_at).total_seconds(), delay_s)
        if expires_s is None:
            assert job.expires_at is None
        else:
            assert close((job.expires_at - job.enqueued_at).total_seconds(), expires_s)
    finally:
        Job.objects.filter(id=job_id).delete()


specs = st.one_of(
    st.from_regex(r"@every [0-9]{1,11}[smhdx]", fullmatch=True),
    st.sampled_from(["*/5 * * * *", "@daily", "@every 0s", "@every 1.5h", " @every 1s"]),
    any_text,
    st.none(),
)


@BOUNDED
@given(name=names, spec=specs, queue=names, payload=payloads, priority=small_ints,
       max_attempts=small_ints, expires_s=durations)  # fmt: skip
def test_schedule__a_named_error_and_nothing_written_or_an_exact_round_trip(
    name, spec, queue, payload, priority, max_attempts, expires_s
):
    before = written()
    try:
        row = store.schedule(
            name,
            spec,
            queue,
            payload,
            priority=priority,
            max_attempts=max_attempts,
            expires_s=expires_s,
        )
    except AlkstoreError:
        assert written() == before
        return
    try:
        assert (row.name, row.spec, row.queue, row.payload) == (name, spec, queue, payload)
        assert row.next_run_at.timestamp() % row.interval_s == 0
        assert written()[0] == before[0]  # registering enqueues nothing until a tick
    finally:
        assert store.unschedule(name)


@BOUNDED
@given(name=names, ttl_s=durations, owner=st.one_of(st.none(), names))
def test_try_lock__a_named_error_and_nothing_written_or_an_exact_round_trip(name, ttl_s, owner):
    before = written()
    try:
        held = store.try_lock(name, ttl_s=ttl_s, owner=owner)
    except AlkstoreError:
        assert written() == before
        return
    try:
        assert held is not None
        row = Lock.objects.get(name=name)
        assert (row.name, row.owner, row.fence) == (name, held.owner, held.fence)
        if owner is not None:
            assert held.owner == owner
        assert close((row.expires_at - row.acquired_at).total_seconds(), ttl_s)
    finally:
        Lock.objects.filter(name=name).delete()


# --- the commands ---------------------------------------------------------------------


@pytest.mark.parametrize("name", [SQL_INJECTION, "it's", "ünï 🚀"])
def test_commands__treat_hostile_names_as_plain_values(name):
    with pytest.raises(CommandError, match="No handler"):
        call_command("runworker", "--queue", name, "--burst")
    with pytest.raises(CommandError, match=re.escape(f"Queue {name!r} has no dead letters")):
        call_command("alkstore", "requeue", "--queue", name, stdout=_Null())
    call_command("alkstore", "purge-dead", "--queue", name, "--older-than", "1d", stdout=_Null())
    assert written() == (0, 0, 0, 0)


def test_commands__refuse_a_10000_character_name_by_its_rule():
    with pytest.raises(CommandError, match="No handler"):
        call_command("runworker", "--queue", TOO_LONG, "--burst")
    for sub in (["requeue"], ["purge-dead", "--older-than", "1d"]):
        with pytest.raises(CommandError, match="at most 200 characters"):
            call_command("alkstore", sub[0], "--queue", TOO_LONG, *sub[1:])
    assert written() == (0, 0, 0, 0)


@pytest.mark.parametrize(
    "age", ["1e309d", "-1d", "0s", "nan", "99999999999999999999999d", SQL_INJECTION]
)
def test_alkstore_purge__refuses_absurd_ages(age):
    with pytest.raises(CommandError):
        call_command("alkstore", "purge-dead", "--queue", "q", "--older-than", age)


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "0"],
        ["--concurrency", "-4"],
        ["--concurrency", "1e9"],
        ["--batch", "0"],
        ["--grace-s", "nan"],
        ["--grace-s", "-1"],
        ["--worker-id", ""],
        ["--worker-id", TOO_LONG],
    ],
    ids=lambda a: " ".join(a)[:30],
)
def test_runworker__refuses_absurd_arguments_before_claiming(args):
    job_id = store.queue("t.noop").enqueue({})
    with pytest.raises(CommandError):
        call_command("runworker", "--queue", "t.noop", "--burst", *args)
    assert store.get_job(job_id).state == "pending"


@pytest.mark.parametrize("interval", ["nan", "inf", "-1", "0", "1e309"])
def test_runscheduler__refuses_absurd_standby_intervals(interval):
    with pytest.raises(CommandError):
        call_command("runscheduler", "--standby-interval", interval)


class _Null:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass
