"""Handlers for the progress tests: they report through ``current_run()`` and wait on a file.

Files, not Events or rows, so the same handler serves the process pool,
whose handler runs in a child process (a child's database is the site's, not
the test database). The payload says what to report and how to end.
"""

from __future__ import annotations

import os
import time

from alkstore_django import Snooze, current_run, handler
from alkstore_django.errors import InvalidArgument


def _wait_for(path: str | None, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


@handler("t.progress")
def report(job):
    """Report each of ``reports`` ([done, total, note]), ``gap_s`` apart, then end as told.

    It touches ``started`` (a file) first and waits for ``release`` after its
    reports, then ends: ``raise`` (a failed attempt), ``snooze`` (60 s), or a return.
    """
    run = current_run()
    options = job.payload
    if options.get("started"):
        with open(options["started"], "a"):
            pass
    for n, (done, total, note) in enumerate(options.get("reports", [])):
        if n:
            time.sleep(float(options.get("gap_s", 0)))
        run.progress(done, total, note)
    _wait_for(options.get("release"))
    if options.get("raise"):
        raise ValueError("failed after reporting")
    if options.get("snooze"):
        raise Snooze(60)
    return None


@handler("t.progress.spin")
def spin(job):
    """Report ``calls`` times, evenly over ``duration_s``: a tight loop reporting as it goes."""
    run = current_run()
    calls, duration_s = int(job.payload["calls"]), float(job.payload["duration_s"])
    started = time.monotonic()
    for i in range(calls):
        run.progress(i + 1, calls, "spinning")
        # Evenly spread: sleep until this call's share of the duration has passed.
        ahead = started + duration_s * (i + 1) / calls - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    return calls


@handler("t.progress.bad")
def bad(job):
    """Report the payload's ``args``; return the refusal's message (keep its result)."""
    try:
        current_run().progress(*job.payload["args"])
    except InvalidArgument as exc:
        return str(exc)
    return None
