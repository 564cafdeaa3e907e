"""What tracing costs: a no-op handler's ``run_handler``, and an enqueue, in four set-ups.

    BENCH_DATABASE_URL=sqlite:////tmp/bench.sqlite3 python -m bench.tracing

Each set-up runs in a process of its own (the global tracer provider can be
set once per process): ``absent`` blocks ``opentelemetry`` as a site without
the ``otel`` extra; ``no-provider`` has the API and no provider set (the
API's proxy); ``provider`` sets an SDK ``TracerProvider`` with no span
processor (the span's own cost); ``provider+export`` adds a
``SimpleSpanProcessor`` over the in-memory exporter. ``run_handler`` is
timed next to a copy of itself without the tracing hooks, in the same
process; the enqueues run inside one rolled-back transaction, so no commit
is timed. Best of 7 rounds, microseconds per call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import timeit
from datetime import UTC, datetime

MODES = ("absent", "no-provider", "provider", "provider+export")
RUNS = 200_000
ENQUEUES = 2_000


def _set_up(mode: str) -> None:
    if mode == "absent":
        sys.modules["opentelemetry"] = None
    import django

    django.setup()
    if not mode.startswith("provider"):
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    if mode == "provider+export":
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    trace.set_tracer_provider(provider)


def _measure(mode: str) -> None:
    _set_up(mode)
    from django.core.management import call_command
    from django.db import transaction

    from alkstore_django import executor, store
    from alkstore_django.records import Job
    from alkstore_django.runs import Run, bind, unbind

    now = datetime.now(UTC)
    job = Job(
        id=1, queue="bench.noop", payload=None, priority=0, run_at=now, attempts=1,
        max_attempts=3, visibility_timeout_s=30, retry_base_s=1, expires_at=None,
        state="processing", worker_id="w", claim_expires_at=now, last_error=None,
        enqueued_at=now,
    )  # fmt: skip

    def noop(job: Job) -> None:
        return None

    def without_hooks(func, arg, job):
        started = time.monotonic()
        token = bind(Run(job))
        try:
            outcome = executor.Outcome(executor.ACK, value=executor.call_handler(func, arg))
        except BaseException as exc:  # noqa: BLE001 - as run_handler
            outcome = executor.outcome_of(exc, func, job)
        finally:
            unbind(token)
        return executor._timed(outcome, started, func, job)

    def best(call, number: int) -> float:
        return min(timeit.repeat(call, number=number, repeat=7)) / number * 1e6

    plain = best(lambda: without_hooks(noop, job, job), RUNS)
    hooked = best(lambda: executor.run_handler(noop, job, job), RUNS)

    call_command("migrate", verbosity=0)
    queue = store.queue("bench.tracing")

    def enqueues() -> None:
        with transaction.atomic():
            for _ in range(ENQUEUES):
                queue.enqueue({"n": 1})
            transaction.set_rollback(True)

    enqueue = best(enqueues, 1) / ENQUEUES
    print(
        f"{mode:16s} run_handler {hooked:7.2f}  (without hooks {plain:.2f})  enqueue {enqueue:7.1f}"
    )


def main() -> None:
    if len(sys.argv) > 1:
        _measure(sys.argv[1])
        return
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings"}
    print("set-up           microseconds per call")
    for mode in MODES:
        subprocess.run([sys.executable, "-m", "bench.tracing", mode], env=env, check=True)


if __name__ == "__main__":
    main()
