"""Enqueue one by one beside its floor, in one process, with the processes placed by hand.

    python -m bench.placement N ROUNDS     # PostgreSQL on this machine, as root

The database is ``BENCH_DATABASE_URL`` (default ``alk_perf_bench`` on the
local server, as ``bench/run.py``'s); it must exist, and is migrated here.

Why: on a machine with few cores the scheduler decides whether the client
and the server process it talks to share a core, and that decision moves
``enqueue()``'s ratio to its floor by more than a run's other scatter. The
two loops here are the floor's (alkstore's own one-row statement, prepared,
on a raw psycopg connection, ``bench.floors enqueue``) and ``enqueue()``'s,
in the same process, alternating in ``ROUNDS`` rounds of ``N`` calls each,
three times over:

- ``free``: placed by the scheduler, as every other figure of the bench;
- ``apart``: this process on the first CPU, both server processes on the
  second (what the client's own code costs, with its caches its own);
- ``together``: all three on the first CPU (each round trip runs the server
  on the client's core, which leaves the client's caches cold).

Then ``python``: each loop with the driver's execute and fetch replaced by
nothing (placed by the scheduler, ten times the calls): the client's own
Python per call, with warm caches and no server at all.

Pinning a server process needs ``taskset`` and the right to move it: a local
server and root (``cannot_place``). ``bench/run.py --workloads floor`` runs it
in each round where it can (its ``in one process`` rows). Prints one JSON
line: per placement, the medians of the rounds' wall time and this process's
CPU time per call, and floor / alkstore.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from bench.floors import ENQUEUE_QUEUE, prepare, raw_enqueuer
from bench.settings import DEFAULT_URL
from bench.workloads import setup

PLACEMENTS = ("free", "apart", "together")


def place(placement: str, backends: list[int], cpus: list[int]) -> None:
    """Put this process and the server processes ``backends`` where ``placement`` says."""
    if placement == "free":
        client, server = cpus, cpus
    else:
        client = cpus[:1]
        server = cpus[:1] if placement == "together" else cpus[1:2]
    os.sched_setaffinity(0, client)
    for pid in backends:
        subprocess.run(
            ["taskset", "-a", "-p", "-c", ",".join(map(str, server)), str(pid)],
            check=True,
            capture_output=True,
        )


def rounds(loops: dict[str, Callable[[int], Any]], n: int, count: int) -> dict[str, Any]:
    """Run each loop ``n`` calls a round, in alternating order; return medians per call."""
    timed: dict[str, list[tuple[float, float]]] = {name: [] for name in loops}
    names = list(loops)
    for index in range(count):
        for name in names if index % 2 == 0 else names[::-1]:
            one = loops[name]
            cpu, started = time.process_time(), time.perf_counter()
            for i in range(n):
                one(i)
            wall = time.perf_counter() - started
            timed[name].append((wall / n * 1e6, (time.process_time() - cpu) / n * 1e6))
    result: dict[str, Any] = {
        name: {
            "wall_us": round(statistics.median(w for w, _ in values), 1),
            "cpu_us": round(statistics.median(c for _, c in values), 1),
        }
        for name, values in timed.items()
    }
    result["ratio"] = round(result["floor"]["wall_us"] / result["alkstore"]["wall_us"], 3)
    return result


def cannot_place(url: str) -> str | None:
    """Why the processes cannot be placed by hand for the database at ``url``; None if they can."""
    if urlsplit(url).scheme not in ("postgres", "postgresql"):
        return "bench.placement pins PostgreSQL's server processes: PostgreSQL only"
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost", "::1"):
        return "bench.placement pins the server's processes: a server on this machine only"
    if len(os.sched_getaffinity(0)) < 2:
        return "bench.placement needs two CPUs to place the processes apart"
    if shutil.which("taskset") is None or os.geteuid() != 0:
        return "bench.placement moves the server's processes: it needs taskset and root"
    return None


def main(n: str, count: str) -> dict:
    os.environ.setdefault("BENCH_DATABASE_URL", DEFAULT_URL)
    if refused := cannot_place(os.environ["BENCH_DATABASE_URL"]):
        raise SystemExit(refused)
    cpus = sorted(os.sched_getaffinity(0))
    setup()
    from django.core.management import call_command
    from django.db import connections

    from alkstore_django import store

    call_command("migrate", verbosity=0)
    prepare()

    q = store.queue(ENQUEUE_QUEUE)
    q.enqueue({"warm": True})
    conn, floor = raw_enqueuer(ENQUEUE_QUEUE)
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backends = [cursor.fetchone()[0]]
    backends.append(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
    loops = {"alkstore": lambda i: q.enqueue({"i": i}), "floor": floor}
    for one in loops.values():
        for i in range(100):
            one(i)
    figures: dict[str, Any] = {"calls": int(n), "rounds": int(count)}
    try:
        for placement in PLACEMENTS:
            place(placement, backends, cpus)
            figures[placement] = rounds(loops, int(n), int(count))
    finally:
        place("free", backends, cpus)
    figures["python"] = without_round_trips(loops, 10 * int(n), int(count))
    conn.close()
    connections.close_all()
    return figures


def without_round_trips(loops: dict[str, Callable[[int], Any]], n: int, count: int) -> Any:
    """``rounds`` with psycopg's execute and fetch doing nothing: each loop's own Python.

    The one row each call gets back is the enqueue's (an id, and whether
    it woke a worker: no).
    """
    import psycopg

    execute, fetchall = psycopg.Cursor.execute, psycopg.Cursor.fetchall
    psycopg.Cursor.execute = lambda cursor, *args, **kwargs: cursor  # type: ignore[method-assign]
    psycopg.Cursor.fetchall = lambda cursor: [(0, False)]  # type: ignore[method-assign]
    try:
        return rounds(loops, n, count)
    finally:
        psycopg.Cursor.execute, psycopg.Cursor.fetchall = execute, fetchall  # type: ignore[method-assign]


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
