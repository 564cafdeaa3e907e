"""System checks for ``settings.ALKSTORE``; ``manage.py check`` names the bad key."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from .conf import SETTING_KEYS, app_settings
from .errors import AlkstoreError
from .handlers import registry
from .validation import validate_name, validate_queue_options

SUPPORTED_VENDORS = {"postgresql", "sqlite"}
POSTGRES_ENGINES = ("postgresql", "postgis")


def register() -> None:
    checks.register(check_settings, checks.Tags.compatibility)
    checks.register(check_handlers, checks.Tags.compatibility)
    checks.register(check_environment, checks.Tags.compatibility)


def _error(msg: str, hint: str, id_: str) -> checks.Error:
    return checks.Error(msg, hint=hint, obj="settings.ALKSTORE", id=id_)


def _positive_number(value: Any) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an int too large for a float is no sane interval
        return False


def _sqlite_warnings(alias: str) -> list[checks.CheckMessage]:
    """Warn when a SQLite store would let a read-then-write transaction fail.

    A deferred transaction that reads before it writes cannot wait for the
    write lock (SQLITE_BUSY_SNAPSHOT), so an enqueue inside such a block can
    fail under load with "database is locked" whatever the timeout.
    """
    config = settings.DATABASES.get(alias, {})
    if "sqlite3" not in config.get("ENGINE", ""):
        return []
    mode = str(config.get("OPTIONS", {}).get("transaction_mode", "")).upper()
    if mode == "IMMEDIATE":
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}] is SQLite without transaction_mode 'IMMEDIATE'.",
            hint=(
                'Set "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20} so '
                "several processes can share the file without 'database is locked'."
            ),
            obj="settings.DATABASES",
            id="alkstore.W001",
        )
    ]


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Validate every ALKSTORE key at start-up."""
    raw = getattr(settings, "ALKSTORE", None)
    if raw is None:
        return _sqlite_warnings(app_settings.database)
    if not isinstance(raw, dict):
        return [
            _error(f"ALKSTORE is {type(raw).__name__}, not a dict.", "Use a dict.", "alkstore.E001")
        ]
    errors: list[checks.CheckMessage] = []
    for key in sorted(set(raw) - SETTING_KEYS):
        errors.append(
            _error(
                f"Unknown ALKSTORE key {key!r}.",
                f"Expected one of: {', '.join(sorted(SETTING_KEYS))}.",
                "alkstore.E001",
            )
        )
    for key in ("DATABASE", "LISTEN_DATABASE"):
        alias = raw.get(key)
        if alias is not None and alias not in settings.DATABASES:
            errors.append(
                _error(
                    f"ALKSTORE[{key!r}] is {alias!r}, which is not in DATABASES.",
                    f"Use one of: {', '.join(settings.DATABASES)}.",
                    "alkstore.E002",
                )
            )
    alias = app_settings.database
    if alias in settings.DATABASES:
        engine = settings.DATABASES[alias].get("ENGINE", "")
        if not any(vendor in engine for vendor in SUPPORTED_VENDORS):
            errors.append(
                _error(
                    f"ALKSTORE['DATABASE'] {alias!r} uses {engine!r}.",
                    "alkstore_django supports PostgreSQL (psycopg 3) and SQLite.",
                    "alkstore.E006",
                )
            )
    errors += _sqlite_warnings(alias)
    queues = raw.get("QUEUES", {})
    if not isinstance(queues, dict):
        errors.append(
            _error("ALKSTORE['QUEUES'] must be a dict.", "Map names to options.", "alkstore.E003")
        )
        queues = {}
    for name, opts in queues.items():
        try:
            validate_name("queue", name)
            if not isinstance(opts, dict):
                raise AlkstoreError(f"options are {type(opts).__name__}, not a dict")
            validate_queue_options(opts)
        except AlkstoreError as exc:
            errors.append(
                _error(
                    f"ALKSTORE['QUEUES'][{name!r}]: {exc}",
                    "Fix the queue options.",
                    "alkstore.E003",
                )
            )
    for key, id_ in (
        ("POLL_INTERVAL_S", "alkstore.E004"),
        ("SWEEP_INTERVAL_S", "alkstore.E004"),
        ("WORKER_TTL_S", "alkstore.E004"),
    ):
        if key in raw and not _positive_number(raw[key]):
            errors.append(
                _error(
                    f"ALKSTORE[{key!r}] is {raw[key]!r}.",
                    "Expected a positive number of seconds.",
                    id_,
                )
            )
    token = raw.get("METRICS_TOKEN")
    if token is not None and (not isinstance(token, str) or not token):
        errors.append(
            _error(
                f"ALKSTORE['METRICS_TOKEN'] is {token!r}.",
                "Expected a non-empty string (the bearer token of the metrics view), or None.",
                "alkstore.E008",
            )
        )
    errors += _check_schedules(raw)
    if "MAX_PAYLOAD_BYTES" in raw:
        value = raw["MAX_PAYLOAD_BYTES"]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            errors.append(
                _error(
                    f"ALKSTORE['MAX_PAYLOAD_BYTES'] is {value!r}.",
                    "Expected a positive integer number of bytes.",
                    "alkstore.E005",
                )
            )
    return errors


