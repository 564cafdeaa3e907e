"""The pure arithmetic: spec grammar, epoch boundaries, equal-jitter backoff."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest

from alkstore_django.errors import InvalidArgument, InvalidSpec
from alkstore_django.specs import EverySpec, parse_spec
from alkstore_django.timing import BACKOFF_CAP_S, backoff_s, parse_rate


@pytest.mark.parametrize(
    ("spec", "seconds"),
    [("@every 1s", 1), ("@every 5m", 300), ("@every 2h", 7200), ("@every 1d", 86400)],
)
def test_parse_spec__accepts_the_exact_grammar(spec, seconds):
    assert parse_spec(spec) == EverySpec(spec, seconds)


@pytest.mark.parametrize(
    "spec",
    [
        "*/5 * * * *",
        "@daily",
        "@every 0s",
        "@every 1.5h",
        "@every 5",
        "@every  5s",
        "@every 5s ",
        " @every 5s",
        "@every -5s",
        "@every 05s",
        "@every 5S",
        "@every 5w",
        "@every\t5s",
        "",
        None,
        5,
    ],
)
def test_parse_spec__rejects_everything_else(spec):
    with pytest.raises(InvalidSpec, match="expected '@every <n><unit>'"):
        parse_spec(spec)


def test_next_boundary__is_the_next_epoch_multiple_strictly_after():
    def after(seconds: float, interval_s: int) -> float:
        at = datetime.fromtimestamp(seconds, tz=UTC)
        return EverySpec("@every", interval_s).next_after(at).timestamp()

    assert after(0, 60) == 60
    assert after(59.9, 60) == 60
    assert after(60, 60) == 120
    assert after(1_700_000_001, 3600) == 1_700_002_800


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8])
def test_backoff__stays_within_equal_jitter_bounds(attempt):
    rng = random.Random(attempt)
    d = min(5 * 2 ** (attempt - 1), BACKOFF_CAP_S)
    delays = [backoff_s(attempt, 5, rng) for _ in range(2000)]
    assert min(delays) == math.ceil(d / 2)
    assert max(delays) == d
    assert all(isinstance(x, int) for x in delays)


def test_backoff__is_uniform_over_its_range():
    rng = random.Random(7)
    delays = [backoff_s(3, 5, rng) for _ in range(20_000)]  # d = 20 -> [10, 20]
    counts = {v: delays.count(v) for v in range(10, 21)}
    expected = len(delays) / 11
    assert all(abs(c - expected) < expected * 0.15 for c in counts.values())


def test_backoff__caps_at_an_hour_even_for_absurd_attempts():
    rng = random.Random(1)
    for attempt in (13, 50, 10_000, 2**31):
        delay = backoff_s(attempt, 5, rng)
        assert 1800 <= delay <= 3600


def test_backoff__zero_base_means_no_delay():
    assert backoff_s(10, 0) == 0


@pytest.mark.parametrize(
    ("rate", "expected"),
    [("100/m", (100, 60)), ("20/s", (20, 1)), ("1/h", (1, 3600)), ("999999999/s", (999999999, 1))],
)
def test_parse_rate__reads_starts_per_period(rate, expected):
    assert parse_rate(rate) == expected


@pytest.mark.parametrize(
    "rate", ["0/s", "-1/s", "1.5/s", "10/d", "10 /m", "10/m ", "/m", "10", "010/s", None, 10]
)
def test_parse_rate__refuses_anything_else_naming_it(rate):
    with pytest.raises(InvalidArgument, match=f"Invalid rate {rate!r}: expected '<n>/<unit>'"):
        parse_rate(rate)
