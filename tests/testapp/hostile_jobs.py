"""Handlers written the way real ones break: each records its run in ``Run`` first.

The hostile-handler suite (``tests/hostile/test_hostile_handlers.py``) runs
them under a real ``runworker`` next to innocent jobs.
"""

from __future__ import annotations

import asyncio
import os
import time

from asgiref.sync import sync_to_async

from alkstore_django import handler

from .jobs import record


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself raises")


@handler("h.nul")
def raise_nul(job):
    record(job)
    raise ValueError("bad \x00 byte")


@handler("h.surrogate")
def raise_surrogate(job):
    record(job)
    raise ValueError("cannot open \udc80.txt")


@handler("h.unprintable")
def raise_unprintable(job):
    record(job)
    raise UnprintableError()


@handler("h.huge")
def raise_huge(job):
    record(job)
    raise ValueError("x" * 5_000_000)


@handler("h.mixed")
def exit_or_ack(job):
    """Kill the worker when the payload says so; ack otherwise."""
    record(job)
    if (job.payload or {}).get("exit"):
        os._exit(3)
    return job.id


@handler("h.outlive")
def outlive_the_grace_period(job):
    record(job)
    time.sleep(float((job.payload or {}).get("sleep_s", 5)))


@handler("h.async")
async def async_handler(job):
    await asyncio.sleep(0.01)
    await sync_to_async(record)(job)
    if (job.payload or {}).get("raise"):
        raise RuntimeError("async handler failed")
    return job.id


class AckHookRaises:
    """A handler whose result hook fails, as a result write the database refuses would."""

    __qualname__ = "AckHookRaises"

    def __call__(self, job):
        record(job)
        return job.id

    def on_acked(self, job, value, using):
        raise RuntimeError("the result could not be written")

    def on_failed(self, job, outcome, exhausted, using):
        return None


handler("h.hook")(AckHookRaises())
