"""The procrastinate app the bench drives: a no-op task and a latency stamp task."""

from __future__ import annotations

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
