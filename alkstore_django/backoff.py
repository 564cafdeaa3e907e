"""Custom retry backoff: a ``(attempt, error) -> seconds`` callable over the equal-jitter curve.

A queue names one by dotted path (its ``backoff`` option) and a handler
brings its own (``@handler("q", backoff=func)``), which wins. Whatever the
callable does, a job is never lost to it: an exception, or a return value
that is not a finite number of seconds from 0 to ``MAX_DURATION_S``, falls
back to the curve with one warning naming the job, the callable and what
was wrong.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from .conf import app_settings
from .error_text import describe
from .errors import AlkstoreError, InvalidArgument
from .timing import backoff_s
from .validation import MAX_DURATION_S, preview, validate_duration

if TYPE_CHECKING:
    from .records import Job

logger = logging.getLogger("alkstore_django.worker")

Backoff = Callable[[int, Any], float]
# Where ``@handler(queue, backoff=...)`` keeps a handler's backoffs: queue -> callable.
# An attribute of the handler, as the Tasks runner's hooks are, so every holder of
# the handler (the worker, its child processes, the test helpers) finds it.
HANDLER_ATTR = "alkstore_backoffs"

__all__ = ["Backoff", "handler_backoff", "load_backoff", "retry_delay_s", "set_handler_backoff"]


def name_of(func: object) -> str:
    """Return ``module.qualname`` of a callable, or its repr when it has none."""
    qualname = getattr(func, "__qualname__", None)
    if qualname is None:
        return repr(func)
    return f"{getattr(func, '__module__', '?')}.{qualname}"


def check_backoff(value: object, what: str = "backoff") -> Backoff:
    """Return ``value`` when it can be a backoff: a plain (not ``async def``) callable."""
    if not is_backoff(value):
        raise InvalidArgument(
            f"Invalid {what} {value!r}: expected a callable (attempt, error) -> seconds "
            "(a plain function, not a class or an async def)."
        )
    return value  # type: ignore[return-value]


def is_backoff(value: object) -> bool:
    """True when ``value`` can be called as a backoff and return its delay."""
    return (
        callable(value) and not isinstance(value, type) and not inspect.iscoroutinefunction(value)
    )


@functools.cache
def load_backoff(path: str) -> Backoff:
    """Import the backoff at ``path`` once; raise ``InvalidArgument`` when it cannot be one.

    Only a success is cached: a path that fails is tried again at the next
    retry (and reported by the system check ``alkstore.E014``).
    """
    try:
        found = import_string(path)
    except ImportError as exc:
        raise InvalidArgument(f"Backoff {path!r} cannot be imported: {exc}") from exc
    if not is_backoff(found):
        raise InvalidArgument(
            f"Backoff {path!r} is {preview(found)}: expected a callable (attempt, error) -> "
            "seconds (a plain function, not a class or an async def)."
        )
    return found  # type: ignore[no-any-return]


def set_handler_backoff(func: Any, queue: str, backoff: Backoff) -> None:
    """Attach ``backoff`` to ``func`` as its backoff on ``queue``; refuse what cannot carry it."""
    backoffs = getattr(func, HANDLER_ATTR, None)
    try:
        if not isinstance(backoffs, dict):
            backoffs = {}
            setattr(func, HANDLER_ATTR, backoffs)
        backoffs[queue] = backoff
    except (AttributeError, TypeError) as exc:
        raise InvalidArgument(
            f"Handler {name_of(func)} cannot carry a backoff ({exc}): give its queue the "
            "'backoff' option instead."
        ) from exc


def handler_backoff(func: Any, queue: str) -> Backoff | None:
    """Return the backoff ``@handler(queue, backoff=...)`` gave ``func``, or None."""
    for holder in (func, getattr(func, "func", None)):  # functools.partial: the test helpers
        backoffs = getattr(holder, HANDLER_ATTR, None)
        if isinstance(backoffs, dict) and queue in backoffs:
            return backoffs[queue]  # type: ignore[no-any-return]
    return None


def queue_backoff_path(queue: str) -> str | None:
    """Return the ``backoff`` option ``ALKSTORE["QUEUES"][queue]`` gives, or None."""
    opts = app_settings.queues.get(queue)
    path = opts.get("backoff") if isinstance(opts, dict) else None
    return path if isinstance(path, str) else None


def retry_delay_s(
    job: Job, error: BaseException | str | None, backoff: Backoff | None, path: str | None
) -> float:
    """Return the delay before ``job``'s next attempt, its attempt ``job.attempts`` having failed.

    ``backoff`` (a handler's) wins over ``path`` (the queue's option); with
    neither, or when the chosen one raises or returns a bad value, it is the
    equal-jitter curve of the job's ``retry_base_s``. Never raises but
    ``KeyboardInterrupt``.
    """
    if backoff is None and path is None:
        return backoff_s(job.attempts, job.retry_base_s)
    name = path if backoff is None else name_of(backoff)
    func = backoff
    try:
        if func is None:
            func = load_backoff(path)  # type: ignore[arg-type]
        value = func(job.attempts, error)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of user code falls back
        loading = func is None and isinstance(exc, AlkstoreError)
        return _fallback(job, name, str(exc) if loading else f"it raised {_text(exc)}")
    try:
        return validate_duration("backoff delay", value)  # type: ignore[return-value]
    except InvalidArgument:
        return _fallback(
            job, name, f"it returned {preview(value)}, not seconds from 0 to {MAX_DURATION_S}"
        )


def _fallback(job: Job, name: str | None, problem: str) -> float:
    delay_s = backoff_s(job.attempts, job.retry_base_s)
    logger.warning(
        "backoff failed id=%s queue=%s attempt=%s backoff=%s: %s; retrying in %ss "
        "on the equal-jitter curve instead",
        job.id,
        job.queue,
        job.attempts,
        name,
        problem,
        delay_s,
    )
    return delay_s


def _text(exc: BaseException) -> str:
    return describe(exc)[:500]
