"""System checks for ``settings.ALKSTORE``; ``manage.py check`` names the bad key."""

from __future__ import annotations

import importlib
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.urls import URLPattern, URLResolver, get_resolver

from ..backoff import load_backoff
from ..conf import (
    QUEUE_DATABASE_KEY,
    QUEUE_SETTING_NAMES,
    app_settings,
)
from ..errors import AlkstoreError
from ..handlers import registry
from ..validation import validate_name, validate_queue_limits, validate_queue_options
from . import values
from .values import error


def register() -> None:
    checks.register(check_settings, checks.Tags.compatibility)
    checks.register(check_handlers, checks.Tags.compatibility)
    checks.register(check_environment, checks.Tags.compatibility)
    checks.register(check_database_server, checks.Tags.database)
    checks.register(check_schedule_handlers, checks.Tags.compatibility)
    checks.register(check_metrics_view, checks.Tags.urls)


def _engine_checks(alias: str, key: str = "ALKSTORE['DATABASE']") -> list[checks.CheckMessage]:
    """Refuse a database engine alkstore has no dialect for; let the engine check its settings.

    ``key`` names the setting that chose ``alias``, for the messages.
    """
    from ..dialects import SUPPORTED, dialect_class

    if alias not in settings.DATABASES:
        return []
    try:
        vendor = connections[alias].vendor
    except ImproperlyConfigured as exc:
        # Django cannot load the backend at all (PostgreSQL without any driver).
        return [
            error(
                f"{key} {alias!r} cannot be used: {exc}",
                "Install the engine's driver: pip install 'alkstore-django[postgres]' "
                "(or [mysql]).",
                "alkstore.E204",
            )
        ]
    cls = dialect_class(vendor)
    if cls is None:
        engine = settings.DATABASES[alias].get("ENGINE", "")
        return [
            error(
                f"{key} {alias!r} uses {engine!r} (vendor {vendor!r}).",
                f"alkstore_django supports {SUPPORTED}.",
                "alkstore.E006",
            )
        ]
    return cls.check_settings(alias, settings.DATABASES[alias])


