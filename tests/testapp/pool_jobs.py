"""Handlers for the process-pool tests: each records its run with the pid that ran it."""

from __future__ import annotations

import os
import signal
import time
from decimal import Decimal

from alkstore_django import Fail, handler
from alkstore_django.codecs import DjangoJSONCodec

from .models import Run

# What a leaking handler keeps alive between jobs, as a real leak would.
LEAKED: list[bytes] = []


def record_pid(job) -> None:
    Run.objects.create(
        job_id=job.id, attempt=job.attempts, queue=job.queue, worker_id=f"pid:{os.getpid()}"
    )


class DecimalCodec(DjangoJSONCodec):
    """A site's codec whose decoded payload is not JSON: a ``price`` comes back a ``Decimal``."""

    def decode(self, value):
        if isinstance(value, dict) and "price" in value:
            return {**value, "price": Decimal(value["price"])}
        return value


def _options(job) -> dict:
    return job.payload if isinstance(job.payload, dict) else {}


@handler("p.work")
def work(job):
    """Record, then do what the payload says: segfault, loop for ever, sleep, leak."""
    record_pid(job)
    options = _options(job)
    if "price" in options and not isinstance(options["price"], Decimal):
        raise Fail(f"the payload was not decoded by DecimalCodec: {options['price']!r}")
    if options.get("segfault"):
        os.kill(os.getpid(), signal.SIGSEGV)
    if options.get("loop"):
        while True:
            pass
    if options.get("leak_mb"):
        LEAKED.append(b"x" * (int(options["leak_mb"]) * 2**20))
    time.sleep(float(options.get("sleep_s", 0)))
    return job.id
