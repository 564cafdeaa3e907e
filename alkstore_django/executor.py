"""One handler run and its outcome: the single mapping from what a handler did to its effect.

Everything that runs handlers goes through here — the worker's threads, its
sentinel, the outbox's ``run_once``, the test helpers and the Tasks runner —
so they agree on what an exception means and on the text that is stored:

- a return is an ack (the value is kept for the handler's ``on_acked`` hook);
- ``Fail`` dead-letters at once with its message;
- ``Snooze(delay_s)`` puts the job off without spending an attempt;
- ``Cancelled`` (``Store.cancel_job`` reached the run) ends the job
  ``cancelled``: deleted under its claim, no retry, no dead letter;
- any other exception is a failed attempt, retried with backoff or
  dead-lettered when no attempt is left, stored as ``ExceptionType: message``.

A job that was claimed but never started (its queue paused, the worker
stopping) has the outcome ``release``: its attempt goes back with it.

``settle`` then applies an outcome in one transaction with the handler's
hooks and says what became of the job. The kinds (``OutcomeKind``) and the
results (``Settled``) are string enums, so what is logged and stored is the
plain text. A failure to record an outcome that is not a lost connection (a
``DataError``, a hook that raises) is contained to that job: it is recorded
as a failed attempt with the reason instead, and the worker carries on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.db import InterfaceError, OperationalError, close_old_connections
from django.db.backends.signals import connection_created

from . import results
from .backoff import handler_backoff, queue_backoff_path, retry_delay_s
from .error_text import (
    MAX_LOGGED_ERROR_CHARS,
    class_path,
    describe,
    format_traceback,
    loggable,
    message_of,
    unrecorded,
)
from .errors import Cancelled, Fail, Snooze, TimeLimitExceeded
from .history import record_attempt
from .models import ResultState, StepState
from .queues.handles import snoozed_out
from .records import OutcomeKind, Settled
from .runs import Run, bind, unbind
from .signals import job_finished, job_started, send_robust
from .tracing import end_run, start_run
from .workflows.progress import finish_step, lock

if TYPE_CHECKING:
    from .models import Workflow
    from .queues.handles import JobHandle
    from .records import Job

logger = logging.getLogger("alkstore_django.worker")

__all__ = [
    "ACK",
    "CONNECTION_ERRORS",
    "Outcome",
    "OutcomeKind",
    "Settled",
    "arun_handler",
    "call_handler",
    "cancelled_error",
    "finished",
    "has_hooks",
    "outcome_of",
    "run_handler",
    "run_job",
    "settle",
    "settles_alone",
    "tidy_connections",
]

# Only these mean "the database is unreachable": the caller retries the whole
# outcome later. Any other error while recording one outcome belongs to that job.
CONNECTION_ERRORS = (OperationalError, InterfaceError)
# A handler thread's connections are tidied after every job; before one only
# when the last tidy is older than this (a connection may have aged or broken
# while the thread was idle).
TIDY_FRESH_S = 1.0


class _Tidied(threading.local):
    """Per thread: whether it has made a connection, and when it last tidied (monotonic).

    Class defaults, not ``getattr(local, name, default)``: a name a thread
    has not set would raise and catch an ``AttributeError`` inside
    ``getattr`` twice a job, a microsecond of a no-op job's run.
    """

    made = False
    at = float("-inf")


_tidied = _Tidied()


def _connection_made(sender: Any, **kwargs: Any) -> None:
    """Note that this thread has made a connection: from now on its tidies have work.

    A thread that has made none (a handler that sends a mail, calls an API)
    has none to close, and Django's look for them costs more than a no-op
    job's handler call. Every connection Django makes sends this signal, in
    the thread that makes it.
    """
    _tidied.made = True


connection_created.connect(_connection_made, dispatch_uid="alkstore_django.executor")
# The hot path's kind, bound once: a member read through its enum class costs
# twice a plain global read, on every job.
ACK = OutcomeKind.ACK
RETRY = OutcomeKind.RETRY


def tidy_connections(close: Callable[[], None]) -> None:
    """Close stale connections without ever killing the thread that asks.

    A handler thread that died here would silently shrink the pool; a
    connection that cannot even be closed is logged and left to be replaced.
    """
    try:
        close()
    except Exception:
        logger.warning("could not close a database connection", exc_info=True)


@dataclass(slots=True)
class Outcome:
    """What a handler run decided: ``ack``, ``retry``, ``fail``, ``snooze`` or ``release``.

    A snooze's ``value`` is its delay; ``release`` is for a job never started.
    A failure carries its stored ``error``, the exception's class path and
    traceback as text (which can cross to another process), and the exception
    itself when it was raised in this one. A retry's ``delay_s`` is the
    backoff decided where the exception was raised (``retry_delay``); None
    leaves it to the handle.
    """

    kind: OutcomeKind
    value: Any = None
    error: str | None = None
    exc: BaseException | None = None
    exc_class: str | None = None
    traceback: str | None = None
    duration_ms: float = 0.0
    delay_s: float | None = None

    @classmethod
    def failed(cls, kind: OutcomeKind, error: str, exc: BaseException) -> Outcome:
        """Return the ``retry`` or ``fail`` outcome of ``exc``, with its text kept."""
        return cls(
            kind, error=error, exc=exc, exc_class=class_path(exc), traceback=format_traceback(exc)
        )


async def _await(awaitable: Any) -> Any:
    return await awaitable


def call_handler(func: Callable[[Any], Any], arg: Any) -> Any:
    """Call ``func(arg)``; an ``async def`` handler is awaited to its end.

    ``async_to_sync`` runs the coroutine in an event loop while this thread
    serves its thread-sensitive calls (the ORM), as Django does for async
    views under WSGI; the claim is kept alive meanwhile like any other run.
    """
    value = func(arg)
    # Most handlers return None: skip the Awaitable ABC check (a microsecond a job).
    if value is not None and inspect.isawaitable(value):
        return async_to_sync(_await)(value)
    return value


def run_handler(func: Callable[[Any], Any], arg: Any, job: Job, run: Run | None = None) -> Outcome:
    """Run ``func(arg)`` for ``job`` inside ``run`` and return what it decided; never raises.

    ``current_run()`` is ``run`` meanwhile (a fresh one when the caller keeps
    none). ``KeyboardInterrupt`` is the one exception passed on: whoever
    pressed Ctrl-C wants to stop, and the job did not fail.
    """
    started = time.monotonic()
    token = bind(run or Run(job))
    span = start_run(job)
    try:
        outcome = Outcome(ACK, value=call_handler(func, arg))
    except KeyboardInterrupt as exc:
        if span is not None:
            end_run(span, None, exc)
        raise
    except BaseException as exc:  # noqa: BLE001 - what a handler raises is its outcome
        outcome = outcome_of(exc, func, job)
    finally:
        unbind(token)
    if span is not None:
        end_run(span, outcome)
    return _timed(outcome, started, func, job)


async def arun_handler(
    func: Callable[[Any], Any], arg: Any, job: Job, run: Run | None = None
) -> Outcome:
    """Await ``func(arg)`` for ``job`` inside ``run``, on the running loop; as ``run_handler``.

    ``asyncio.CancelledError`` is passed on as well: the asyncio pool
    cancelled the run (a time limit, a cancel past its grace, the shutdown)
    and knows what that means.
    """
    started = time.monotonic()
    token = bind(run or Run(job))
    span = start_run(job)
    try:
        value = func(arg)
        if value is not None and inspect.isawaitable(value):
            value = await value
        outcome = Outcome(ACK, value=value)
    except (KeyboardInterrupt, asyncio.CancelledError) as exc:
        if span is not None:
            end_run(span, None, exc)
        raise
    except BaseException as exc:  # noqa: BLE001 - what a handler raises is its outcome
        outcome = outcome_of(exc, func, job)
    finally:
        unbind(token)
    if span is not None:
        end_run(span, outcome)
    return _timed(outcome, started, func, job)


def outcome_of(exc: BaseException, func: Any, job: Job) -> Outcome:
    """Return the outcome of a run of ``func`` for ``job`` that raised ``exc``; log a failure."""
    if isinstance(exc, Cancelled):
        return Outcome.failed(OutcomeKind.CANCEL, message_of(exc, "cancelled"), exc)
    if isinstance(exc, Fail):
        return Outcome.failed(OutcomeKind.FAIL, message_of(exc, "failed"), exc)
    if isinstance(exc, Snooze):
        return Outcome(OutcomeKind.SNOOZE, value=exc.delay_s)
    if isinstance(exc, TimeLimitExceeded):
        # Not the handler's error: the worker stopped it and logged why; its
        # completer records the attempt (timed out) or refuses it (a lapsed claim).
        return Outcome.failed(OutcomeKind.RETRY, describe(exc), exc)
    error = describe(exc)
    if has_hooks(func) and job.attempts >= job.max_attempts:
        # The Tasks runner's last attempt: Django's task_finished line logs this
        # traceback with the FAILED result (its contract); once is enough.
        logger.error(
            "handler raised id=%s queue=%s attempts=%s: %s",
            job.id,
            job.queue,
            job.attempts,
            loggable(error),
        )
    elif len(error) < MAX_LOGGED_ERROR_CHARS:
        logger.error(
            "handler raised id=%s queue=%s attempts=%s",
            job.id,
            job.queue,
            job.attempts,
            exc_info=exc,
        )
    else:
        # A huge message is logged once, capped, not once per formatter.
        logger.error(
            "handler raised id=%s queue=%s attempts=%s\n%s",
            job.id,
            job.queue,
            job.attempts,
            loggable(format_traceback(exc)),
        )
    return Outcome.failed(OutcomeKind.RETRY, error, exc)


def _timed(outcome: Outcome, started: float, func: Any, job: Job) -> Outcome:
    """Stamp the run's duration on ``outcome`` and, for a retry, its backoff."""
    outcome.duration_ms = (time.monotonic() - started) * 1000
    if outcome.kind is RETRY and job.attempts < job.max_attempts:
        outcome.delay_s = retry_delay(func, job, outcome.exc)
    return outcome


