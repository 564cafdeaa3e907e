"""Run the bench workloads on procrastinate (PostgreSQL), from .venv-peers.

Jobs are deferred with the sync API (``task.defer``, ``task.batch_defer``);
workers are procrastinate's own CLI, as its users run it (``--one-shot`` for
the drain).
"""

from __future__ import annotations

import os
import sys

import psycopg

from bench.peers import common
from bench.peers.procrastinate_app import app, io_bound, noop, stamp

APP = "bench.peers.procrastinate_app.app"


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "procrastinate", f"--app={APP}", *args]


def sql(query: str) -> list[tuple]:
    url = os.environ["BENCH_DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query)
        return cursor.fetchall() if cursor.description else []


def clear() -> None:
    sql("TRUNCATE procrastinate_jobs CASCADE")


def setup() -> dict:
    with app.open():
        app.schema_manager.apply_schema()
    return {"ok": True}


def capabilities() -> dict:
    return {"batches": [100, 1000], "latency": True}


def enqueue(n: str, batch: str) -> dict:
    clear()
    with app.open():
        return common.timed_enqueue(
            int(n),
            int(batch),
            lambda i: noop.defer(i=i),
            lambda ids: noop.batch_defer(*[{"i": i} for i in ids]),
        )


def drain(n: str, procs: str) -> dict:
    clear()
    with app.open():
        for start in range(0, int(n), 1000):
            noop.batch_defer(*[{"i": i} for i in range(start, min(start + 1000, int(n)))])

    def left() -> int:
        return sql("SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")[0][0]

    return common.drain(cli("worker", "--queues", "bench", "--one-shot"), int(n), int(procs), left)


def drain_io(n: str, concurrency: str) -> dict:
    """Drain ``n`` 50 ms ``async def`` jobs with one worker at ``--concurrency``."""
    clear()
    with app.open():
        for start in range(0, int(n), 1000):
            io_bound.batch_defer(*[{"i": i} for i in range(start, min(start + 1000, int(n)))])
    # What autovacuum's analyze would do after such a burst (the bench server runs without it).
    sql("ANALYZE procrastinate_jobs")

    def left() -> int:
        return sql("SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'")[0][0]

    worker = cli("worker", "--queues", "bench_io", "--one-shot", "--concurrency", concurrency)
    return {**common.drain(worker, int(n), 1, left), "concurrency": int(concurrency)}


def latency(n: str) -> dict:
    clear()
    with app.open():
        return common.latency(
            cli("worker", "--queues", "bench_latency"), lambda i: stamp.defer(i=i), int(n)
        )


if __name__ == "__main__":
    common.main(
        {
            "setup": setup,
            "capabilities": capabilities,
            "enqueue": enqueue,
            "drain": drain,
            "drain-io": drain_io,
            "latency": latency,
        }
    )
