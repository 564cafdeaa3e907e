"""The error tree of alkstore_django.

Every class's docstring is its default message. ``Fail`` stands outside
``AlkstoreError`` on purpose: user code that catches ``AlkstoreError`` must not
swallow a handler's request to dead-letter its job.
"""

from __future__ import annotations


class AlkstoreError(Exception):
    """An alkstore_django operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidName(AlkstoreError):
    """A queue, outbox, schedule, lock or channel name is not a non-empty string."""


class ReservedName(AlkstoreError):
    """Names beginning with '__alkstore' are reserved for alkstore_django itself."""


class InvalidArgument(AlkstoreError):
    """An argument is out of the range the call accepts."""


class InvalidWorkflow(InvalidArgument):
    """A workflow's steps do not form a graph that can run (unknown step, cycle, duplicate)."""


class InvalidSpec(AlkstoreError):
    """A schedule spec, zone or misfire policy is not one of the documented forms.

    Specs: '@every <n><unit>' (unit s, m, h or d), '@cron <5 or 6 fields>' or
    '@cron @hourly' and the other shorthands.
    """


class PayloadError(AlkstoreError):
    """A payload cannot be encoded as JSON or is larger than MAX_PAYLOAD_BYTES."""


class LeadershipLost(AlkstoreError):
    """The scheduler lock could not be taken, or was lost before the next fire."""

    def __init__(self, message: str | None = None, *, was_leading: bool = False) -> None:
        super().__init__(message)
        #: True when a lease this runner held was lost; False when it was refused.
        self.was_leading = was_leading


class LockNotAcquired(AlkstoreError):
    """The named lock is held by another owner."""


class StoreClosed(AlkstoreError):
    """The Store has been closed; create a new one to keep working."""


class DuplicateJob(AlkstoreError):
    """A live job (or one within its unique_for_s window) already holds this unique key."""

    def __init__(self, message: str | None = None, *, job_id: int | None = None) -> None:
        super().__init__(message)
        #: The id of the job that holds the key.
        self.job_id = job_id


class Fail(Exception):
    """Raised by a handler to dead-letter its job at once; the message becomes last_error."""


class Snooze(Exception):
    """Raised by a handler to put its job off for ``delay_s`` without spending an attempt."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(f"snoozed for {delay_s!r} s")
        self.delay_s = delay_s


class TimeLimitExceeded(BaseException):
    """The worker stopped the handler: raised inside its thread (a time limit, a lapsed claim).

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that a handler's
    ``except Exception`` does not swallow it.
    """


class Cancelled(BaseException):
    """The job was cancelled while it ran (``Store.cancel_job``): it ends ``cancelled``.

    Raised by ``Run.raise_if_cancelled`` at a point the handler chose, or by
    the thread pool inside the handler's thread once ``cancel_grace_s`` has
    passed. A ``BaseException``, as ``TimeLimitExceeded`` is, so that a
    handler's ``except Exception`` does not swallow it.
    """


__all__ = [
    "AlkstoreError",
    "Cancelled",
    "DuplicateJob",
    "Fail",
    "InvalidArgument",
    "InvalidName",
    "InvalidSpec",
    "LeadershipLost",
    "LockNotAcquired",
    "PayloadError",
    "ReservedName",
    "Snooze",
    "StoreClosed",
    "TimeLimitExceeded",
]