def retry_delay(func: Any, job: Job, error: BaseException | str | None) -> float:
    """Return the delay before ``job``'s retry: ``func``'s backoff, the queue's, or the curve.

    Called where the attempt's exception exists (the handler's thread, or
    its child process), so a backoff sees the exception itself in either
    pool. The queue's option is read from settings, as the worker's queues are.
    """
    backoff = handler_backoff(func, job.queue)
    return retry_delay_s(job, error, backoff, queue_backoff_path(job.queue))


def run_job(func: Callable[[Any], Any], job: Job, run: Run | None = None) -> Outcome:
    """Run a worker handler as a request would run a view: fresh connections around it.

    The tidy before a job is skipped when this thread tidied after its
    previous job less than ``TIDY_FRESH_S`` ago: nothing used a connection
    since, and a tidy costs more than a no-op job's handler call. Both are
    skipped while the thread has never made a connection (``_connection_made``).
    """
    tidied = _tidied
    if tidied.made and time.monotonic() - tidied.at >= TIDY_FRESH_S:
        tidy_connections(close_old_connections)
    send_robust(job_started, job.queue, job=job)
    try:
        return run_handler(func, job, job, run)
    finally:
        if tidied.made:
            tidy_connections(close_old_connections)
        tidied.at = time.monotonic()


