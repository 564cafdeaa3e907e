"""What the engines do around a statement they run on the driver's own cursor."""

from __future__ import annotations

from asyncio import _get_running_loop
from typing import Any


def ensure_open(wrapper: Any) -> None:
    """Connect Django's ``wrapper`` if it is closed; refuse a call from a coroutine.

    What ``ensure_connection`` does, for the statements alkstore runs on the
    driver's own cursor (an enqueue, a claim): its check for a running event
    loop raises and catches a ``RuntimeError`` on every call, a few
    microseconds of an enqueue, so it is called only when it has something
    to do (connect, or raise ``SynchronousOnlyOperation``).
    """
    if wrapper.connection is None or _get_running_loop() is not None:
        wrapper.ensure_connection()
