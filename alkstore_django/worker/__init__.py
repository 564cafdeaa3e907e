"""The worker: a claim loop and the few roles a claimed job passes through.

``loop`` (``Worker``: claims in batches, hands jobs to the pool's lanes),
``holdings`` (the claims it holds, renewed), ``slots`` (their shared memory),
``pools`` and ``children`` (where a handler runs: a lane's thread, or its
child process started by ``child``), ``completer`` (settles what handlers
return: acks ride the next claim, the rest through ``executor.settle``),
``tally`` (counts, log lines, throughput counters), ``controls`` (paused and
limited queues), ``cadence`` (when the next claim is due), ``wake`` and
``watcher`` (the main thread's wake-up, and the watch of the queues that
sets it), ``upkeep`` (the periodic chores, one function each),
``sentinel`` (the forked process that settles a dead worker's claims) and
``instruments`` (the worker's own metrics). The names are loaded on first
use, so ``python -m alkstore_django.worker.child`` imports no model before
Django is set up.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import Worker, default_worker_id

_EXPORTS = {"Worker": "loop", "default_worker_id": "loop"}
__all__ = ["Worker", "default_worker_id"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
