"""Bench handlers: the no-op, the latency stamp, a workflow step, the soak's job.

Each handler appends to ``BENCH_MARK_FILE`` (when set): the no-op only once per
process (the moment this process started draining, and its CPU time so far,
so a drain's CPU can be told from Django's start-up), the latency handler one
``<i> <monotonic>`` line per job, the workflow step one
``<step> <workflow id> <monotonic>`` line per run of a step named ``root`` or
``fan-in``.
``time.monotonic()`` is CLOCK_MONOTONIC, one clock for every process on the
machine.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from alkstore_django import handler

try:
    from alkstore_django import current_run
except ImportError:  # an earlier checkout run by --baseline has no run context
    current_run = None

_marks: dict[str, object] = {}


def _mark_file(key: str = "file", buffering: int = 1):
    """The worker's mark file (``BENCH_MARK_FILE``), opened once per ``key``; False without one."""
    f = _marks.get(key)
    if f is None:
        path = os.environ.get("BENCH_MARK_FILE")
        f = open(path, "a", buffering=buffering) if path else False  # noqa: SIM115
        _marks[key] = f
    return f


@handler("bench.noop")
def noop(job):
    _first_mark()


# The same no-op on the queues with controls (bench/settings.py).
@handler("bench.limited")
def limited(job):
    _first_mark()


@handler("bench.rated")
def rated(job):
    _first_mark()


# The steering rows (bench/steering.py): the no-op under max_running_per_key
# (bench/settings.py), and the no-op that reports its progress once.
@handler("bench.keyed")
def keyed(job):
    _first_mark()


@handler("bench.progress")
def progress_once(job):
    _first_mark()
    current_run().progress(1, 1, "row")


@handler("bench.progress-calls")
def progress_calls(job):
    """``payload["calls"]`` reports in a tight loop, timed here; then the last one read back.

    Writes ``calls <n> <seconds> <done read back>`` to the mark file. The
    read-back waits for the worker's throttled write (at most one a second),
    outside the timed loop.
    """
    from alkstore_django.models import Job

    n = job.payload["calls"]
    started = time.perf_counter()
    for i in range(n):
        current_run().progress(i, n, "rows")
    elapsed = time.perf_counter() - started
    done = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stored = Job.objects.filter(id=job.id).values_list("progress", flat=True).first()
        done = stored["done"] if stored else None
        if done == n - 1:
            break
        time.sleep(0.02)
    f = _mark_file()
    if f:
        f.write(f"calls {n} {elapsed!r} {done}\n")


@handler("bench.io")
async def io_bound(job):
    """The I/O-bound job of the ``io`` workload (``bench/io_bound.py``): it waits 50 ms."""
    _first_mark()
    await asyncio.sleep(0.05)


def _first_mark():
    if "first" not in _marks:
        _marks["first"] = time.monotonic()
        f = _mark_file()
        if f:
            # The process's CPU (every thread's) at its first job: start-up's.
            f.write(f"first {_marks['first']!r} {time.process_time()!r}\n")


@handler("bench.latency")
def latency(job):
    started = time.monotonic()
    f = _mark_file()
    if f:
        f.write(f"{job.payload['i']} {started!r}\n")


@handler("bench.wf")
def workflow_step(job):
    """A no-op step (or plain job); the runs of steps ``root`` and ``fan-in`` are stamped."""
    # getattr: an earlier tree's jobs have no step (this module is loaded by --baseline too).
    step = getattr(job, "step", None)
    if step in ("root", "fan-in"):
        started = time.monotonic()
        f = _mark_file()
        if f:
            f.write(f"{step} {job.workflow_id} {started!r}\n")


class BenchFailure(Exception):
    """The failure of a bench job marked to fail (the soak's and the sizing's)."""


_soak_lock = threading.Lock()


@handler("bench.soak")
def soak(job):
    """The soak's job (``bench/soak.py``): a no-op that fails every attempt when ``payload["f"]``.

    On its first attempt it appends its pickup (start minus ``enqueued_at``,
    in ms) to ``BENCH_MARK_FILE`` through an 8 kB buffer: the soak reads the file
    once a sample, so one buffered write per job is the whole cost.
    """
    if job.attempts <= 1:
        f = _mark_file("soak", buffering=8192)
        if f:
            line = f"{(time.time() - job.enqueued_at.timestamp()) * 1000:.1f}\n"
            with _soak_lock:
                f.write(line)
    if job.payload.get("f"):
        raise BenchFailure(f"soak job {job.id} fails every attempt")


@handler("bench.size")
def size_probe(job):
    """The sizing job (``bench/scale.py sizing``): a no-op, or one failing its first attempt."""
    if job.payload.get("fail_once") and job.attempts <= 1:
        raise BenchFailure(f"sizing job {job.id} fails its first attempt")
