"""The one safe path from an exception to stored text.

Handler code is hostile by accident: a message with a NUL byte (PostgreSQL's
text refuses it), a lone surrogate from an odd file name (UTF-8 cannot encode
it), a five-megabyte message, an exception whose ``__str__`` raises. Whatever
writes error text — the worker, a handle, the outbox, the Tasks runner, the
test helpers, the log line — goes through here, so none of them can be
wedged by what it is asked to store.
"""

from __future__ import annotations

import traceback

# Room for a long traceback's tail, far below any column or log line limit.
MAX_ERROR_CHARS = 65_536
# The log line repeats only the start of the error: the stored text has the rest.
MAX_LOGGED_ERROR_CHARS = 1_000
# The width of ``Attempt.exception_class``: a longer class path is shortened to it.
MAX_CLASS_PATH_CHARS = 500
# Of a capped text, this share is kept from its end (a traceback's end says most).
_TAIL_SHARE = 3 / 4


TIMED_OUT_PREFIX = "timed out after "


def timed_out(limit_s: float) -> str:
    """Return the error of a run stopped at its time limit (both pools write this)."""
    return f"{TIMED_OUT_PREFIX}{limit_s:g} s"


def unrecorded(kind: str, exc: BaseException) -> str:
    """Return the stored error of an outcome that could not be recorded (the attempt fails)."""
    return f"the {kind} outcome could not be recorded: {describe(exc)}"


def clean_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Return ``text`` storable by every engine: no NUL, no lone surrogate, at most ``limit``.

    NUL and lone surrogates become visible escapes (``\\x00``, ``\\udc80``);
    a text over ``limit`` keeps its start and, mostly, its end, with the
    number of characters cut in between.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= limit:
        return text
    tail = int(limit * _TAIL_SHARE)
    marker = f"\n… [{len(text) - limit} characters cut] …\n"
    head = max(limit - tail - len(marker), 0)
    return text[:head] + marker + text[len(text) - tail :]


def describe(exc: BaseException) -> str:
    """Return ``ExceptionType: message`` for ``exc``, cleaned; never raises.

    An exception whose ``__str__`` raises is named as such instead.
    """
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException as broken:  # noqa: BLE001 - any failure of hostile __str__ code
        message = f"<str() raised {type(broken).__name__}>"
    return clean_text(f"{name}: {message}" if message else name)


def message_of(exc: BaseException, default: str) -> str:
    """Return ``str(exc)`` cleaned, or ``default`` when it is empty or cannot be read.

    For ``Fail``: its message is the reason an operator reads, kept verbatim.
    """
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - any failure of hostile __str__ code
        return describe(exc)
    return clean_text(message) if message else default


def error_text(value: object) -> str:
    """Return what a caller passed as an error as storable text: a string cleaned, an
    exception described, anything else by its ``str()``; never raises."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, BaseException):
        return describe(value)
    try:
        return clean_text(str(value))
    except BaseException:  # noqa: BLE001 - any failure of hostile __str__ code
        return f"<unprintable {type(value).__name__}>"


def class_path(exc: BaseException) -> str:
    """Return the import path of ``exc``'s class, as Django's Tasks errors name it.

    Cleaned, and at most ``MAX_CLASS_PATH_CHARS``: a longer path (a class
    made at run time can have any name) keeps its start and its end around
    an ellipsis, so recording the attempt cannot fail on its width.
    """
    kind = type(exc)
    path = clean_text(f"{kind.__module__}.{kind.__qualname__}")
    if len(path) <= MAX_CLASS_PATH_CHARS:
        return path
    head = MAX_CLASS_PATH_CHARS // 4
    return path[:head] + "…" + path[len(path) - (MAX_CLASS_PATH_CHARS - head - 1) :]


def format_traceback(exc: BaseException) -> str:
    """Return ``exc``'s traceback as text, cleaned and capped; never raises."""
    try:
        text = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001 - a traceback that cannot be formatted
        text = describe(exc) + "\n(the traceback could not be formatted)\n"
    return clean_text(text)


def loggable(text: str | None) -> str:
    """Return the start of an already-clean error for one log line."""
    if text is None:
        return ""
    return clean_text(text, MAX_LOGGED_ERROR_CHARS)
