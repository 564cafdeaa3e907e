"""Schedule specs and misfire policies as values: parsed once, then asked for boundaries.

Two forms, both explicitly marked so a bare cron string stays ``InvalidSpec``:

- ``@every <n><unit>``: the multiples of the interval since the Unix epoch,
  in UTC whatever the zone.
- ``@cron <fields>``: five fields (minute hour day-of-month month
  day-of-week), six with a leading seconds field, or one shorthand
  (``@cron @daily``). Read in the schedule's IANA zone.

The cron fields are matched by croniter on *naive wall-clock* times, and this
module maps each wall time to one instant, so the daylight-saving rule lives
here, once: a wall time that does not exist (spring forward) fires once, at
the instant the clocks jump; a wall time that occurs twice (fall back) fires
once, at its first occurrence. Every engine uses this one implementation;
the database keeps only ``next_run_at``.

A misfire policy (``all``, ``latest``, ``skip``: one ``MisfirePolicy`` each)
answers which of a schedule's due boundaries a tick fires; its name is the
value stored in ``Schedule.misfire``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from .errors import InvalidSpec
from .timing import UNIT_SECONDS

# Exactly '@every <n><unit>': one space, a positive integer without sign or
# leading zeros, one unit letter; nothing before or after.
_EVERY_RE = re.compile(r"@every ([1-9][0-9]{0,9})([smhd])")
MAX_INTERVAL_S = 366 * 86_400 * 100
CRON_PREFIX = "@cron "
SHORTHANDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIVE_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
SIX_FIELDS = ("second", *FIVE_FIELDS)
_FIELD_RE = re.compile(r"[0-9A-Za-z*?,/#-]+")
# croniter quotes the whole probe expression first; the field is named instead.
_PROBE_RE = re.compile(r"^\[[^\]]*\] ")
# The width of ``Schedule.spec``: a longer spec, valid or not, cannot be stored.
MAX_SPEC_CHARS = 255
# A cron that matches nothing in this many years never fires (say "0 0 30 2 *").
MAX_YEARS_BETWEEN = 28
SPEC_GRAMMAR = (
    "expected '@every <n><unit>' (n a positive integer, unit s, m, h or d), or "
    "'@cron <5 or 6 fields>' or '@cron @hourly|@daily|@weekly|@monthly|@yearly'"
)
# The look-back windows of ``CronSpec.latest_at_or_before``, widest last: a
# second, a minute, an hour, a day, a month, a year, a leap cycle, the longest gap.
_DAY_S = 86_400
_LOOK_BACKS_S = (1, 60, 3600, _DAY_S, 32 * _DAY_S, 367 * _DAY_S, 1462 * _DAY_S,
                 (MAX_YEARS_BETWEEN * 366 + 1) * _DAY_S)  # fmt: skip
# A tick fires at most this many boundaries of one schedule; older ones past
# them are skipped, never fired later.
MAX_FIRES_PER_TICK = 64
# Under the ``skip`` policy a boundary at most this late is on time, not missed:
# a tick runs a moment after its boundary, and a failover takes about a lease.
MISFIRE_GRACE_S = 60.0


def _refuse(spec: object, why: str) -> InvalidSpec:
    return InvalidSpec(f"Invalid schedule spec {spec!r}: {why}.")


def parse_zone(zone: object) -> ZoneInfo:
    """Return the IANA zone ``zone``; ``InvalidSpec`` naming it when there is none such."""
    if isinstance(zone, str) and zone and zone == zone.strip():
        try:
            return ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            pass
    raise InvalidSpec(
        f"Invalid schedule zone {zone!r}: expected an IANA time zone name such as "
        "'UTC', 'Europe/Paris' or 'America/New_York'."
    )


def _utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC)


@dataclass(frozen=True)
class EverySpec:
    """``@every <n><unit>``: epoch-aligned, so no zone and no daylight saving."""

    text: str
    interval_s: int

    def next_after(self, instant: datetime) -> datetime:
        """Return the first boundary strictly after ``instant``."""
        return datetime.fromtimestamp(
            (math.floor(instant.timestamp()) // self.interval_s + 1) * self.interval_s, tz=UTC
        )

    def latest_at_or_before(self, instant: datetime) -> datetime:
        """Return the last boundary at or before ``instant``."""
        return datetime.fromtimestamp(
            math.floor(instant.timestamp()) // self.interval_s * self.interval_s, tz=UTC
        )


@dataclass(frozen=True)
class CronSpec:
    """``@cron <fields>`` read in ``zone``; see the module docstring for daylight saving."""

    text: str
    expression: str
    zone: ZoneInfo
    seconds: bool
    interval_s: None = field(default=None, init=False)

    def _walls(self, start: datetime) -> Iterator[datetime]:
        """Yield the matching naive wall times strictly after the naive ``start``."""
        it = croniter(
            self.expression,
            start,
            second_at_beginning=self.seconds,
            max_years_between_matches=MAX_YEARS_BETWEEN,
        )
        while True:
            yield it.get_next(datetime)

    def _instant(self, wall: datetime) -> datetime:
        """Map a naive wall time in the zone to its one instant (the DST rule)."""
        first = wall.replace(tzinfo=self.zone, fold=0)
        instant = _utc(first)
        if instant.astimezone(self.zone).replace(tzinfo=None) == wall:
            return instant  # exists; fold=0 is the first of two occurrences
        # A gap: the wall time was skipped. fold=1 reads it with the offset after
        # the jump (an instant before the jump), fold=0 with the one before (an
        # instant after it). The jump is the first second whose wall time has
        # reached ``wall``: find it between the two.
        low = math.floor(_utc(wall.replace(tzinfo=self.zone, fold=1)).timestamp())
        high = math.ceil(instant.timestamp())
        while high - low > 1:
            middle = (low + high) // 2
            if datetime.fromtimestamp(middle, tz=self.zone).replace(tzinfo=None) >= wall:
                high = middle
            else:
                low = middle
        return datetime.fromtimestamp(high, tz=UTC)

    def next_after(self, instant: datetime) -> datetime:
        """Return the first boundary strictly after ``instant``."""
        # Start a little before the wall time: after a fall-back, the wall clock
        # of ``instant`` may be behind boundaries already passed; those are skipped
        # by comparing instants, not wall times.
        wall = _utc(instant).astimezone(self.zone).replace(tzinfo=None, fold=0)
        for candidate in self._walls(wall - timedelta(seconds=1)):
            at = self._instant(candidate)
            if at > instant:
                return at
        raise AssertionError("unreachable: the cron iterator is endless")  # pragma: no cover

    def latest_at_or_before(self, instant: datetime) -> datetime | None:
        """Return the last boundary at or before ``instant``, None if none in 28 years.

        Widens a look-back window until it holds a boundary, then walks it
        forwards, so a one-second cron is as cheap as a yearly one. The window
        reaches as far as a cron may go between matches (``MAX_YEARS_BETWEEN``:
        a 29th of February is up to 8 years back), so ``latest`` fires what
        ``all`` would.
        """
        for back in _LOOK_BACKS_S:
            found = None
            at = self.next_after(instant - timedelta(seconds=back))
            while at <= instant:
                found = at
                at = self.next_after(at)
            if found is not None:
                return found
        return None


Spec = EverySpec | CronSpec


def boundaries(spec: Spec, first: datetime, until: datetime, limit: int) -> list[datetime]:
    """Return the boundaries from ``first`` (itself a boundary) to ``until``, oldest first.

    At most ``limit`` of them: the oldest.
    """
    found: list[datetime] = []
    at = first
    while at <= until and len(found) < limit:
        found.append(at)
        at = spec.next_after(at)
    return found


class MisfirePolicy:
    """What a tick fires of a schedule's due boundaries: one subclass per policy.

    ``name`` is the value stored in ``Schedule.misfire`` (and offered by the
    admin); ``due`` answers which boundaries to fire now.
    """

    name: ClassVar[str]

    def due(self, spec: Spec, first: datetime, now: datetime, *, held: bool) -> list[datetime]:
        """Return the boundaries to fire now, from ``first`` (the oldest due) to ``now``.

        ``held`` says ``first`` is a boundary whose fire was refused (it stays
        due until it fires), not one merely reached.
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<misfire policy {self.name!r}>"


