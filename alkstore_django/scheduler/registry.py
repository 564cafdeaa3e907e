"""Schedules validated, stored and declared: the registry the tick reads.

``check_schedule`` and ``check_declaration`` validate without touching the
database (the system check and the admin use them); ``schedule`` upserts a
row and wakes the leader; ``register_declared`` applies ``ALKSTORE["SCHEDULES"]``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

from ..conf import app_settings
from ..errors import InvalidArgument
from ..models import Schedule
from ..notify import notify
from ..records import Schedule as ScheduleRecord
from ..specs import parse_misfire, parse_spec, parse_zone
from ..validation import (
    encode_payload,
    validate_duration,
    validate_int,
    validate_max_attempts,
    validate_name,
    validate_priority,
)

if TYPE_CHECKING:
    from ..store import Store

logger = logging.getLogger("alkstore_django.scheduler")

# schedule() and unschedule() notify here so a PostgreSQL leader wakes at once.
SCHEDULES_CHANNEL = "__alkstore_schedules"
SCHEDULE_KEYS = frozenset(
    {"spec", "queue", "payload", "priority", "max_attempts", "expires_s", "zone", "misfire"}
)


def check_schedule(
    name: object,
    spec: object,
    queue: object,
    payload: Any = None,
    *,
    priority: object = None,
    max_attempts: object = None,
    expires_s: object = None,
    zone: object = None,
    misfire: object = "all",
) -> dict[str, Any]:
    """Validate a schedule's arguments without touching the database.

    Returns the row's values with the stamps resolved over the target queue's
    derived defaults, and the parsed spec under ``"parsed"``. ``zone`` None
    means ``settings.TIME_ZONE``. Raises ``InvalidSpec`` first (spec, zone,
    misfire), then ``InvalidName``, ``ReservedName``, ``PayloadError`` or
    ``InvalidArgument``. The payload is encoded with ``PAYLOAD_CODEC``, as a
    job's is.
    """
    zone = default_zone() if zone is None else zone
    parse_zone(zone)
    parsed = parse_spec(spec, zone)
    parse_misfire(misfire)
    validate_name("schedule", name)
    validate_name("queue", queue)
    codec = app_settings.payload_codec
    encoded = encode_payload(payload, app_settings.max_payload_bytes, codec.encode)
    defaults = app_settings.queue_defaults(queue)  # type: ignore[arg-type]
    return {
        "name": name,
        "spec": spec,
        "parsed": parsed,
        "interval_s": parsed.interval_s,
        "zone": zone,
        "misfire": misfire,
        "queue": queue,
        "payload": encoded,
        "priority": defaults.priority if priority is None else validate_priority(priority),
        "max_attempts": (
            defaults.max_attempts if max_attempts is None else validate_max_attempts(max_attempts)
        ),
        "visibility_timeout_s": defaults.visibility_timeout_s,
        "retry_base_s": defaults.retry_base_s,
        "expires_s": (
            defaults.expires_s
            if expires_s is None
            else validate_duration("expires_s", expires_s, allow_zero=False)
        ),
    }


def check_declaration(name: object, declaration: object) -> dict[str, Any]:
    """Validate one ``ALKSTORE["SCHEDULES"]`` entry; return the ``schedule()`` arguments."""
    if not isinstance(declaration, dict):
        raise InvalidArgument(
            f"Invalid schedule declaration {declaration!r}: expected a dict with keys "
            f"{', '.join(sorted(SCHEDULE_KEYS))}."
        )
    unknown = sorted(set(declaration) - SCHEDULE_KEYS)
    if unknown:
        raise InvalidArgument(
            f"Unknown schedule key {unknown[0]!r}: expected one of "
            f"{', '.join(sorted(SCHEDULE_KEYS))}."
        )
    missing = sorted({"spec", "queue"} - set(declaration))
    if missing:
        raise InvalidArgument(f"Missing schedule key {missing[0]!r}: spec and queue are required.")
    check_schedule(name, **declaration)
    return dict(declaration)


def default_zone() -> str:
    """Return the zone a schedule gets when none is given: ``settings.TIME_ZONE``."""
    return settings.TIME_ZONE or "UTC"


def schedule(
    store: Store,
    name: str,
    spec: str,
    queue: str,
    payload: Any = None,
    *,
    priority: int | None = None,
    max_attempts: int | None = None,
    expires_s: float | None = None,
    zone: str | None = None,
    misfire: str = "all",
    declared: bool = False,
) -> ScheduleRecord:
    """Register (upsert by name) a schedule and return it as stored.

    The first fire is the first boundary after registration. Re-registering an
    unchanged spec and zone keeps ``next_run_at``; a changed one recomputes
    it. The stamps are resolved over the target queue's derived defaults now,
    at registration; a paused schedule stays paused. ``declared`` marks a
    schedule from ``ALKSTORE["SCHEDULES"]``. Joins the caller's transaction.
    Raises ``InvalidSpec`` (and every other argument error) before any
    database access.
    """
    store.check_open()
    values = check_schedule(
        name,
        spec,
        queue,
        payload,
        priority=priority,
        max_attempts=max_attempts,
        expires_s=expires_s,
        zone=zone,
        misfire=misfire,
    )
    values["declared"] = bool(declared)
    # The upsert is the first statement that touches a table, so on SQLite the
    # transaction takes the write lock before it reads anything.
    with transaction.atomic(using=store.using):
        now = store.dialect.database_now()
        first = values["parsed"].next_after(now)
        store.dialect.upsert_schedule(values, first)
        notify(store, SCHEDULES_CHANNEL, name)
        row = Schedule.objects.using(store.using).get(name=name)
    logger.info(
        "schedule registered name=%s spec=%s queue=%s next_run_at=%s",
        name,
        spec,
        queue,
        row.next_run_at.isoformat(),
    )
    return row.to_record()


def unschedule(store: Store, name: str) -> bool:
    """Delete the schedule ``name``; False when there is none."""
    store.check_open()
    validate_name("schedule", name)
    with transaction.atomic(using=store.using):
        deleted, _ = Schedule.objects.using(store.using).filter(name=name).delete()
        if deleted:
            notify(store, SCHEDULES_CHANNEL, name)
    return deleted > 0


def register_declared(store: Store) -> list[str]:
    """Register every schedule in ``ALKSTORE["SCHEDULES"]``; return their names.

    Schedules registered through the API are left alone, as are declared ones
    later removed from settings (``unschedule`` them). A declared schedule
    edited in the admin since is overwritten by its declaration, with a
    warning naming what the edit had changed.
    """
    names = []
    for name, declaration in app_settings.schedules.items():
        arguments = check_declaration(name, declaration)
        edited = (
            Schedule.objects.using(store.using)
            .filter(name=name, admin_edited_at__isnull=False)
            .first()
        )
        record = schedule(store, name, **arguments, declared=True)
        if edited is not None:
            _warn_overwritten(edited, record)
        names.append(name)
    return names


def _warn_overwritten(edited: Schedule, record: ScheduleRecord) -> None:
    changed = [
        f"{field} {getattr(edited, field)!r} -> {getattr(record, field)!r}"
        for field in ("spec", "zone", "misfire", "queue", "priority", "max_attempts", "expires_s")
        if getattr(edited, field) != getattr(record, field)
    ]
    if app_settings.payload_codec.decode(edited.payload) != record.payload:
        changed.append("payload")
    logger.warning(
        "schedule admin edit overwritten by ALKSTORE['SCHEDULES'] name=%s edited_at=%s changes=%s",
        edited.name,
        edited.admin_edited_at.isoformat() if edited.admin_edited_at else None,
        "; ".join(changed) or "none",
    )


def set_schedules_enabled(ids: Iterable[int], enabled: bool, *, using: str | None = None) -> int:
    """Resume (``enabled=True``) or pause schedules by id; return how many changed.

    A paused schedule does not fire. Resuming moves a next run that passed
    while paused to the schedule's first boundary after now, computed by the
    spec value (not in SQL), and drops a held refusal (the operator acted):
    missed fires are skipped, not replayed. ``operations`` offers it to the
    admin.
    """
    from ..dialects import dialect_for

    selected = sorted(
        {validate_int("schedule id", i, minimum=-(2**63), maximum=2**63 - 1) for i in ids}
    )
    if not selected:
        return 0
    alias = using or app_settings.database
    sql = dialect_for(alias)
    changed = 0
    with sql.write_transaction():
        now = sql.database_now()
        rows = Schedule.objects.using(alias).select_for_update()
        for row in rows.filter(pk__in=selected, enabled=not enabled):
            updates: dict[str, Any] = {"enabled": bool(enabled), "updated_at": now}
            if enabled and (row.next_run_at <= now or row.refused_from is not None):
                updates["next_run_at"] = parse_spec(row.spec, row.zone).next_after(now)
                updates["refused_from"] = None
            changed += Schedule.objects.using(alias).filter(pk=row.pk).update(**updates)
    return changed


def list_schedules(*, using: str | None = None) -> list[ScheduleRecord]:
    """Return every schedule as stored, by name (paused and refused ones included)."""
    rows = Schedule.objects.using(using or app_settings.database).order_by("name")
    return [row.to_record() for row in rows]
