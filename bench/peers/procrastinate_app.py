"""The procrastinate app the bench drives: a no-op task, a latency stamp task, a 50 ms wait."""

from __future__ import annotations

import asyncio
import os

from procrastinate import App, PsycopgConnector

from bench.peers import common

app = App(
    connector=PsycopgConnector(
        conninfo=os.environ["BENCH_DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    )
)


@app.task(queue="bench", name="bench_noop")
def noop(i: int = 0) -> None:
    common.mark_first()


@app.task(queue="bench_latency", name="bench_stamp")
def stamp(i: int = 0) -> None:
    common.mark_job(i)


@app.task(queue="bench_io", name="bench_io")
async def io_bound(i: int = 0) -> None:
    """The ``io`` workload's job (``bench/io_bound.py``), run on the worker's event loop."""
    common.mark_first()
    await asyncio.sleep(0.05)
