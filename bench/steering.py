"""Issue 24's rows: a keyed drain next to the plain one, and what progress costs.

The commands (``python -m bench.workloads <command>``; ``bench/workloads.py``
hands them here)::

    drain-keyed N PROCS [PER_KEY] [KEYS]   # default 4 per key over 20 keys
    drain-progress N PROCS                 # the no-op, reporting progress once
    progress-write N                       # N claim renewals with progress, N without
    progress-calls CALLS [runworker args...]

``drain-keyed`` is ``drain`` (the no-op handler, the same worker flags) with
job ``i`` enqueued under ``concurrency_key=f"customer:{i % KEYS}"`` on
``bench.keyed``, whose ``max_running_per_key`` is ``PER_KEY``
(``bench/settings.py`` reads it from ``BENCH_MAX_RUNNING_PER_KEY``, which
the workers inherit); next to it, the drain of ``bench.limited``
(``max_running: 16``), the other claim behind the queue's control row. The
progress drain is ``drain`` of a no-op that calls
``current_run().progress(1, 1, "row")`` (a job that ends within its first
second writes none: its ack deletes the row). On PostgreSQL
``progress_writes`` counts the job rows' updates beyond the claims
(``pg_stat_user_tables``): the writes the drain made. ``progress-write``
times the write itself: the fenced claim renewal that carries it, next to
one that does not.
``progress-calls`` runs one job whose handler calls ``progress`` CALLS times
in a tight loop and times the loop itself.

The other half, ``bench/run.py``'s side: ``steering_workloads`` names the
rows and their commands, ``steering_derived`` the per-round comparisons with
the plain drain of the same round.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

DEFAULT_PER_KEY = 4
DEFAULT_KEYS = 20
PROGRESS_CALLS = 100_000
# Claim renewals timed each way by ``progress-write``.
PROGRESS_WRITES = 2_000
# Jobs of one key written by one enqueue_many: the keys interleave every so many ids.
KEY_RUN = 50


def main(command: str, args: list[str]) -> dict:
    """Run one steering command; return its figures (``bench/workloads.py`` prints them)."""
    from bench.workloads import cmd_drain, setup

    if command == "drain-keyed":
        per_key = int(args[2]) if len(args) > 2 else DEFAULT_PER_KEY
        keys = int(args[3]) if len(args) > 3 else DEFAULT_KEYS
        # Before the settings are read: this process's and the workers' (they inherit it).
        os.environ["BENCH_MAX_RUNNING_PER_KEY"] = str(per_key)
        setup()
        check_per_key(per_key)
        result = cmd_drain(
            int(args[0]), int(args[1]), [], queue="bench.keyed", fill=keyed_fill(keys)
        )
        return {**result, "per_key": per_key, "keys": keys}
    setup()
    if command == "progress-write":
        return cmd_progress_write(int(args[0]))
    if command == "drain-progress":
        n = int(args[0])
        before = row_updates()
        result = cmd_drain(n, int(args[1]), [], queue="bench.progress")
        after = row_updates()
        if before is not None and after is not None:
            result["progress_writes"] = after - before - n  # each job's claim is one update
        return result
    if command == "progress-calls":
        return cmd_progress_calls(int(args[0]), args[1:])
    raise SystemExit(f"unknown workload {command!r}")


def keyed_fill(keys: int):
    """Return a ``cmd_drain`` fill: job ``i`` under ``customer:{i % keys}``.

    ``enqueue_many`` gives one key to its whole batch, so each call writes
    ``KEY_RUN`` jobs of one key and the keys take turns: the ids interleave
    by runs of ``KEY_RUN``, each key ending with ``n / keys`` jobs.
    """

    def fill(q, n: int) -> None:
        from django.db import connection

        from alkstore_django.models import Job

        for start in range(0, n, KEY_RUN * keys):
            for key in range(keys):
                count = len(range(start + key, min(start + KEY_RUN * keys, n), keys))
                if count:
                    q.enqueue_many([None] * count, concurrency_key=f"customer:{key}")
        if connection.vendor == "postgresql":
            # What autovacuum's analyze does within its naptime of a burst this
            # size (the server here runs with autovacuum off): without it the
            # planner, which saw the table empty, reads the keyed claim's
            # probes through alk_job_claim (docs/performance.md).
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {Job._meta.db_table}")

    return fill


def check_per_key(per_key: int) -> None:
    """Refuse to time ``bench.keyed`` unless its limit is the one asked for."""
    try:
        from alkstore_django.overview import queue_limit_states
    except ImportError:  # an earlier tree (--baseline), before overview.py
        from alkstore_django.operations import queue_limit_states

    state = queue_limit_states().get("bench.keyed")
    if state is None or state.max_running_per_key != per_key:
        raise SystemExit(
            f"bench.keyed has max_running_per_key "
            f"{None if state is None else state.max_running_per_key}, not {per_key}"
        )


def row_updates() -> int | None:
    """The job table's updates so far (PostgreSQL's statistics), or None on other engines.

    The workers' counts are flushed when their connections close, before
    their processes exit.
    """
    from django.db import connection

    from alkstore_django.models import Job

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = %s::regclass",
            [Job._meta.db_table],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else None


def cmd_progress_write(n: int) -> dict:
    """The write's own cost: ``n`` claim renewals carrying progress next to ``n`` without.

    The worker writes a job's progress in that job's fenced heartbeat
    (renewed early when only the progress is due), so a write costs one such
    statement, at most once a second per job. One claim of ``n`` jobs, then
    per job one renewal of each kind, which goes first alternating.
    """
    from alkstore_django import store
    from bench.workloads import clear

    clear()
    queue = store.queue("bench.progress")
    queue.enqueue_many([None] * n)
    handles = queue.claim_batch("bench-progress-write", n)
    value = {"done": 1, "total": 1, "note": "row"}
    spent = {False: 0.0, True: 0.0}
    for i, handle in enumerate(handles):
        for carry in (True, False) if i % 2 else (False, True):
            started = time.perf_counter()
            if not handle.heartbeat(300, value if carry else None):
                raise SystemExit(f"progress-write: job {handle.job.id}'s claim was lost")
            spent[carry] += time.perf_counter() - started
    queue.ack_batch([handle.job.id for handle in handles])
    count = len(handles)
    return {
        "renewal_us": spent[False] / count * 1e6,
        "renewal_with_progress_us": spent[True] / count * 1e6,
    }


def cmd_progress_calls(calls: int, extra: list[str]) -> dict:
    """One job whose handler calls ``current_run().progress(i, calls, "rows")`` ``calls`` times.

    A ``runworker --burst`` (with ``extra``, e.g. ``--pool processes``) runs
    it; the handler times its loop (``perf_counter``) and then waits until
    the worker has written the last value and reads it back from the
    database (``bench/app/jobs.py``), so a progress that never arrives fails
    the run.
    """
    from django.db import connections

    from alkstore_django import store
    from bench.workloads import clear, worker_command, worker_env

    clear()
    store.queue("bench.progress-calls").enqueue({"calls": calls})
    connections.close_all()
    tmp = Path(tempfile.mkdtemp(prefix="alkbench-"))
    mark, log_path = tmp / "mark", tmp / "log"
    with open(log_path, "w") as log:
        code = subprocess.run(
            worker_command("bench.progress-calls", ["--burst", *extra]),
            env=worker_env(str(mark)),
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=Path(__file__).absolute().parent.parent,
            timeout=120,
        ).returncode
    lines = [line.split() for line in mark.read_text().splitlines()] if mark.exists() else []
    timed = [line for line in lines if line[0] == "calls"]
    if code != 0 or len(timed) != 1:
        raise SystemExit(f"progress-calls failed: exit code {code}, marks {lines}; log in {tmp}")
    _, n, seconds, done = timed[0]
    if done != str(calls - 1):
        raise SystemExit(f"progress-calls read back done={done}, not {calls - 1}; log in {tmp}")
    for path in tmp.iterdir():
        path.unlink()
    tmp.rmdir()
    return {"calls": int(n), "seconds": float(seconds), "us_per_call": float(seconds) / calls * 1e6}


# --- bench/run.py's side ------------------------------------------------------------------

Workloads = dict[str, tuple[list[str], str, str]]  # figure name → (command, result key, unit)


def keyed_label(n: int, per_key: int = DEFAULT_PER_KEY, keys: int = DEFAULT_KEYS) -> str:
    return f"drain {n}, keyed ({keys} keys, max {per_key} per key)"


def steering_workloads(n: int, engine: str) -> Workloads:
    """The keyed drains, the progress drains and the progress calls, as rows of commands."""
    rows: Workloads = {}
    keyed = keyed_label(n)
    for procs in (1, 4):
        p = f"{procs} process{'es' if procs > 1 else ''}"
        command = ["drain-keyed", str(n), str(procs), str(DEFAULT_PER_KEY), str(DEFAULT_KEYS)]
        rows[f"{keyed}, {p}"] = (command, "rate", "jobs/s")
        rows[f"{keyed}, {p}, to the last ack"] = (command, "ack_rate", "jobs/s")
        if procs == 1:
            rows[f"{keyed}, {p}, worker CPU per job"] = (command, "cpu_us_per_job", "us")
        # The other limited claim (bench/settings.py), to tell the key's cost from the lock's.
        limited = ["drain-queue", "bench.limited", str(n), str(procs)]
        rows[f"drain {n}, max_running 16, {p}, to the last ack"] = (limited, "ack_rate", "jobs/s")
    what = "progress() once per job"
    command = ["drain-progress", str(n), "1"]
    rows[f"drain {n}, {what}, 1 process"] = (command, "rate", "jobs/s")
    rows[f"drain {n}, {what}, 1 process, to the last ack"] = (command, "ack_rate", "jobs/s")
    rows[f"drain {n}, {what}, 1 process, worker CPU per job"] = (command, "cpu_us_per_job", "us")
    if engine == "postgresql":
        rows[f"drain {n}, {what}, 1 process, writes"] = (command, "progress_writes", "rows")
    write = ["progress-write", str(PROGRESS_WRITES)]
    rows["claim renewal (heartbeat), one job"] = (write, "renewal_us", "us")
    rows["claim renewal carrying progress (a progress write), one job"] = (
        write, "renewal_with_progress_us", "us",
    )  # fmt: skip
    for pool, pool_name in (("threads", "thread pool"), ("processes", "process pool")):
        command = ["progress-calls", str(PROGRESS_CALLS), "--pool", pool]
        name = f"progress() per call ({PROGRESS_CALLS:,} in one job), {pool_name}"
        rows[name] = (command, "us_per_call", "us")
    return rows


def steering_derived(fig: dict, n: int) -> list[tuple[str, str, list[float]]]:
    """Per-round comparisons with the plain drain of the same round: (name, unit, values).

    ``fig`` maps a row's name to its figure (``values``, one a round), the
    plain drain's rows (``bench/run.py``'s ``plain_drain_workloads``) included.
    """
    keyed = keyed_label(n)
    rows = []

    def derived(name: str, unit: str, a: str, b: str, how) -> None:
        pairs = zip(fig[a].values, fig[b].values, strict=True)
        rows.append((name, unit, [how(x, y) for x, y in pairs]))

    for p in ("1 process", "4 processes"):
        derived(
            f"keyed / plain drain, {p}", "x", f"{keyed}, {p}", f"drain {n} no-op, {p}",
            lambda a, b: a / b,
        )  # fmt: skip
        derived(
            f"keyed / plain drain, {p}, to the last ack", "x",
            f"{keyed}, {p}, to the last ack", f"drain {n} no-op, {p}, to the last ack",
            lambda a, b: a / b,
        )  # fmt: skip
        derived(
            f"keyed / max_running 16 drain, {p}, to the last ack", "x",
            f"{keyed}, {p}, to the last ack", f"drain {n}, max_running 16, {p}, to the last ack",
            lambda a, b: a / b,
        )  # fmt: skip
    derived(
        "keyed claim's worker CPU per job over plain", "us",
        f"{keyed}, 1 process, worker CPU per job",
        f"drain {n} no-op, 1 process, worker CPU per job",
        lambda a, b: a - b,
    )  # fmt: skip
    derived(
        "a progress write over a plain renewal", "us",
        "claim renewal carrying progress (a progress write), one job",
        "claim renewal (heartbeat), one job",
        lambda a, b: a - b,
    )  # fmt: skip
    for what in ("progress() once per job",):
        derived(
            f"{what}: cost per job, 1 process", "us",
            f"drain {n}, {what}, 1 process, to the last ack",
            f"drain {n} no-op, 1 process, to the last ack",
            lambda a, b: 1e6 / a - 1e6 / b,
        )  # fmt: skip
        derived(
            f"{what}: worker CPU per job over plain", "us",
            f"drain {n}, {what}, 1 process, worker CPU per job",
            f"drain {n} no-op, 1 process, worker CPU per job",
            lambda a, b: a - b,
        )  # fmt: skip
    return rows


def has_steering(tree: Path) -> bool:
    """True when ``tree``'s package has the run context and the keyed claim."""
    package = tree / "alkstore_django"
    return (package / "runs.py").exists() and (package / "dialects" / "keys.py").exists()