def check_database_server(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Refuse a server too old for alkstore's claims (``migrate``, ``check --database``)."""
    from ..dialects import dialect_class, dialect_for

    alias = app_settings.database
    if not databases or alias not in databases or alias not in settings.DATABASES:
        return []
    if dialect_class(connections[alias].vendor) is None:
        return []
    problem = dialect_for(alias).server_problem()
    if problem is None:
        return []
    return [
        checks.Error(
            f"DATABASES[{alias!r}]: {problem}",
            hint="Upgrade the database server.",
            obj="settings.DATABASES",
            id="alkstore.E008",
        )
    ]


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Validate every ALKSTORE key at start-up, each by the named check for its key."""
    raw = getattr(settings, "ALKSTORE", None)
    if raw is None:
        return _engine_checks(app_settings.database)
    if not isinstance(raw, dict):
        return [
            error(f"ALKSTORE is {type(raw).__name__}, not a dict.", "Use a dict.", "alkstore.E001")
        ]
    engine = _engine_checks(app_settings.database)
    # The router is judged once the database itself is usable.
    routing = [] if any(m.is_serious() for m in engine) else _check_router()
    return [
        *values.check_keys(raw),
        *_check_aliases(raw),
        *engine,
        *routing,
        *_check_queues(raw),
        *values.check_intervals(raw),
        *values.check_metrics_token(raw),
        *values.check_codec(raw),
        *values.check_schedules(raw),
        *values.check_positive_integers(raw),
    ]


def _check_aliases(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Refuse a ``DATABASE`` or ``LISTEN_DATABASE`` missing from ``DATABASES`` (E002)."""
    errors: list[checks.CheckMessage] = []
    for key in ("DATABASE", "LISTEN_DATABASE"):
        alias = raw.get(key)
        if alias is not None and alias not in settings.DATABASES:
            errors.append(
                error(
                    f"ALKSTORE[{key!r}] is {alias!r}, which is not in DATABASES.",
                    f"Use one of: {', '.join(settings.DATABASES)}.",
                    "alkstore.E002",
                )
            )
    return errors


def _check_queues(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Check ``QUEUES``: a dict (E003) of named queues with valid options (E003, E011, E012)."""
    queues = raw.get("QUEUES", {})
    if not isinstance(queues, dict):
        return [
            error("ALKSTORE['QUEUES'] must be a dict.", "Map names to options.", "alkstore.E003")
        ]
    errors: list[checks.CheckMessage] = []
    for name, opts in queues.items():
        try:
            validate_name("queue", name)
            if not isinstance(opts, dict):
                raise AlkstoreError(f"options are {type(opts).__name__}, not a dict")
            validate_queue_options({k: v for k, v in opts.items() if k not in QUEUE_SETTING_NAMES})
        except AlkstoreError as exc:
            errors.append(
                error(
                    f"ALKSTORE['QUEUES'][{name!r}]: {exc}",
                    "Fix the queue options.",
                    "alkstore.E003",
                )
            )
            continue
        errors += _check_limits(name, opts)
        errors += _check_backoff(name, opts)
        errors += _check_queue_database(name, opts)
    return errors


def _check_queue_database(name: str, opts: dict[str, Any]) -> list[checks.CheckMessage]:
    """Refuse a queue ``database`` that is not an alias of ``DATABASES`` (E002)."""
    if QUEUE_DATABASE_KEY not in opts:
        return []
    alias = opts[QUEUE_DATABASE_KEY]
    if isinstance(alias, str) and alias in settings.DATABASES:
        key = f"ALKSTORE['QUEUES'][{name!r}]['database']"
        return _engine_checks(alias, key) if alias != app_settings.database else []
    return [
        error(
            f"ALKSTORE['QUEUES'][{name!r}]['database'] is {alias!r}, which is not in DATABASES.",
            f"Use one of: {', '.join(settings.DATABASES)}.",
            "alkstore.E002",
        )
    ]


def _check_router() -> list[checks.CheckMessage]:
    """Warn when alkstore lives off ``default`` but no router sends its tables there (W006).

    Judged by what the configured routers answer, so a site's own router that
    does the same passes: alkstore's models written to ``DATABASE``, and its
    migrations kept off every alias that holds none of its queues.
    """
    from django.db import router

    from ..models import Job

    aliases = app_settings.aliases
    if aliases == [DEFAULT_DB_ALIAS] or any(a not in settings.DATABASES for a in aliases):
        return []
    stray = [
        alias
        for alias in settings.DATABASES
        if alias not in aliases and router.allow_migrate(alias, Job._meta.app_label)
    ]
    written = router.db_for_write(Job)
    problems = [f"migrate creates them on {', '.join(map(repr, stray))} too"] if stray else []
    if written != app_settings.database:
        problems.append(f"the ORM reads and writes them on {written!r}")
    if not problems:
        return []
    return [
        checks.Warning(
            f"alkstore's tables live on {', '.join(map(repr, aliases))}, but "
            f"{' and '.join(problems)}.",
            hint="Add 'alkstore_django.routers.AlkstoreRouter' to DATABASE_ROUTERS (first), "
            "then run migrate --database for each of those aliases (docs/scale.md).",
            obj="settings.DATABASE_ROUTERS",
            id="alkstore.W006",
        )
    ]


def _check_backoff(name: str, opts: dict[str, Any]) -> list[checks.CheckMessage]:
    """Refuse a queue ``backoff`` path that cannot be imported or is not a callable (E014)."""
    path = opts.get("backoff")
    if path is None:
        return []
    try:
        load_backoff(path)
    except Exception as exc:  # noqa: BLE001 - whatever importing the module raised
        problem = (
            str(exc)
            if isinstance(exc, AlkstoreError)
            else f"Backoff {path!r} cannot be imported: {type(exc).__name__}: {exc}"
        )
        return [
            error(
                f"ALKSTORE['QUEUES'][{name!r}]['backoff']: {problem}",
                "Name a function (attempt, error) -> seconds, e.g. 'myapp.jobs.backoff'.",
                "alkstore.E014",
            )
        ]
    return []


def _check_limits(name: str, opts: dict[str, Any]) -> list[checks.CheckMessage]:
    """Check a queue's ``max_running`` (E011), ``rate`` (E012), ``max_running_per_key`` (E013)."""
    errors: list[checks.CheckMessage] = []
    for key, id_, hint in (
        ("max_running", "alkstore.E011", "Expected an integer of at least 1, or no key."),
        ("rate", "alkstore.E012", "Expected '<n>/<unit>' with unit s, m or h, e.g. '100/m'."),
        (
            "max_running_per_key",
            "alkstore.E013",
            "Expected an integer of at least 1 (jobs of one concurrency_key running at once).",
        ),
    ):
        if key not in opts:
            continue
        try:
            validate_queue_limits({key: opts[key]})
        except AlkstoreError as exc:
            errors.append(error(f"ALKSTORE['QUEUES'][{name!r}][{key!r}]: {exc}", hint, id_))
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
    """Refuse what the store cannot run on: ``USE_TZ = False``."""
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
    return errors


def check_schedule_handlers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn of a declared schedule whose queue has no handler: its jobs would wait forever."""
    schedules = getattr(settings, "ALKSTORE", None)
    schedules = schedules.get("SCHEDULES") if isinstance(schedules, dict) else None
    if not isinstance(schedules, dict):
        return []  # a bad ALKSTORE or SCHEDULES is E001 or E007
    handled = set(registry.queues())
    return [
        checks.Warning(
            f"ALKSTORE['SCHEDULES'][{name!r}] targets queue {declaration['queue']!r}, "
            "which has no handler: its jobs are enqueued and never run.",
            hint="Add a @handler for the queue in a jobs.py, or correct the schedule's queue.",
            obj="settings.ALKSTORE",
            id="alkstore.W004",
        )
        for name, declaration in schedules.items()
        if isinstance(declaration, dict)
        and isinstance(declaration.get("queue"), str)
        and declaration["queue"] not in handled
    ]


METRICS_VIEW = "alkstore_django.metrics.metrics_view"


def _routes_metrics_view(patterns: Any) -> str | None:
    """Return the route of the first URL pattern in ``patterns`` served by ``metrics_view``."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            found = _routes_metrics_view(pattern.url_patterns)
            if found is not None:
                return f"{pattern.pattern}{found}"
        elif isinstance(pattern, URLPattern):
            callback = pattern.callback
            path = f"{getattr(callback, '__module__', '')}.{getattr(callback, '__qualname__', '')}"
            if path == METRICS_VIEW:
                return str(pattern.pattern)
    return None


def check_metrics_view(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn when the URLconf routes to ``metrics_view`` and prometheus-client is missing."""
    try:
        importlib.import_module("prometheus_client")
    except ImportError:
        pass
    else:
        return []
    if not getattr(settings, "ROOT_URLCONF", None):
        return []  # a worker-only settings module: nothing is routed
    try:
        route = _routes_metrics_view(get_resolver().url_patterns)
    except (ImportError, ImproperlyConfigured):
        return []  # a URLconf that cannot load is Django's own check error
    if route is None:
        return []
    return [
        checks.Warning(
            f"The URLconf routes {route!r} to {METRICS_VIEW}, but prometheus_client cannot "
            "be imported: every scrape fails with a server error.",
            hint="pip install 'alkstore-django[metrics]' (or prometheus-client).",
            obj=METRICS_VIEW,
            id="alkstore.W005",
        )
    ]
