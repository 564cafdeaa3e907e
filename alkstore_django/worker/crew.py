"""Queues on several databases, served by one ``runworker``: a Worker per alias, one sentinel.

A queue routed by ``QUEUES[name]["database"]`` keeps its jobs, their claims
and fences on that alias, and a claim cannot span two databases. So the
process runs one ``Worker`` (its own claim loop, pool, holdings and upkeep)
for each alias its queues live on, under the same worker id, beside each
other in threads; the sentinel forked before them watches and settles them
all (``sentinel.py``). Each loop gets the command's ``--concurrency``: an
alias's jobs never wait on another's slots (decision, docs/scale.md).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ..handlers import registry
from ..store import get_store
from .loop import Worker, default_worker_id


def workers_for(
    queues: Sequence[str] | None, *, database: str | None = None, **options: Any
) -> list[Worker]:
    """Return a Worker for each alias ``queues`` (all registered ones by default) live on.

    ``database`` is the alias of the queues no ``database`` option routes
    elsewhere (``ALKSTORE["DATABASE"]`` by default). ``options`` are
    ``Worker``'s; every worker shares one ``worker_id``.
    """
    base = get_store(database)
    by_alias: dict[str, list[str]] = {}
    for name in queues or (options.get("handlers") or registry).queues():
        by_alias.setdefault(base.of_queue(name).using, []).append(name)
    if not by_alias:
        by_alias[base.using] = []
    worker_id = options.pop("worker_id", None) or default_worker_id()
    return [
        Worker(names, store=get_store(alias), worker_id=worker_id, **options)
        for alias, names in by_alias.items()
    ]


def run_together(workers: Sequence[Worker], stop: threading.Event) -> None:
    """Run ``workers`` until ``stop`` (or, in burst mode, until each is idle).

    The first runs in the calling thread, the others in threads of their own.
    A worker that stops on its own (``broken``, or a handler past its time
    limit) stops them all: the process exits for its supervisor to restart.
    """

    def serve(worker: Worker) -> None:
        try:
            worker.run(stop)
        finally:
            if worker.broken or worker.timed_out:
                stop.set()

    others = [
        threading.Thread(target=serve, args=(w,), name=f"alkstore-{w.store.using}", daemon=True)
        for w in workers[1:]
    ]
    for thread in others:
        thread.start()
    try:
        serve(workers[0])
    finally:
        for thread in others:
            thread.join()
