"""Argument validators: every public call runs these before touching the database."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, Literal

from .conf import QUEUE_LIMIT_NAMES, QUEUE_OPTION_NAMES, QueueLimits
from .errors import InvalidArgument, InvalidName, PayloadError, ReservedName
from .timing import parse_rate

RESERVED_PREFIX = "__alkstore"
# A b-tree entry must stay well under PostgreSQL's ~2,700-byte limit, so names
# are capped in characters (4 bytes each at worst in UTF-8).
MAX_NAME_LENGTH = 200
# One hundred years: far past any real delay, well inside every datetime range.
MAX_DURATION_S = 100 * 365 * 86_400
MAX_INT32 = 2**31 - 1
MAX_ID = 2**63 - 1
# A JSON string (kept as is) or a float Python wrote with a positive exponent.
_STRING_OR_EXPONENT_FLOAT = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(-?\d+(?:\.\d+)?[eE]\+\d+)')
# json.dumps writes U+0000 as this escape; an odd run of backslashes before it is the escape.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# Built once: json.dumps with any option builds a new encoder on every call.
strict_json = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode


def is_encodable(text: str) -> bool:
    """Return True when ``text`` can be stored as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validate_name(kind: str, name: object, *, allow_reserved: bool = False) -> str:
    """Return ``name`` when it is a usable name of ``kind``; raise otherwise."""
    if not isinstance(name, str) or not name:
        raise InvalidName(f"Invalid {kind} name {name!r}: expected a non-empty string.")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(
            f"Invalid {kind} name {name[:40]!r}… ({len(name)} characters): "
            f"expected at most {MAX_NAME_LENGTH} characters."
        )
    if "\x00" in name:
        raise InvalidName(f"Invalid {kind} name {name!r}: NUL characters are not allowed.")
    if not is_encodable(name):
        raise InvalidName(f"Invalid {kind} name {name!r}: lone surrogates are not allowed.")
    if not allow_reserved and name.startswith(RESERVED_PREFIX):
        raise ReservedName(
            f"Reserved {kind} name {name!r}: names beginning with {RESERVED_PREFIX!r} "
            "belong to alkstore_django."
        )
    return name


def validate_worker_id(worker_id: object) -> str:
    """Return ``worker_id`` when it is a non-empty string of at most 200 characters."""
    if (
        not isinstance(worker_id, str)
        or not worker_id
        or len(worker_id) > MAX_NAME_LENGTH
        or not is_encodable(worker_id)
    ):
        raise InvalidArgument(
            f"Invalid worker_id {worker_id!r}: expected a non-empty string of at most "
            f"{MAX_NAME_LENGTH} characters."
        )
    return worker_id


#: What a keyed enqueue does when its key is taken: return the holder's id, or raise.
OnDuplicate = Literal["return", "raise"]
ON_DUPLICATE = ("return", "raise")


def validate_unique_key(value: object) -> str:
    """Return ``value`` when it is a non-empty string of at most 200 characters (a unique key)."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_NAME_LENGTH
        or "\x00" in value
        or not is_encodable(value)
    ):
        shown = value[:40] + "…" if isinstance(value, str) and len(value) > 40 else value
        raise InvalidArgument(
            f"Invalid unique_key {shown!r}: expected a non-empty string of at most "
            f"{MAX_NAME_LENGTH} characters, without NUL or lone surrogates."
        )
    return value


def validate_concurrency_key(value: object) -> str:
    """Return ``value`` when it is a usable ``concurrency_key`` (the rules of a unique key)."""
    try:
        return validate_unique_key(value)
    except InvalidArgument:
        shown = value[:40] + "…" if isinstance(value, str) and len(value) > 40 else value
        raise InvalidArgument(
            f"Invalid concurrency_key {shown!r}: expected a non-empty string of at most "
            f"{MAX_NAME_LENGTH} characters, without NUL or lone surrogates."
        ) from None


# A tag: lowercase, so that one LIKE matches it alike on every engine (SQLite's
# LIKE ignores ASCII case, MariaDB's binary collation does not); no comma, the
# stored separator.
_TAG = re.compile(r"[a-z0-9][a-z0-9_.:/=@+#-]{0,63}")
MAX_TAGS = 20


def validate_tag(value: object) -> str:
    """Return ``value`` when it is a tag: 1 to 64 of ``a-z 0-9 _ . : / = @ + # -``."""
    if not isinstance(value, str) or not _TAG.fullmatch(value):
        raise InvalidArgument(
            f"Invalid tag {value!r}: expected 1 to 64 characters of lowercase a-z, 0-9 and "
            "_ . : / = @ + # - (starting with a letter or digit), e.g. 'customer:7'."
        )
    return value


