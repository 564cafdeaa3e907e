"""Handlers the worker tests run; each records its run in ``Run`` so checks are exact."""

from __future__ import annotations

import os
import threading
import time

from alkstore_django import Fail, Snooze, handler

from .models import Run


def record(job) -> None:
    Run.objects.create(
        job_id=job.id, attempt=job.attempts, queue=job.queue, worker_id=job.worker_id or ""
    )


@handler("t.record")
def record_run(job):
    record(job)
    return {"ok": job.id}


@handler("t.noop")
def noop(job):
    return None


@handler("t.raise")
def raise_error(job):
    record(job)
    raise ValueError(f"boom {job.payload}")


@handler("t.fail")
def fail_now(job):
    record(job)
    raise Fail("refused: bad input")


@handler("t.slow")
def slow(job):
    record(job)
    time.sleep(float((job.payload or {}).get("sleep_s", 1.0)))


@handler("t.snooze")
def snooze_until(job):
    """Put itself off (0 s) until it has been snoozed ``times`` times, then succeed."""
    record(job)
    if job.snoozes < int((job.payload or {}).get("times", 0)):
        raise Snooze(0)
    return job.snoozes


@handler("t.exit")
def exit_process(job):
    """A poison job: kills its own worker process."""
    record(job)
    os._exit(3)


@handler("t.tracked")
def tracked(job):
    """Append its start and end to the file ``payload["log"]``: the queue-control tests count
    overlapping runs and starts per second from these lines, written by the handlers themselves.
    """
    path = job.payload["log"]
    with open(path, "a") as log:
        log.write(f"start {job.id} {time.time():.6f}\n")
    time.sleep(float(job.payload.get("sleep_s", 0)))
    with open(path, "a") as log:
        log.write(f"end {job.id} {time.time():.6f}\n")


# How many runs of each job are inside ``spin`` at once, and the most seen.
SPINNING: dict[int, int] = {}
PEAK_SPINNING: dict[int, int] = {}
_spinning_lock = threading.Lock()


@handler("t.spin")
def spin(job):
    """Run Python code for ``spin_s`` (a raised time-out stops it), counting overlapping runs."""
    record(job)
    with _spinning_lock:
        SPINNING[job.id] = SPINNING.get(job.id, 0) + 1
        PEAK_SPINNING[job.id] = max(PEAK_SPINNING.get(job.id, 0), SPINNING[job.id])
    try:
        deadline = time.monotonic() + float((job.payload or {}).get("spin_s", 5.0))
        while time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        with _spinning_lock:
            SPINNING[job.id] -= 1


@handler("t.wf")
def workflow_step(job):
    """A workflow step: record the run, then do what the payload says.

    ``fail``: raise (retried, then dead-lettered); ``fail_until_file``: raise
    while that file exists (a test removes it to let a requeue succeed);
    ``sleep_s``: sleep first; ``bad_return``: return a value that is not
    JSON. It returns its step's name, its ``workflow_id``, and the results
    and states of the steps it waited on, read through ``get_workflow``.
    """
    from alkstore_django import store

    record(job)
    payload = job.payload or {}
    time.sleep(float(payload.get("sleep_s", 0)))
    if payload.get("fail") or os.path.exists(payload.get("fail_until_file") or ""):
        raise ValueError(f"step {job.step} failed")
    if payload.get("bad_return"):
        return {1, 2}
    seen, states = {}, {}
    workflow = None if job.workflow_id is None else store.get_workflow(job.workflow_id)
    if workflow is not None:
        parents = [workflow.steps[name] for name in workflow.steps[job.step].after]
        seen = {parent.name: parent.result for parent in parents}
        states = {parent.name: parent.state for parent in parents}
    return {"step": job.step, "workflow_id": job.workflow_id, "seen": seen, "states": states}


# The chaos, hostile-handler, process-pool and asyncio-pool suites' handlers.
from . import (  # noqa: E402, F401
    async_jobs,
    backoff_jobs,
    cancel_jobs,
    chaos_jobs,
    hostile_jobs,
    pool_jobs,
    progress_jobs,
)
