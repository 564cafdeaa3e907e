"""The handler registry: ``@handler("queue")``, ``@handler.outbox("name")``, autodiscovery."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .backoff import Backoff, check_backoff, set_handler_backoff
from .errors import InvalidArgument, InvalidName
from .validation import MAX_NAME_LENGTH, validate_name

OUTBOX_PREFIX = "__alkstore_outbox:"

Handler = Callable[[Any], Any]
F = TypeVar("F", bound=Handler)


def outbox_queue_name(name: str) -> str:
    """Return the reserved queue that backs outbox ``name``."""
    return f"{OUTBOX_PREFIX}{name}"


def validate_outbox_name(name: object) -> str:
    """Return ``name`` when it is a queue-like name whose backing queue fits the column."""
    validate_name("outbox", name)
    backing = outbox_queue_name(name)  # type: ignore[arg-type]
    if len(backing) > MAX_NAME_LENGTH:
        limit = MAX_NAME_LENGTH - len(outbox_queue_name(""))
        raise InvalidName(
            f"Invalid outbox name {name[:40]!r}… ({len(name)} characters): "  # type: ignore[index,arg-type]
            f"expected at most {limit} characters."
        )
    return name  # type: ignore[return-value]


def _qualified(func: Handler) -> str:
    qualname = getattr(func, "__qualname__", None)
    if qualname is None:
        # A callable object (the Tasks backend's runner): its repr is its path.
        return repr(func)
    return f"{getattr(func, '__module__', '?')}.{qualname}"


class HandlerRegistry:
    """Queue name → handler; outboxes are registered under their backing queue.

    A handler is any callable taking the claimed ``Job``. An integration that
    must write in the same transaction as the outcome (the Tasks backend's
    results) gives its callable two optional methods, which the worker calls
    inside that transaction and only when the outcome took effect:
    ``on_acked(job, value, using)`` and ``on_failed(job, outcome, exhausted, using)``
    (``executor.settle`` is the one caller).
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        # Queue -> the paths of every handler registered for it, when more than one.
        self._conflicts: dict[str, list[str]] = {}

    def register(self, queue: str, func: Handler) -> None:
        """Register ``func`` for ``queue``; a second, different handler is recorded, not raised.

        Registration runs while Django loads the apps (``jobs.py``, the Tasks
        backend's queues), where an exception would stop every ``manage.py``
        command, ``migrate`` included. A conflict is reported instead by the
        system check ``alkstore.E201`` and refused by ``get()``, so no worker
        runs a queue whose handler is ambiguous.
        """
        existing = self._handlers.get(queue)
        if existing is None:
            self._handlers[queue] = func
            return
        # The same function registered again (a module imported twice) is harmless.
        paths = self._conflicts.get(queue, [_qualified(existing)])
        if _qualified(func) not in paths:
            self._conflicts[queue] = [*paths, _qualified(func)]

    def conflicts(self) -> dict[str, str]:
        """Return queue -> a message naming its handlers, for every queue with more than one."""
        return {
            queue: f"Queue {queue!r} has {len(paths)} handlers ({', '.join(paths)}): "
            "expected one handler per queue."
            for queue, paths in sorted(self._conflicts.items())
        }

    def get(self, queue: str) -> Handler | None:
        """Return the handler of ``queue``, or None when it has none.

        Raises ``InvalidArgument`` (the ``alkstore.E201`` message) when the
        queue has more than one handler.
        """
        if queue in self._conflicts:
            raise InvalidArgument(self.conflicts()[queue])
        return self._handlers.get(queue)

    def queues(self) -> list[str]:
        """Return every queue with a handler (outboxes by their backing queue)."""
        return sorted(self._handlers)


registry = HandlerRegistry()


class HandlerDecorator:
    """``@handler("emails")`` for a queue, ``@handler.outbox("webhooks")`` for an outbox.

    The handler receives the claimed ``Job``. Returning acks it; raising retries
    it with the queue's backoff; raising ``Fail`` dead-letters it at once.
    ``backoff`` is the handler's own ``(attempt, error) -> seconds`` for its
    retries on ``queue``, over the queue's ``backoff`` option (``backoff.py``).
    """

    def __call__(self, queue: str, *, backoff: Backoff | None = None) -> Callable[[F], F]:
        validate_name("queue", queue)
        if backoff is not None:
            check_backoff(backoff, f"backoff for queue {queue!r}")

        def decorate(func: F) -> F:
            if backoff is not None:
                set_handler_backoff(func, queue, backoff)
            registry.register(queue, func)
            return func

        return decorate

    def outbox(self, name: str) -> Callable[[F], F]:
        validate_outbox_name(name)

        def decorate(func: F) -> F:
            registry.register(outbox_queue_name(name), func)
            return func

        return decorate


handler = HandlerDecorator()


def autodiscover() -> None:
    """Import every installed app's ``jobs`` module so its handlers register."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