def validate_tags(value: object) -> tuple[str, ...]:
    """Return ``value`` as a tuple of distinct tags, in order; at most ``MAX_TAGS``."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        raise InvalidArgument(
            f"Invalid tags {value!r}: expected a list of tags, e.g. ['customer:7', 'import']."
        )
    tags = tuple(dict.fromkeys(validate_tag(tag) for tag in value))
    if len(tags) > MAX_TAGS:
        raise InvalidArgument(f"Invalid tags: {len(tags)} tags; expected at most {MAX_TAGS}.")
    return tags


def validate_on_duplicate(value: object) -> OnDuplicate:
    """Return ``value`` when it is one of ``ON_DUPLICATE``."""
    if value not in ON_DUPLICATE:
        raise InvalidArgument(
            f"Invalid on_duplicate {value!r}: expected 'return' (the holder's id) or 'raise' "
            "(DuplicateJob)."
        )
    return value  # type: ignore[return-value]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def validate_duration(
    name: str, value: object, *, allow_zero: bool = True, allow_none: bool = False
) -> float | None:
    """Return ``value`` as seconds when it is a finite, non-negative, sane duration."""
    if value is None and allow_none:
        return None
    lower = "0" if allow_zero else "greater than 0"
    if (
        not _is_number(value)
        # Only floats can be NaN or infinite; math.isfinite overflows on huge ints.
        or (isinstance(value, float) and not math.isfinite(value))
        or value < 0  # type: ignore[operator]
        or (value == 0 and not allow_zero)
        or value > MAX_DURATION_S  # type: ignore[operator]
    ):
        allowed = f"a number of seconds from {lower} to {MAX_DURATION_S}"
        if allow_none:
            allowed += ", or None"
        raise InvalidArgument(f"Invalid {name} {value!r}: expected {allowed}.")
    return value  # type: ignore[return-value]


def validate_int(name: str, value: object, *, minimum: int, maximum: int = MAX_INT32) -> int:
    """Return ``value`` when it is an integer in ``[minimum, maximum]``."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise InvalidArgument(
            f"Invalid {name} {value!r}: expected an integer from {minimum} to {maximum}."
        )
    return value


def parse_id(text: str) -> int | None:
    """Return ``text`` as a row id when it is a whole ASCII number an id column holds, else None.

    ``str.isdigit()`` alone accepts superscripts such as ``²``, which ``int()`` refuses.
    """
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return number if number <= MAX_ID else None


def validate_priority(value: object) -> int:
    """Return ``value`` when it fits the priority column."""
    return validate_int("priority", value, minimum=-MAX_INT32 - 1)


def validate_max_attempts(value: object) -> int:
    """Return ``value`` when it is at least 1."""
    return validate_int("max_attempts", value, minimum=1)


def validate_queue_limits(opts: dict[str, Any]) -> QueueLimits | None:
    """Return the claim-time limits of a queue's settings, or None when it has none.

    ``max_running`` and ``max_running_per_key`` are integers of at least 1;
    ``rate`` is ``'<n>/<unit>'`` (unit s, m or h). Raises ``InvalidArgument``
    naming the bad value.
    """
    if QUEUE_LIMIT_NAMES.isdisjoint(opts):
        return None
    max_running, rate = opts.get("max_running"), opts.get("rate")
    per_key = opts.get("max_running_per_key")
    if max_running is not None:
        max_running = validate_int("max_running", max_running, minimum=1)
    if per_key is not None:
        per_key = validate_int("max_running_per_key", per_key, minimum=1)
    starts, period_s = parse_rate(rate) if rate is not None else (None, None)
    if max_running is None and starts is None and per_key is None:
        return None
    return QueueLimits(
        max_running=max_running,
        rate_starts=starts,
        rate_period_s=period_s,
        max_running_per_key=per_key,
    )


