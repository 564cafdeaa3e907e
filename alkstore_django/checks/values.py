"""The checks of ``settings.ALKSTORE``'s plain values: keys, durations, sizes, codec, schedules.

Each names the bad key and what is allowed; ``check_settings`` (the package)
runs them with the checks of the databases, the router and the queues.
"""

from __future__ import annotations

import math
from typing import Any

from django.core import checks

from ..conf import MAX_NOTIFY_COALESCE_S, SETTING_KEYS, load_codec
from ..errors import AlkstoreError


def error(msg: str, hint: str, id_: str) -> checks.Error:
    return checks.Error(msg, hint=hint, obj="settings.ALKSTORE", id=id_)


def positive_number(value: Any) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an int too large for a float is no sane interval
        return False


def check_intervals(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Refuse an interval or a retention that is not a positive number of seconds (E004).

    And a wake-up window outside 0 to ``MAX_NOTIFY_COALESCE_S`` (E015): it is
    how late an idle worker may see a job; more than a second would be a poll.
    """
    found: list[checks.CheckMessage] = [
        error(
            f"ALKSTORE[{key!r}] is {raw[key]!r}.",
            "Expected a positive number of seconds.",
            "alkstore.E004",
        )
        for key in (
            "POLL_INTERVAL_S",
            "SWEEP_INTERVAL_S",
            "WORKER_TTL_S",
            "WORKFLOW_RETENTION_S",
            "THROUGHPUT_RETENTION_S",
            "SCHEDULE_FIRE_RETENTION_S",
        )
        if key in raw and not positive_number(raw[key])
    ]
    window = raw.get("NOTIFY_COALESCE_S", 0)
    if isinstance(window, bool) or not (
        window == 0 or (positive_number(window) and window <= MAX_NOTIFY_COALESCE_S)
    ):
        found.append(
            error(
                f"ALKSTORE['NOTIFY_COALESCE_S'] is {window!r}.",
                f"Expected a number of seconds from 0 (a wake-up with every enqueue) to "
                f"{MAX_NOTIFY_COALESCE_S:g}.",
                "alkstore.E015",
            )
        )
    return found


def check_metrics_token(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Refuse a ``METRICS_TOKEN`` that is neither a non-empty string nor None (E009)."""
    token = raw.get("METRICS_TOKEN")
    if token is None or (isinstance(token, str) and token):
        return []
    return [
        error(
            f"ALKSTORE['METRICS_TOKEN'] is {token!r}.",
            "Expected a non-empty string (the bearer token of the metrics view), or None.",
            "alkstore.E009",
        )
    ]


def check_positive_integers(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Refuse a ``MAX_PAYLOAD_BYTES`` or ``PRUNE_BATCH_SIZE`` that is not a positive int (E005)."""
    return [
        error(
            f"ALKSTORE[{key!r}] is {raw[key]!r}.",
            f"Expected a positive integer {what}.",
            "alkstore.E005",
        )
        for key, what in (("MAX_PAYLOAD_BYTES", "number of bytes"), ("PRUNE_BATCH_SIZE", "of rows"))
        if key in raw
        and not (isinstance(raw[key], int) and not isinstance(raw[key], bool) and raw[key] > 0)
    ]


def check_codec(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Refuse a ``PAYLOAD_CODEC`` that cannot be imported or lacks encode/decode."""
    path = raw.get("PAYLOAD_CODEC")
    if path is None:
        return []
    hint = (
        "Name a class or instance with encode(payload) -> str and decode(value), such as "
        "'alkstore_django.codecs.DjangoJSONCodec'."
    )
    if not isinstance(path, str):
        return [
            error(
                f"ALKSTORE['PAYLOAD_CODEC'] is {path!r}, not a dotted path.", hint, "alkstore.E010"
            )
        ]
    try:
        codec = load_codec(path)
    except Exception as exc:  # noqa: BLE001 - whatever the import or constructor raised
        return [
            error(
                f"ALKSTORE['PAYLOAD_CODEC'] {path!r} cannot be loaded: {exc}", hint, "alkstore.E010"
            )
        ]
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        return [
            error(
                f"ALKSTORE['PAYLOAD_CODEC'] {path!r} has no encode/decode.", hint, "alkstore.E010"
            )
        ]
    return []


def check_schedules(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Validate ``ALKSTORE["SCHEDULES"]``: each entry as ``store.schedule()`` would."""
    from ..scheduler.registry import SCHEDULE_KEYS, check_declaration

    if "SCHEDULES" not in raw:
        return []
    schedules = raw["SCHEDULES"]
    if not isinstance(schedules, dict):
        return [
            error(
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
                error(
                    f"ALKSTORE['SCHEDULES'][{name!r}]: {exc}",
                    f"Keys: {', '.join(sorted(SCHEDULE_KEYS))}; spec and queue are required.",
                    "alkstore.E007",
                )
            )
    return errors


def check_keys(raw: dict[str, Any]) -> list[checks.CheckMessage]:
    """Refuse keys ALKSTORE does not have (E001)."""
    return [
        error(
            f"Unknown ALKSTORE key {key!r}.",
            f"Expected one of: {', '.join(sorted(SETTING_KEYS))}.",
            "alkstore.E001",
        )
        for key in sorted(set(raw) - SETTING_KEYS)
    ]
