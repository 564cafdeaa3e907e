"""The handler registry: ``@handler("queue")``, ``@handler.outbox("name")``, autodiscovery."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

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
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


class HandlerRegistry:
    """Queue name → handler; outboxes are registered under their backing queue.

    A handler is any callable taking the claimed ``Job``. An integration that
    must write in the same transaction as the outcome (the Tasks backend's
    results) gives its callable two optional methods, which the worker calls
    inside that transaction and only when the outcome took effect:
    ``on_acked(job, value, using)`` and ``on_failed(job, outcome, exhausted, using)``
    (``job_runs.settle`` is the one caller).
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, queue: str, func: Handler) -> None:
        existing = self._handlers.get(queue)
        # The same function registered again (a module imported twice) is harmless.
        if existing is not None and _qualified(existing) != _qualified(func):
            raise InvalidArgument(
                f"Queue {queue!r} already has handler {_qualified(existing)}; cannot also "
                f"register {_qualified(func)}: expected one handler per queue."
            )
        self._handlers[queue] = func

    def get(self, queue: str) -> Handler | None:
        return self._handlers.get(queue)

    def queues(self) -> list[str]:
        """Return every queue with a handler (outboxes by their backing queue)."""
        return sorted(self._handlers)

    def unregister(self, queue: str) -> None:
        self._handlers.pop(queue, None)


registry = HandlerRegistry()


class HandlerDecorator:
    """``@handler("emails")`` for a queue, ``@handler.outbox("webhooks")`` for an outbox.

    The handler receives the claimed ``Job``. Returning acks it; raising retries
    it with the queue's backoff; raising ``Fail`` dead-letters it at once.
    """

    def __call__(self, queue: str) -> Callable[[F], F]:
        validate_name("queue", queue)

        def decorate(func: F) -> F:
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
