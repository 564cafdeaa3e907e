"""Issue 25's rows: I/O-bound jobs drained by the asyncio pool, the thread pool and procrastinate.

Every job is an ``async def`` handler that waits ``await asyncio.sleep(0.05)``
(``bench.io`` in ``bench/app/jobs.py``; ``bench_io`` in
``bench/peers/procrastinate_app.py``). One worker process drains them:

- ``runworker --burst --pool asyncio --concurrency 200``: the coroutines run
  on the pool's one event loop;
- ``runworker --burst --pool threads --concurrency 200``, and the default
  ``--concurrency 4``: each handler thread awaits its job through
  ``async_to_sync``, one job per thread at a time (the thread pool's way
  with an ``async def`` handler);
- with ``--peers``, on PostgreSQL: ``procrastinate worker --one-shot
  --concurrency 200``, the task on its worker's event loop (its default
  connection pool, 4 connections). After the jobs are deferred its job
  table is ``ANALYZE``d, as autovacuum would do after such a burst.

The command (``python -m bench.workloads drain-io N [runworker args...]``)
is ``drain`` of ``bench.io`` by one process. Each row reports jobs/s (from
the first handler start to the worker's exit, and, for alkstore, to the
last ack's log line), the worker's CPU per job from its first job on
(``drain_cpu_us_per_job``: its CPU then, written in its mark, taken off)
and with its start-up, and its peak RSS (``VmHWM`` polled from ``/proc``;
procrastinate's ``ru_maxrss``, a process without children). The ideal rate
is the concurrency over 50 ms: 4,000 jobs/s at 200, 80 at 4; the thread
pool at 4 drains fewer jobs so that its run stays bounded (jobs/s are
compared, not times).

``bench/run.py`` runs the commands of ``io_workloads`` once a round, the
order reversed on odd rounds, and adds ``io_derived``'s per-round ratios.
"""

from __future__ import annotations

SLEEP_S = 0.05
WIDE = 200
NARROW = 4

# figure name → (system, command, result key, unit); the command's first word says
# which driver runs it ("alkstore": bench.workloads, "procrastinate": its driver).
Rows = dict[str, tuple[str, list[str], str, str]]

ASYNCIO = f"asyncio pool, concurrency {WIDE}"
THREADS = f"thread pool, concurrency {WIDE}"
THREADS_NARROW = f"thread pool, concurrency {NARROW} (default)"
PROCRASTINATE = f"procrastinate worker, concurrency {WIDE}"


def label(n: int, pool: str) -> str:
    return f"io drain {n} jobs of {SLEEP_S * 1000:.0f} ms, {pool}"


def io_workloads(n: int, n_narrow: int, procrastinate: bool) -> Rows:
    """The rows: each pool's drain (and procrastinate's) and what each gives."""
    wide = ["--concurrency", str(WIDE)]
    runs = {
        ASYNCIO: ("alkstore", n, ["drain-io", str(n), "--pool", "asyncio", *wide]),
        THREADS: ("alkstore", n, ["drain-io", str(n), "--pool", "threads", *wide]),
        THREADS_NARROW: ("alkstore", n_narrow, ["drain-io", str(n_narrow), "--pool", "threads"]),
    }
    if procrastinate:
        runs[PROCRASTINATE] = ("procrastinate", n, ["drain-io", str(n), str(WIDE)])
    rows: Rows = {}
    for pool, (system, size, command) in runs.items():
        name = label(size, pool)
        rows[name] = (system, command, "rate", "jobs/s")
        if system == "alkstore":
            rows[f"{name}, to the last ack"] = (system, command, "ack_rate", "jobs/s")
        rows[f"{name}, worker CPU per job"] = (system, command, "drain_cpu_us_per_job", "us")
        rows[f"{name}, worker CPU per job, start-up included"] = (
            system, command, "cpu_us_per_job", "us",
        )  # fmt: skip
        rss = "parent_rss_mb" if system == "alkstore" else "rss_mb"
        rows[f"{name}, worker RSS (peak)"] = (system, command, rss, "MB")
    return rows


def io_derived(values: dict[str, list[float]], n: int, n_narrow: int) -> list[tuple]:
    """Per-round comparisons: (name, system, unit, values), from each row's values by name."""
    rows = []
    concurrency = {ASYNCIO: WIDE, THREADS: WIDE, THREADS_NARROW: NARROW, PROCRASTINATE: WIDE}
    sizes = {ASYNCIO: n, THREADS: n, THREADS_NARROW: n_narrow, PROCRASTINATE: n}
    for pool, width in concurrency.items():
        rates = values.get(label(sizes[pool], pool))
        if rates:
            ideal = width / SLEEP_S
            system = "procrastinate" if pool == PROCRASTINATE else "alkstore"
            name = f"io drain, {pool}: share of the ideal {ideal:.0f} jobs/s"
            rows.append((name, system, "x", [rate / ideal for rate in rates]))
    ours = values[label(n, ASYNCIO)]
    for pool in (THREADS, THREADS_NARROW, PROCRASTINATE):
        theirs = values.get(label(sizes[pool], pool))
        if theirs:
            pairs = zip(ours, theirs, strict=True)
            rows.append((f"io drain, asyncio pool / {pool}", "alkstore", "x",
                         [a / b for a, b in pairs]))  # fmt: skip
    return rows