class FireAll(MisfirePolicy):
    """``all``: catch up on every missed boundary, the oldest first, at most 64 per tick."""

    name = "all"

    def due(self, spec: Spec, first: datetime, now: datetime, *, held: bool) -> list[datetime]:
        return boundaries(spec, first, now, MAX_FIRES_PER_TICK)


class FireLatest(MisfirePolicy):
    """``latest``: fire only the most recent boundary, however many were missed."""

    name = "latest"

    def due(self, spec: Spec, first: datetime, now: datetime, *, held: bool) -> list[datetime]:
        latest = spec.latest_at_or_before(now)
        return [latest] if latest is not None and latest >= first else []


class SkipMissed(MisfirePolicy):
    """``skip``: fire only boundaries at most ``MISFIRE_GRACE_S`` late.

    A held boundary is kept: it was on time when its fire was refused.
    """

    name = "skip"

    def due(self, spec: Spec, first: datetime, now: datetime, *, held: bool) -> list[datetime]:
        if not held:
            on_time = now - timedelta(seconds=MISFIRE_GRACE_S)
            if first < on_time:
                first = spec.next_after(on_time - timedelta(microseconds=1))
        return boundaries(spec, first, now, MAX_FIRES_PER_TICK)


MISFIRE_POLICY_VALUES: dict[str, MisfirePolicy] = {
    policy.name: policy for policy in (FireAll(), FireLatest(), SkipMissed())
}
MISFIRE_POLICIES = tuple(MISFIRE_POLICY_VALUES)
#: ``Schedule.misfire``'s choices: the stored value is the policy's name.
MISFIRE_CHOICES = [(name, name) for name in MISFIRE_POLICIES]


