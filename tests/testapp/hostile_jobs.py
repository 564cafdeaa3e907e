"""Handlers written the way real ones break: each records its run in ``Run`` first.

The hostile-handler suite (``tests/hostile/test_hostile_handlers.py``) runs
them under a real ``runworker`` next to innocent jobs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from asgiref.sync import sync_to_async

from alkstore_django import handler

from .jobs import record


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself raises")


# A class named at run time (a generated class, say) can be longer than any column.
LongNamedError = type("Long" + "N" * 590 + "Error", (Exception,), {})


@handler("h.long-class-name")
def raise_long_class_name(job):
    record(job)
    raise LongNamedError("the real error")


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


@handler("h.gil")
def hold_the_gil(job):
    """Sleep in a C call that keeps the GIL (``PyDLL`` does not release it): a stuck extension."""
    import ctypes

    record(job)
    # First let the worker finish the claim round that brought this job (and its neighbours).
    time.sleep(float((job.payload or {}).get("after_s", 0)))
    ctypes.PyDLL(None).sleep(int((job.payload or {}).get("sleep_s", 60)))


@handler("h.fork-then-die")
def fork_a_helper_then_die(job):
    """Fork a helper that outlives this process (holding its pipes), then die of SIGKILL.

    The OOM killer's shape when the handler used ``multiprocessing`` or
    started a daemon: the helper's pid goes to the file the payload names.
    """
    record(job)
    helper = os.fork()
    if helper == 0:
        time.sleep(120)
        os._exit(0)
    with open((job.payload or {})["pid_file"], "w") as pid_file:
        pid_file.write(str(helper))
    os.kill(os.getpid(), signal.SIGKILL)


@handler("h.deaf")
def ignore_sigterm(job):
    """Ignore SIGTERM and keep running, writing this process's pid to the payload's file."""
    record(job)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open((job.payload or {})["pid_file"], "w") as pid_file:
        pid_file.write(str(os.getpid()))
    time.sleep(float((job.payload or {}).get("sleep_s", 60)))
