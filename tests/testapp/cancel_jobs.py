"""Handlers for the cancel tests: each records its run, then heeds or ignores a cancel request."""

from __future__ import annotations

import time

from alkstore_django import current_run, handler

from .jobs import record


def _options(job) -> dict:
    return job.payload if isinstance(job.payload, dict) else {}


@handler("c.heed")
def heed(job):
    """Poll the run's cancel flag in a loop: raise ``Cancelled`` (or return) once it is set."""
    record(job)
    run = current_run()
    deadline = time.monotonic() + float(_options(job).get("run_s", 30))
    while time.monotonic() < deadline:
        if run.cancel_requested:
            if _options(job).get("return"):
                return {"stopped": job.id}
            run.raise_if_cancelled()
        time.sleep(0.005)
    return {"finished": job.id}


@handler("c.ignore")
def ignore(job):
    """Run Python code for ``run_s`` whatever is asked (a raised ``Cancelled`` stops it)."""
    record(job)
    deadline = time.monotonic() + float(_options(job).get("run_s", 30))
    while time.monotonic() < deadline:
        sum(range(100))
        time.sleep(0.002)


@handler("c.sleep")
def sleep(job):
    """Sleep in C for ``run_s``: only a killed process stops it (the process pool's grace)."""
    record(job)
    time.sleep(float(_options(job).get("run_s", 30)))


@handler("c.import")
def steered_import(job):
    """Import ``rows`` rows at ``row_s`` each, reporting progress, until done or cancelled."""
    run = current_run()
    rows = int(_options(job).get("rows", 1000))
    for done in range(1, rows + 1):
        run.raise_if_cancelled()
        run.progress(done, rows, "rows imported")
        time.sleep(float(_options(job).get("row_s", 0.01)))
    return {"rows": rows}