def misfire_policy(misfire: object) -> MisfirePolicy:
    """Return the misfire policy named ``misfire``; ``InvalidSpec`` naming the allowed ones."""
    if isinstance(misfire, str) and misfire in MISFIRE_POLICY_VALUES:
        return MISFIRE_POLICY_VALUES[misfire]
    raise InvalidSpec(
        f"Invalid misfire policy {misfire!r}: expected one of {', '.join(MISFIRE_POLICIES)}."
    )


def parse_misfire(misfire: object) -> str:
    """Return the misfire policy name ``misfire``; ``InvalidSpec`` naming the allowed ones."""
    return misfire_policy(misfire).name


def parse_spec(spec: object, zone: object = "UTC") -> Spec:
    """Return the spec value of ``spec`` read in ``zone``.

    Raises ``InvalidSpec`` for anything else (a bare cron string, ``@daily``
    outside ``@cron``, zero, a bad cron field, named with its position),
    before any database access. A spec longer than ``MAX_SPEC_CHARS`` (the
    width of ``Schedule.spec``) is refused too, however valid its fields.
    """
    if not isinstance(spec, str):
        raise _refuse(spec, SPEC_GRAMMAR)
    if len(spec) > MAX_SPEC_CHARS:
        raise _refuse(spec, f"it is {len(spec)} characters long; expected at most {MAX_SPEC_CHARS}")
    if spec.startswith("@every"):
        return _parse_every(spec)
    if not spec.startswith(CRON_PREFIX):
        raise _refuse(spec, SPEC_GRAMMAR)
    return _parse_cron(spec, parse_zone(zone))


def _parse_every(spec: str) -> EverySpec:
    match = _EVERY_RE.fullmatch(spec)
    if match is None:
        raise _refuse(spec, SPEC_GRAMMAR)
    interval_s = int(match.group(1)) * UNIT_SECONDS[match.group(2)]
    if interval_s > MAX_INTERVAL_S:
        raise _refuse(spec, "the interval exceeds 100 years")
    return EverySpec(spec, interval_s)


def _parse_cron(spec: str, tz: ZoneInfo) -> CronSpec:
    expression = _cron_expression(spec)
    fields = expression.split(" ")
    if len(fields) not in (5, 6):
        raise _refuse(
            spec,
            f"{len(fields)} fields separated by single spaces; expected 5 "
            f"({' '.join(FIVE_FIELDS)}) or 6 with a leading second",
        )
    names = FIVE_FIELDS if len(fields) == 5 else SIX_FIELDS
    for position, (name, text) in enumerate(zip(names, fields, strict=True), start=1):
        _check_field(spec, position, name, text, len(fields))
    parsed = CronSpec(spec, expression, tz, seconds=len(fields) == 6)
    try:
        parsed.next_after(datetime(2000, 1, 1, tzinfo=UTC))
    except CroniterBadDateError:
        raise _refuse(
            spec, f"it matches no date in {MAX_YEARS_BETWEEN} years (say, the 30th of February)"
        ) from None
    return parsed


def _cron_expression(spec: str) -> str:
    """Return the fields after ``@cron``, a shorthand (``@daily``) spelled out."""
    expression = spec[len(CRON_PREFIX) :]
    if not expression.startswith("@"):
        return expression
    if expression not in SHORTHANDS:
        raise _refuse(
            spec, f"unknown shorthand {expression!r}: expected one of {', '.join(SHORTHANDS)}"
        )
    return SHORTHANDS[expression]


def _check_field(spec: str, position: int, name: str, text: str, count: int) -> None:
    """Refuse one cron field, naming it, by asking croniter about it alone."""
    probe = ["*"] * count
    probe[position - 1] = text
    allowed = "a number, a name (jan, mon), *, a range a-b, a step */n or a-b/n, a list a,b"
    if not _FIELD_RE.fullmatch(text):
        raise _refuse(spec, f"field {position} ({name}) {text!r}: expected {allowed}")
    try:
        croniter(" ".join(probe), datetime(2000, 1, 1), second_at_beginning=count == 6)
    except CroniterBadDateError:
        return  # the field parses; whether the whole matches a date is checked after
    except (CroniterError, ValueError, KeyError, IndexError) as exc:
        why = _PROBE_RE.sub("", str(exc))
        raise _refuse(
            spec, f"field {position} ({name}) {text!r}: {why}; expected {allowed}"
        ) from None