def has_hooks(func: Any) -> bool:
    """True when the handler writes in its outcome's transaction (the Tasks runner)."""
    # functools.partial(runner, using=...) is how the test helpers bind the alias.
    return hasattr(func, "on_acked") or hasattr(getattr(func, "func", None), "on_acked")


def settles_alone(func: Any, job: Job) -> bool:
    """True when an ack writes more than the job's delete: a hook, a workflow step, a kept result.

    Such an ack goes through ``settle`` on its own, never in a batch of
    plain acks, and never by a sentinel (which knows no return value).
    """
    return has_hooks(func) or job.workflow_id is not None or job.keep_result_s is not None


def settle(handle: JobHandle, outcome: Outcome, func: Any, using: str) -> Settled:
    """Apply ``outcome`` to ``handle`` with ``func``'s hooks; return what became of the job.

    Returns ``acked``, ``retried``, ``snoozed``, ``dead``, ``released``,
    ``cancelled`` or ``lost`` (the claim was no longer this handle's). One
    transaction per outcome, joined with the hooks' writes. A connection
    error propagates: nothing was recorded and the caller retries. Any other
    error is contained: the job gets a failed attempt (a cancel stays a
    cancel) whose error says why its outcome could not be recorded; a
    release that cannot be written is left to lapse (``lost``), as its job
    never ran. ``job_finished`` is sent for every outcome but a release (the
    job did not finish).
    """
    try:
        result = _apply(handle, outcome, func, using)
    except CONNECTION_ERRORS:
        raise
    except Exception as exc:
        job = handle.job
        if outcome.kind == OutcomeKind.RELEASE:
            logger.warning("could not release id=%s; its claim will lapse", job.id)
            return Settled.LOST
        logger.error(
            "outcome could not be recorded id=%s queue=%s outcome=%s",
            job.id,
            job.queue,
            outcome.kind,
            exc_info=True,
        )
        error = unrecorded(outcome.kind, exc)
        kind = OutcomeKind.FAIL if outcome.kind == OutcomeKind.FAIL else OutcomeKind.RETRY
        if outcome.kind == OutcomeKind.CANCEL:
            kind = OutcomeKind.CANCEL  # still no retry: the job was asked to stop
        outcome = Outcome(kind, error=error)
        try:
            result = _apply(handle, outcome, None, using)
        except CONNECTION_ERRORS:
            raise
        except Exception:
            logger.error("could not record the failure either id=%s", job.id, exc_info=True)
            result = Settled.LOST
    if result in (Settled.RETRIED, Settled.SNOOZED):
        # Due again after its backoff, a time no idle worker has set a timer
        # for: woken, each claims and reads it (a release wakes them itself).
        handle.queue.store.dialect.wake_for(handle.job.queue, handle.queue.channel)
    if outcome.kind != OutcomeKind.RELEASE:
        finished(handle.job, outcome, result)
    return result


