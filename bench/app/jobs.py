"""Bench handlers: a no-op, one that stamps its start for the latency workload, a workflow step.

Each handler appends to ``BENCH_MARK_FILE`` (when set): the no-op only once per
process (the moment this process started draining), the latency handler one
``<i> <monotonic>`` line per job, the workflow step one
``<step> <workflow id> <monotonic>`` line per run of a step named ``root`` or
``fan-in``.
``time.monotonic()`` is CLOCK_MONOTONIC, one clock for every process on the
machine.
"""

from __future__ import annotations

import os
import time

from alkstore_django import handler

_marks: dict[str, object] = {}


def _mark_file():
    f = _marks.get("file")
    if f is None:
        path = os.environ.get("BENCH_MARK_FILE")
        f = open(path, "a", buffering=1) if path else False  # noqa: SIM115
        _marks["file"] = f
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


def _first_mark():
    if "first" not in _marks:
        _marks["first"] = time.monotonic()
        f = _mark_file()
        if f:
            f.write(f"first {_marks['first']!r}\n")


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