def _check_schedules(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Validate ``ALKSTORE["SCHEDULES"]``: each entry as ``store.schedule()`` would."""
    from .scheduler import SCHEDULE_KEYS, check_declaration

    if "SCHEDULES" not in raw:
        return []
    schedules = raw["SCHEDULES"]
    if not isinstance(schedules, dict):
        return [
            _error(
                f"ALKSTORE['SCHEDULES'] is {type(schedules).__name__}, not a dict.",
                "Map schedule names to dicts of spec, queue and options.",
                "alkstore.E007",
            )
        ]
    errors: list[checks.CheckMessage] = []
    for name, declaration in schedules.items():
        try:
            check_declaration(name, declaration)
        except AlkstoreError as exc:
            errors.append(
                _error(
                    f"ALKSTORE['SCHEDULES'][{name!r}]: {exc}",
                    f"Keys: {', '.join(sorted(SCHEDULE_KEYS))}; spec and queue are required.",
                    "alkstore.E007",
                )
            )
    return errors


def check_handlers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every queue that more than one handler claims (``jobs.py`` and ``TASKS``)."""
    return [
        checks.Error(
            message,
            hint=(
                "Keep one handler per queue: rename one @handler queue, or take the queue "
                "out of TASKS[...]['QUEUES'] when an AlkstoreBackend lists it."
            ),
            obj="alkstore_django.handlers.registry",
            id="alkstore.E201",
        )
        for message in registry.conflicts().values()
    ]


def check_environment(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse what the store cannot run on: PostgreSQL without psycopg 3, ``USE_TZ = False``."""
    errors: list[checks.CheckMessage] = []
    if not settings.USE_TZ:
        errors.append(
            checks.Error(
                "alkstore_django needs USE_TZ = True.",
                hint=(
                    "Run times, claim deadlines and schedule boundaries are instants on the "
                    "database clock: with USE_TZ = False, Django refuses timezone-aware "
                    "datetimes on SQLite and makes them naive on PostgreSQL, so "
                    "enqueue(run_at=...), schedules and runscheduler fail. "
                    "Set USE_TZ = True (Django's default)."
                ),
                obj="settings.USE_TZ",
                id="alkstore.E203",
            )
        )
    alias = app_settings.database
    if alias in settings.DATABASES and _is_postgresql(alias):
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            errors.append(
                checks.Error(
                    f"ALKSTORE['DATABASE'] {alias!r} is PostgreSQL, and psycopg 3 cannot be "
                    f"imported ({exc}).",
                    hint=(
                        "alkstore_django talks to PostgreSQL through psycopg 3 (psycopg2 is "
                        "not enough): pip install 'alkstore-django[postgres]'."
                    ),
                    obj="settings.DATABASES",
                    id="alkstore.E202",
                )
            )
    return errors


def _is_postgresql(alias: str) -> bool:
    try:
        return connections[alias].vendor == "postgresql"
    except ImproperlyConfigured:
        # Django could not load the backend at all (no psycopg, no psycopg2).
        engine = str(settings.DATABASES[alias].get("ENGINE", ""))
        return any(name in engine for name in POSTGRES_ENGINES)