def cancelled_error(outcome: Outcome) -> str:
    """Return the error a cancelled attempt stores: ``cancelled``, then how the run ended."""
    error = outcome.error or "cancel requested"
    return error if "cancelled" in error.lower() else f"cancelled: {error}"


def finished(job: Job, outcome: Outcome, result: Settled) -> None:
    """Announce a durable outcome (``job_finished``); the one place it is sent from."""
    send_robust(job_finished, job.queue, job=job, outcome=outcome, result=result)


def _apply(handle: JobHandle, outcome: Outcome, func: Any, using: str) -> Settled:
    job = handle.job
    kind = outcome.kind
    if kind == OutcomeKind.RELEASE:
        # One statement, no hook: no transaction of its own.
        return Settled.RELEASED if handle.release() else Settled.LOST
    # Begun with the write lock on SQLite: a workflow step reads its workflow before it writes.
    with handle.queue.store.dialect.atomic_write():
        # A step's workflow is locked before its job: the one lock order (workflows.progress).
        # It may be gone (pruned, then its dead letter requeued): the job settles as a plain one.
        locked = lock(using, [job.workflow_id]) if job.workflow_id is not None else []
        workflow = locked[0] if locked else None
        result = _apply_outcome(handle, outcome, func, using)
        if result == Settled.ACKED:
            _ended(handle, workflow, StepState.SUCCEEDED, value=outcome.value)
        elif result == Settled.DEAD:
            error = outcome.error or snoozed_out(job)  # only a snooze ends dead without one
            _ended(handle, workflow, StepState.FAILED, error=error)
        elif result == Settled.CANCELLED:
            _ended(handle, workflow, StepState.CANCELLED, error=cancelled_error(outcome))
        return result


def _apply_outcome(handle: JobHandle, outcome: Outcome, func: Any, using: str) -> Settled:
    job = handle.job
    kind = outcome.kind
    if kind == OutcomeKind.ACK:
        if not handle.ack():
            return Settled.LOST
        hook = getattr(func, "on_acked", None)
        if hook is not None:
            hook(job, outcome.value, using)
        return Settled.ACKED
    if kind == OutcomeKind.SNOOZE:
        # Over the snooze cap, snooze() dead-letters it; that is a failure.
        before = handle.job.snoozes
        if not handle.snooze(outcome.value):
            return Settled.LOST
        return Settled.SNOOZED if before < handle.job.max_snoozes else Settled.DEAD
    if kind == OutcomeKind.CANCEL:
        if not handle.cancel():
            return Settled.LOST
        error = cancelled_error(outcome)
        record_attempt(using, job, error, outcome.exc_class, outcome.traceback)
        hook = getattr(func, "on_failed", None)
        if hook is not None:
            # The last attempt: the Tasks backend records the task as failed, with why.
            hook(job, outcome, True, using)
        return Settled.CANCELLED
    failing = kind == OutcomeKind.FAIL
    exhausted = failing or job.attempts >= job.max_attempts
    if failing:
        applied = handle.fail(outcome.error)
    else:
        backoff = handler_backoff(func, job.queue)
        applied = handle.retry(outcome.error, delay_s=outcome.delay_s, backoff=backoff)
    if not applied:
        return Settled.LOST
    record_attempt(using, job, outcome.error or "failed", outcome.exc_class, outcome.traceback)
    hook = getattr(func, "on_failed", None)
    if hook is not None:
        hook(job, outcome, exhausted, using)
    return Settled.DEAD if exhausted else Settled.RETRIED


def _ended(
    handle: JobHandle,
    workflow: Workflow | None,
    state: StepState,
    *,
    value: Any = None,
    error: str | None = None,
) -> None:
    """Write what a finished job keeps: its step's end and its result, in its outcome's transaction.

    A return value that is not JSON raises ``PayloadError`` here, which
    ``settle`` records as the attempt's failure (the ack rolls back with it).
    """
    job = handle.job
    if job.workflow_id is None and job.keep_result_s is None:
        return
    stored = results.encode_result(value) if state == StepState.SUCCEEDED else None
    store = handle.queue.store
    if workflow is not None and job.step is not None:
        finish_step(store, workflow, job.step, job.id, state, result=stored, error=error)
    if job.keep_result_s is not None:
        results.keep(store, job, ResultState(state.value), value=stored, error=error)