def validate_run_at(value: object) -> datetime:
    """Return ``value`` when it is a timezone-aware datetime."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidArgument(f"Invalid run_at {value!r}: expected a timezone-aware datetime.")
    return value


def validate_queue_options(opts: dict[str, Any], *, source: str = "queue option") -> dict[str, Any]:
    """Return ``opts`` when every key is a queue option and every value is in range."""
    unknown = sorted(set(opts) - QUEUE_OPTION_NAMES)
    if unknown:
        raise InvalidArgument(
            f"Unknown {source} {unknown[0]!r}: expected one of "
            f"{', '.join(sorted(QUEUE_OPTION_NAMES))}."
        )
    checked: dict[str, Any] = {}
    for key, value in opts.items():
        if key == "visibility_timeout_s":
            checked[key] = validate_duration(key, value, allow_zero=False)
        elif key == "max_attempts":
            checked[key] = validate_max_attempts(value)
        elif key == "max_snoozes":
            checked[key] = validate_int(key, value, minimum=0)
        elif key in ("retry_base_s", "cancel_grace_s"):
            checked[key] = validate_duration(key, value)
        elif key == "priority":
            checked[key] = validate_priority(value)
        elif key == "backoff":
            checked[key] = validate_backoff_path(value)
        elif key in ("expires_s", "timeout_s", "keep_result_s"):
            checked[key] = validate_duration(key, value, allow_zero=False, allow_none=True)
        else:
            checked[key] = validate_duration(key, value, allow_none=True)
    return checked


def validate_backoff_path(value: object) -> str | None:
    """Return ``value`` when it is None or a dotted path (imported when a retry needs it)."""
    if value is None or (isinstance(value, str) and "." in value and value.strip() == value):
        return value
    raise InvalidArgument(
        f"Invalid backoff {value!r}: expected the dotted path of a callable "
        "(attempt, error) -> seconds, e.g. 'myapp.jobs.backoff', or None."
    )


def encode_payload(
    payload: Any,
    max_bytes: int,
    to_json: Callable[[Any], str] = strict_json,
    *,
    what: str = "Payload",
) -> str:
    """Return ``payload`` as compact JSON text, refusing what cannot be stored.

    ``to_json`` is the payload codec's encoder (strict JSON by default); its
    text is held to the same rules whatever the codec. ``what`` names the
    value in the errors (a handler's return value is held to the same rules).
    """
    try:
        text = to_json(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"{what} {preview(payload)} cannot be encoded as JSON: {exc}.") from exc
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        # PostgreSQL's jsonb cannot store U+0000; refuse it on every engine alike.
        raise PayloadError(f"{what} {preview(payload)} contains U+0000, which cannot be stored.")
    if "e+" in text:
        # jsonb keeps a number's decimal digits, not its float-ness: 1e+300 would come
        # back as the integer 10**300. The float's exact value with a ".0" comes back equal.
        text = _STRING_OR_EXPONENT_FLOAT.sub(_exact_float, text)
    try:
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise PayloadError(
            f"{what} {preview(payload)} contains a lone surrogate, which cannot be stored."
        ) from exc
    if size > max_bytes:
        raise PayloadError(
            f"{what} of {size} bytes is larger than MAX_PAYLOAD_BYTES ({max_bytes})."
        )
    return text


def _exact_float(match: re.Match[str]) -> str:
    number = match.group(1)
    return match.group(0) if number is None else f"{int(float(number))}.0"


def preview(payload: Any) -> str:
    """Return ``payload``'s repr for an error message, cut to 80 characters."""
    try:
        text = repr(payload)
    except Exception:  # noqa: BLE001 - too deep, too many digits, or a hostile __repr__
        return f"<unprintable {type(payload).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."
