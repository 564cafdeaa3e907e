"""Spec values: the cron grammar and its errors, boundaries against croniter, DST, zones."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter

from alkstore_django.errors import InvalidSpec
from alkstore_django.specs import (
    MISFIRE_CHOICES,
    CronSpec,
    EverySpec,
    boundaries,
    misfire_policy,
    parse_misfire,
    parse_spec,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def local_walls(spec: CronSpec, first: datetime, until: datetime) -> list[str]:
    """The boundaries from the first after ``first`` to ``until``, as zone-local ISO text."""
    at = spec.next_after(first)
    return [b.astimezone(spec.zone).isoformat() for b in boundaries(spec, at, until, 1000)]


# --- the grammar -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expression", "seconds"),
    [
        ("@cron 0 9 * * 1-5", "0 9 * * 1-5", False),
        ("@cron */15 * * * *", "*/15 * * * *", False),
        ("@cron 0 9 * * mon-fri", "0 9 * * mon-fri", False),
        ("@cron 0 0 1 jan,jul *", "0 0 1 jan,jul *", False),
        ("@cron 0 8-18/2 * * *", "0 8-18/2 * * *", False),
        ("@cron 30 0 9 * * 1-5", "30 0 9 * * 1-5", True),
        ("@cron @hourly", "0 * * * *", False),
        ("@cron @daily", "0 0 * * *", False),
        ("@cron @weekly", "0 0 * * 0", False),
        ("@cron @monthly", "0 0 1 * *", False),
        ("@cron @yearly", "0 0 1 1 *", False),
    ],
)
def test_parse_spec__accepts_cron_fields_names_steps_and_shorthands(spec, expression, seconds):
    parsed = parse_spec(spec, "Europe/Paris")

    assert isinstance(parsed, CronSpec)
    assert (parsed.expression, parsed.seconds, parsed.zone.key) == (
        expression,
        seconds,
        "Europe/Paris",
    )


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("*/5 * * * *", "expected '@every <n><unit>'"),
        ("@daily", "expected '@every <n><unit>'"),
        ("@hourly", "expected '@every <n><unit>'"),
        ("cron 0 9 * * *", "expected '@every <n><unit>'"),
        ("@cron", "expected '@every <n><unit>'"),
        ("@cron 61 * * * *", "field 1 (minute) '61'"),
        ("@cron 0 24 * * *", "field 2 (hour) '24'"),
        ("@cron 0 0 32 * *", "field 3 (day of month) '32'"),
        ("@cron 0 0 * 13 *", "field 4 (month) '13'"),
        ("@cron 0 0 * jnu *", "field 4 (month) 'jnu'"),
        ("@cron 0 0 * * moon", "field 5 (day of week) 'moon'"),
        ("@cron */0 * * * *", "field 1 (minute) '*/0'"),
        ("@cron 60 0 9 * * *", "field 1 (second) '60'"),
        ("@cron 0 9 * * 1 ; rm", "7 fields"),
        ("@cron 0 9 * *", "4 fields"),
        ("@cron 0 0 9 * * * 2026", "7 fields"),
        ("@cron 0 9 * * 1-5 ", "field 6 (day of week) ''"),
        ("@cron @often", "unknown shorthand '@often'"),
        ("@cron @daily 0", "unknown shorthand"),
        ("@cron 0 0 30 2 *", "matches no date"),
        ("@cron 0 0 H * *", "field 3 (day of month) 'H'"),
    ],
)  # fmt: skip
def test_parse_spec__names_the_bad_field(spec, error):
    with pytest.raises(InvalidSpec, match=re.escape(error)):
        parse_spec(spec, "UTC")


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", " UTC", "utc ", None, 5, "../etc/passwd"])
def test_parse_spec__refuses_a_zone_that_is_not_an_iana_name(zone):
    with pytest.raises(InvalidSpec, match=r"Invalid schedule zone .* expected an IANA"):
        parse_spec("@cron 0 9 * * *", zone)


def test_parse_misfire__names_the_allowed_policies():
    assert [parse_misfire(p) for p in ("all", "latest", "skip")] == ["all", "latest", "skip"]
    with pytest.raises(InvalidSpec, match="'never': expected one of all, latest, skip"):
        parse_misfire("never")


def test_misfire_policies__answer_the_due_boundaries_and_name_the_model_choices():
    from alkstore_django.models import Schedule

    spec = parse_spec("@every 1m")
    first, now = utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 10, 30)
    assert len(misfire_policy("all").due(spec, first, now, held=False)) == 11
    assert misfire_policy("latest").due(spec, first, now, held=False) == [utc(2026, 1, 1, 0, 10)]
    # skip: only what is at most 60 s late, unless the oldest was held by a refusal.
    assert misfire_policy("skip").due(spec, first, now, held=False) == [utc(2026, 1, 1, 0, 10)]
    assert len(misfire_policy("skip").due(spec, first, now, held=True)) == 11
    assert Schedule._meta.get_field("misfire").choices == MISFIRE_CHOICES
    assert [name for name, _ in MISFIRE_CHOICES] == ["all", "latest", "skip"]


def test_every__keeps_its_epoch_alignment_whatever_the_zone():
    spec = parse_spec("@every 1d", "America/New_York")

    assert spec == EverySpec("@every 1d", 86_400)
    assert spec.next_after(utc(2026, 3, 8, 12)) == utc(2026, 3, 9)
    assert spec.latest_at_or_before(utc(2026, 3, 8, 12)) == utc(2026, 3, 8)


# --- boundaries against croniter's own output ----------------------------------------


@pytest.mark.parametrize(
    "fields",
    ["*/7 * * * *", "0 9 * * 1-5", "15 */3 * * *", "0 0 1,15 * *", "0 12 * jan,jun sun",
     "0 0 29 2 *", "5 4 * * sat", "0 0 L * *", "*/20 30 9 * * *"],
)  # fmt: skip
def test_cron__boundaries_match_croniter_in_utc(fields):
    spec = parse_spec(f"@cron {fields}", "UTC")
    start = datetime(2026, 1, 1, 0, 0, 7)
    reference = croniter(fields, start, second_at_beginning=len(fields.split()) == 6)
    expected = [reference.get_next(datetime).replace(tzinfo=UTC) for _ in range(40)]

    got, at = [], start.replace(tzinfo=UTC)
    for _ in range(40):
        at = spec.next_after(at)
        got.append(at)

    assert got == expected


def test_cron__latest_at_or_before_is_the_last_boundary_not_after():
    spec = parse_spec("@cron 0 9 * * 1-5", "UTC")  # weekdays at 09:00

    assert spec.latest_at_or_before(utc(2026, 11, 30, 9)) == utc(2026, 11, 30, 9)
    assert spec.latest_at_or_before(utc(2026, 11, 30, 8, 59)) == utc(2026, 11, 27, 9)
    seconds = parse_spec("@cron * * * * * *", "UTC")
    assert seconds.latest_at_or_before(utc(2026, 1, 1, 0, 0, 5, 500)) == utc(2026, 1, 1, 0, 0, 5)


def test_cron__reads_the_fields_in_the_schedules_zone():
    spec = parse_spec("@cron 0 9 * * 1-5", "Europe/Paris")

    # Monday 30 November 2026, 09:00 in Paris is 08:00 UTC (winter time).
    assert spec.next_after(utc(2026, 11, 30)) == utc(2026, 11, 30, 8)
    # In summer Paris is UTC+2: Monday 1 June 2026, 09:00 is 07:00 UTC.
    assert spec.next_after(utc(2026, 6, 1)) == utc(2026, 6, 1, 7)


# --- daylight saving ----------------------------------------------------------------
# Europe/Paris: 29 March 2026 02:00 -> 03:00; 25 October 2026 03:00 -> 02:00.
# America/New_York: 8 March 2026 02:00 -> 03:00; 1 November 2026 02:00 -> 01:00.


@pytest.mark.parametrize(
    ("zone", "day", "expected"),
    [
        ("Europe/Paris", (2026, 3, 28), ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00",
                                         "2026-03-30T02:30:00+02:00"]),
        ("America/New_York", (2026, 3, 7), ["2026-03-07T02:30:00-05:00",
                                            "2026-03-08T03:00:00-04:00",
                                            "2026-03-09T02:30:00-04:00"]),
    ],
)  # fmt: skip
def test_dst__a_skipped_time_fires_once_at_the_next_valid_instant(zone, day, expected):
    spec = parse_spec("@cron 30 2 * * *", zone)
    start = datetime(*day, tzinfo=spec.zone)

    assert local_walls(spec, start, start + timedelta(days=3) - timedelta(hours=12)) == expected


@pytest.mark.parametrize(
    ("zone", "day"), [("Europe/Paris", (2026, 3, 29)), ("America/New_York", (2026, 3, 8))]
)
def test_dst__every_skipped_quarter_hour_fires_once_together(zone, day):
    spec = parse_spec("@cron */15 2 * * *", zone)  # 02:00, 02:15, 02:30, 02:45: none exist
    start = datetime(*day, tzinfo=spec.zone)

    walls = local_walls(spec, start, start + timedelta(hours=23))

    assert walls == [datetime(*day, 3, tzinfo=spec.zone).isoformat()]


@pytest.mark.parametrize(
    ("zone", "day", "hour", "first_offset"),
    [("Europe/Paris", (2026, 10, 25), 2, "+02:00"),
     ("America/New_York", (2026, 11, 1), 1, "-04:00")],
)  # fmt: skip
def test_dst__a_repeated_time_fires_once_at_its_first_occurrence(zone, day, hour, first_offset):
    spec = parse_spec(f"@cron 30 {hour} * * *", zone)
    start = datetime(*day, tzinfo=spec.zone)

    walls = local_walls(spec, start, start + timedelta(hours=24))

    assert walls == [f"{datetime(*day, hour, 30).isoformat()}{first_offset}"]


def test_dst__an_hourly_cron_fires_each_wall_hour_once_on_the_fall_back_day():
    spec = parse_spec("@cron 0 * * * *", "Europe/Paris")
    start = datetime(2026, 10, 25, tzinfo=spec.zone) - timedelta(seconds=1)

    walls = local_walls(spec, start, datetime(2026, 10, 25, 23, 59, tzinfo=spec.zone))

    assert len(walls) == 24  # a 25-hour day; 02:00 fires at its first occurrence only
    assert "2026-10-25T02:00:00+02:00" in walls
    assert "2026-10-25T02:00:00+01:00" not in walls
    # Asked from inside the repeated hour, the next boundary is still after it.
    second_time = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)  # 02:10 +01:00
    assert spec.next_after(second_time) == utc(2026, 10, 25, 2)  # 03:00 +01:00


def test_misfire_latest__fires_a_missed_boundary_more_than_a_year_back_as_all_does():
    # The 29th of February: its last boundary may be years behind now.
    spec = parse_spec("@cron 0 0 29 2 *")
    first, now = utc(2024, 2, 29), utc(2026, 12, 1)

    assert misfire_policy("all").due(spec, first, now, held=False) == [first]
    assert misfire_policy("latest").due(spec, first, now, held=False) == [first]
    assert spec.latest_at_or_before(utc(2103, 12, 31)) == utc(2096, 2, 29)
