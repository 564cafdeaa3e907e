"""Handlers for the asyncio-pool tests: ``async def`` (and one sync) handlers that wait."""

from __future__ import annotations

import asyncio
import os
import time

from alkstore_django import Fail, Snooze, current_run, handler

from .models import Run


def _options(job) -> dict:
    return job.payload if isinstance(job.payload, dict) else {}


async def arecord(job) -> None:
    """Record the run through Django's async ORM, as a handler in the asyncio pool would."""
    await Run.objects.acreate(
        job_id=job.id, attempt=job.attempts, queue=job.queue, worker_id=f"pid:{os.getpid()}"
    )


@handler("a.io")
async def io(job):
    """Record, then do what the payload says: sleep, fail, snooze, raise, swallow a cancel."""
    options = _options(job)
    if options.get("record", True):
        await arecord(job)
    if options.get("fail"):
        raise Fail("refused by the coroutine")
    if options.get("raise"):
        raise ValueError(f"coroutine boom {job.id}")
    if options.get("snooze_s") is not None and job.snoozes == 0:
        raise Snooze(float(options["snooze_s"]))
    if options.get("swallow"):
        # Ignores every cancellation until its time is up.
        deadline = time.monotonic() + float(options["swallow"])
        while time.monotonic() < deadline:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue
        return {"swallowed": job.id}
    if options.get("heed_cancel"):
        run = current_run()
        while not run.cancel_requested:
            await asyncio.sleep(0.01)
        run.raise_if_cancelled()
    await asyncio.sleep(float(options.get("sleep_s", 0)))
    return {"ok": job.id}


@handler("a.sync")
def sync_in_asyncio(job):
    """A plain handler in the asyncio pool: it runs in the pool's thread executor."""
    Run.objects.create(
        job_id=job.id, attempt=job.attempts, queue=job.queue, worker_id=f"pid:{os.getpid()}"
    )
    options = _options(job)
    if options.get("loop"):
        while True:
            sum(range(100))
    time.sleep(float(options.get("sleep_s", 0)))
    return {"thread": job.id}
