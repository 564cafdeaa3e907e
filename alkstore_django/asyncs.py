"""The async API's one bridge: every ``a``-prefixed method is its sync twin run through here."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from asgiref.sync import sync_to_async

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


async def run_sync(call: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """Run the sync ``call`` on Django's thread-sensitive thread and return what it returns.

    As Django's own async ORM methods (``aget``, ``asave``) do: thread-sensitive,
    so the call runs on the thread, and so the connection, of every other ORM
    call the async code makes, and behaves exactly as the sync call there. It
    raises the same errors, autocommits, or joins an atomic block open on that
    thread (sync code in ``atomic()`` that calls async code through
    ``async_to_sync``). A coroutine cannot open one itself: see docs/queues.md.
    """
    return await sync_to_async(call, thread_sensitive=True)(*args, **kwargs)


def async_twin(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """Return the async twin of the sync ``method``: its parameters, run through ``run_sync``.

    For a method whose signature is long (``Queue.enqueue``): the twin is
    written once, here, and cannot drift from the sync one's parameters.
    """

    @functools.wraps(method)
    async def twin(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await run_sync(method, self, *args, **kwargs)

    twin.__name__ = f"a{method.__name__}"
    twin.__qualname__ = f"{method.__qualname__.rpartition('.')[0]}.a{method.__name__}".lstrip(".")
    twin.__doc__ = (
        f"``{method.__name__}`` for async code: the same parameters, checks, errors and "
        "result, run on Django's thread-sensitive thread (``asyncs.run_sync``). It commits "
        "at once unless an atomic block is open on that thread (docs/queues.md, Async API)."
    )
    return twin
