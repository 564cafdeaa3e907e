"""Scale benches on PostgreSQL: what a job writes, and what a long transaction does to the drain.

    python -m bench.scale sizing [--jobs 10000] [--runs 3]
    python -m bench.scale idle [--rate 300] [--hold-s 60] [--timeout-s 10] [--window-s 10]
                               [--before-s 30] [--after-s 60]

Both run on their own database ``alk_scale_bench`` (``BENCH_SCALE_URL``,
default postgres://postgres@127.0.0.1:5432/alk_scale_bench), dropped and
created afresh and dropped at the end, with ``bench.settings``; run them
with PYTHONPATH set to the tree to measure.

``sizing``: for each kind of job (a no-op; one that fails its first attempt
and succeeds on the retry, ``retry_base_s=0.2``; a no-op enqueued with
``keep_result_s``), the alkstore tables are emptied, then ``--jobs`` jobs are
enqueued (``enqueue_many``, 100 a statement) and drained by ``runworker
--burst`` (again until none is left, for the retries). Around each step it
reads ``pg_current_wal_lsn()`` and the row counters of every alkstore table
(``n_tup_ins``, ``n_tup_upd``, ``n_tup_del`` of ``pg_stat_user_tables``,
after a pause for the workers' statistics to be flushed) and prints the WAL
bytes and rows written per job, and the job table's bytes per pending job.
WAL is the whole server's: other sessions' writes count too, so each kind
runs ``--runs`` times and the minimum is the figure (the median beside it;
the rows are the median).

``idle``: a producer thread enqueues ``--rate`` jobs a second and the main
thread drains them (``claim_one`` + ``ack``, each claim timed) for
``before + hold + after`` seconds. After ``--before-s`` another session takes
a snapshot and sits idle in its transaction for ``--hold-s`` (``BEGIN
ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM alkstore_django_job LIMIT 1``,
then nothing). Per ``--window-s`` window it prints the drain rate, the claim's
median and p99, the pending jobs, ``n_dead_tup`` of the job table and the
holder's state and xmin age. Then the same with the mitigation: ``ALTER
DATABASE … SET idle_in_transaction_session_timeout = '<timeout>s'`` (reset
afterwards), which ends the holder's session after ``--timeout-s``. It first
prints, for the record, whether an idle READ COMMITTED transaction holds an
xmin (without and with a write). Autovacuum is turned on for the run and
restored after, as the soak does (``bench/soak.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCALE_URL = os.environ.get("BENCH_SCALE_URL", "postgres://postgres@127.0.0.1:5432/alk_scale_bench")
JOB_TABLE = "alkstore_django_job"
ENQUEUE_BATCH = 100
COUNTERS_SQL = r"""
SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_del), 0)
FROM pg_stat_user_tables WHERE relname LIKE 'alkstore\_%'
"""
# Time for an ended backend's table counters to reach pg_stat_user_tables.
STATS_FLUSH_S = 1.5


def setup(url: str) -> None:
    """Point bench.settings at ``url``, start Django and migrate."""
    os.environ["BENCH_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _pg(url: str):
    import psycopg

    from bench.soak import _admin

    return psycopg.connect(_admin(url), autocommit=True)


def _empty_tables(conn) -> None:
    names = [
        r[0]
        for r in conn.execute(
            r"SELECT relname FROM pg_stat_user_tables WHERE relname LIKE 'alkstore\_%'"
        ).fetchall()
    ]
    conn.execute(f"TRUNCATE {', '.join(names)}")
    conn.execute("CHECKPOINT")


def _wal_and_rows(conn) -> tuple[int, tuple[int, int, int]]:
    lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]
    return int(lsn), tuple(int(v) for v in conn.execute(COUNTERS_SQL).fetchone())


def _burst_until_empty(conn, url: str) -> None:
    from bench.run import base_env

    env = {**base_env(), "BENCH_DATABASE_URL": url}
    command = [sys.executable, "-m", "django", "runworker", "--burst", "--queue", "bench.size"]
    for _ in range(20):
        # The first attempts' tracebacks are the worker's log, not the bench's output.
        done = subprocess.run(
            [*command, "-v", "0"], env=env, cwd=ROOT, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"sizing: runworker --burst failed:\n{done.stderr}")
        if not conn.execute(f"SELECT count(*) FROM {JOB_TABLE}").fetchone()[0]:
            return
        time.sleep(0.5)  # the retries are due within retry_base_s
    raise SystemExit(f"sizing: jobs still left in {JOB_TABLE} after 20 bursts")


SIZING_KINDS = {
    "no-op": ({}, {}),
    "fails once, then retried": ({"fail_once": True}, {"retry_base_s": 0.2}),
    "kept result (keep_result_s)": ({}, {"keep_result_s": 3600}),
}


def sizing_run(conn, url: str, jobs: int, payload: dict, opts: dict) -> dict:
    """Enqueue then drain ``jobs`` jobs of one kind; return the WAL and rows of each step."""
    from django.db import connections

    from alkstore_django import store

    _empty_tables(conn)
    time.sleep(STATS_FLUSH_S)
    handle_opts = {k: v for k, v in opts.items() if k != "keep_result_s"}
    q = store.queue("bench.size", **handle_opts)
    keep = {"keep_result_s": opts["keep_result_s"]} if "keep_result_s" in opts else {}
    wal0, rows0 = _wal_and_rows(conn)
    for start in range(0, jobs, ENQUEUE_BATCH):
        end = min(start + ENQUEUE_BATCH, jobs)
        q.enqueue_many([{"i": i, **payload} for i in range(start, end)], **keep)
    # A backend flushes its table counters when it ends (else up to 10 s late).
    connections.close_all()
    time.sleep(STATS_FLUSH_S)
    wal1, rows1 = _wal_and_rows(conn)
    job_bytes = conn.execute(f"SELECT pg_total_relation_size('{JOB_TABLE}')").fetchone()[0]
    _burst_until_empty(conn, url)
    time.sleep(STATS_FLUSH_S)
    wal2, rows2 = _wal_and_rows(conn)
    return {
        "enqueue_wal": (wal1 - wal0) / jobs,
        "drain_wal": (wal2 - wal1) / jobs,
        "wal": (wal2 - wal0) / jobs,
        "enqueue_rows": [(b - a) / jobs for a, b in zip(rows0, rows1, strict=True)],
        "drain_rows": [(b - a) / jobs for a, b in zip(rows1, rows2, strict=True)],
        "job_bytes_per_pending": job_bytes / jobs,
    }


def sizing(url: str, jobs: int, runs: int) -> None:
    setup(url)
    print(
        f"sizing: {jobs} jobs per run, {runs} runs per kind, min (median) of the runs; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'kind':<30}{'WAL B/job':>16}{'enqueue':>14}{'drain':>14}"
        f"{'rows ins/upd/del per job':>30}{'job B/pending':>15}"
    )
    with _pg(url) as conn:
        for kind, (payload, opts) in SIZING_KINDS.items():
            results = [sizing_run(conn, url, jobs, payload, opts) for _ in range(runs)]

            def fig(key: str, results: list[dict] = results) -> str:
                values = [r[key] for r in results]
                return f"{min(values):.0f} ({statistics.median(values):.0f})"

            rows = [
                statistics.median(r["enqueue_rows"][i] + r["drain_rows"][i] for r in results)
                for i in range(3)
            ]
            print(
                f"{kind:<30}{fig('wal'):>16}{fig('enqueue_wal'):>14}{fig('drain_wal'):>14}"
                f"{'/'.join(f'{v:.2f}' for v in rows):>30}{fig('job_bytes_per_pending'):>15}",
                flush=True,
            )
            print(json.dumps({"sizing": kind, "jobs": jobs, "runs": results}))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


def read_committed_xmin(url: str) -> None:
    """Print whether an idle READ COMMITTED transaction holds an xmin, without and with a write."""
    import psycopg

    from bench.soak import _admin

    with _pg(url) as probe, psycopg.connect(_admin(url)) as holder:
        pid = holder.info.backend_pid
        query = "SELECT backend_xid, backend_xmin FROM pg_stat_activity WHERE pid = %s"
        holder.execute(f"SELECT 1 FROM {JOB_TABLE} LIMIT 1")
        after_read = probe.execute(query, [pid]).fetchone()
        holder.execute("SELECT txid_current()")
        after_write = probe.execute(query, [pid]).fetchone()
        holder.rollback()
    print(
        f"idle READ COMMITTED transaction after a SELECT: backend_xid={after_read[0]}, "
        f"backend_xmin={after_read[1]}; after taking an xid: backend_xid={after_write[0]}, "
        f"backend_xmin={after_write[1]}"
    )


class Holder(threading.Thread):
    """The long transaction: a REPEATABLE READ snapshot, then idle for ``hold_s``."""

    def __init__(self, url: str, hold_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.hold_s = url, hold_s
        self.pid: int | None = None
        self.outcome = "not started"

    def run(self) -> None:
        import psycopg

        from bench.soak import _admin

        # Not ``with``: its exit would commit on a connection the server may have ended.
        conn = psycopg.connect(_admin(self.url))
        try:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            self.pid = conn.info.backend_pid
            conn.execute(f"SELECT 1 FROM {JOB_TABLE} LIMIT 1")
            started = time.monotonic()
            time.sleep(self.hold_s)
            try:
                conn.commit()
                self.outcome = f"committed after {time.monotonic() - started:.0f} s"
            except psycopg.Error as exc:
                self.outcome = f"ended by the server ({str(exc).strip().splitlines()[0]})"
        finally:
            conn.close()


def idle_variant(url: str, args: argparse.Namespace, timeout_s: float | None) -> list[dict]:
    """One steady enqueue+drain with a holder in the middle; return one row per window."""
    from django.db import connections

    from alkstore_django import store

    db = url.rsplit("/", 1)[1]
    with _pg(url) as conn:
        _empty_tables(conn)
        conn.execute(f"VACUUM {JOB_TABLE}")
        if timeout_s is not None:
            conn.execute(
                f"ALTER DATABASE \"{db}\" SET idle_in_transaction_session_timeout = '{timeout_s}s'"
            )
    q = store.queue("bench.idle")
    total_s = args.before_s + args.hold_s + args.after_s
    started = time.monotonic()
    end = started + total_s
    stop = threading.Event()

    def produce() -> None:
        sent = 0
        try:
            while not stop.is_set():
                # At most a second's worth at once, as the soak's producer.
                due = min(int(args.rate * (time.monotonic() - started)) - sent, args.rate)
                if due > 0:
                    q.enqueue_many([{"n": n} for n in range(sent, sent + due)])
                    sent += due
                time.sleep(0.1)
        finally:
            connections.close_all()

    windows: list[dict] = []
    holder = Holder(url, args.hold_s)

    def sample() -> None:
        with _pg(url) as conn:
            for i in range(int(total_s // args.window_s)):
                time.sleep(max(0.0, started + (i + 1) * args.window_s - time.monotonic()))
                dead, pending = conn.execute(
                    f"SELECT (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = "
                    f"'{JOB_TABLE}'), (SELECT count(*) FROM {JOB_TABLE})"
                ).fetchone()
                state = conn.execute(
                    "SELECT state, age(backend_xmin) FROM pg_stat_activity WHERE pid = %s",
                    [holder.pid or -1],
                ).fetchone()
                windows.append(
                    {"dead": dead, "left": pending, "holder": state, "load1": os.getloadavg()[0]}
                )

    producer, sampler = threading.Thread(target=produce), threading.Thread(target=sample)
    claims: list[tuple[float, float]] = []
    try:
        producer.start()
        sampler.start()
        holder_at = started + args.before_s
        while (now := time.monotonic()) < end:
            if not holder.is_alive() and holder.outcome == "not started" and now >= holder_at:
                holder.outcome = "holding"
                holder.start()
            t0 = time.perf_counter()
            handle = q.claim_one("idle-bench")
            took = time.perf_counter() - t0
            if handle is None:
                time.sleep(0.001)
                continue
            claims.append((now - started, took))
            handle.ack()
    finally:
        stop.set()
        producer.join()
        sampler.join()
        holder.join()
        if timeout_s is not None:
            with _pg(url) as conn:
                conn.execute(f'ALTER DATABASE "{db}" RESET idle_in_transaction_session_timeout')
    for i, w in enumerate(windows):
        lo, hi = i * args.window_s, (i + 1) * args.window_s
        took = sorted(c for t, c in claims if lo <= t < hi)
        phase = (
            "before"
            if hi <= args.before_s
            else "hold"
            if lo < args.before_s + args.hold_s
            else "after"
        )
        w.update(
            window=f"{lo:.0f}-{hi:.0f} s",
            phase=phase,
            rate=len(took) / args.window_s,
            p50_ms=1000 * took[len(took) // 2] if took else None,
            p99_ms=1000 * took[max(0, int(0.99 * len(took)) - 1)] if took else None,
        )
    print(f"holder: {holder.outcome}")
    return windows


def print_windows(label: str, windows: list[dict]) -> None:
    print(f"\n{label}")
    print(
        f"{'window':<12}{'phase':<8}{'drained/s':>10}{'claim p50 ms':>14}{'p99 ms':>9}"
        f"{'pending':>9}{'n_dead_tup':>12}{'load':>6}  holder (state, xmin age)"
    )
    for w in windows:
        p50 = "-" if w["p50_ms"] is None else f"{w['p50_ms']:.2f}"
        p99 = "-" if w["p99_ms"] is None else f"{w['p99_ms']:.2f}"
        holder = "-" if w["holder"] is None else f"{w['holder'][0]}, {w['holder'][1]}"
        print(
            f"{w['window']:<12}{w['phase']:<8}{w['rate']:>10.0f}{p50:>14}{p99:>9}"
            f"{w['left']:>9}{w['dead']:>12}{w['load1']:>6.2f}  {holder}",
            flush=True,
        )
    print(json.dumps({"idle": label, "windows": windows}))


def idle(url: str, args: argparse.Namespace) -> None:
    from bench.soak import autovacuum_on

    setup(url)
    print(
        f"idle: {args.rate} jobs/s enqueued and drained (claim_one + ack, one thread); a "
        f"REPEATABLE READ snapshot held idle {args.hold_s:g} s after {args.before_s:g} s; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    with autovacuum_on(url) as autovacuum:
        print(f"PostgreSQL autovacuum: {autovacuum}")
        read_committed_xmin(url)
        print_windows("no timeout", idle_variant(url, args, None))
        label = f"idle_in_transaction_session_timeout = {args.timeout_s:g}s on the database"
        print_windows(label, idle_variant(url, args, args.timeout_s))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


def main() -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    size = sub.add_parser("sizing")
    size.add_argument("--jobs", type=int, default=10_000)
    size.add_argument("--runs", type=int, default=3)
    hold = sub.add_parser("idle")
    hold.add_argument("--rate", type=int, default=300)
    hold.add_argument("--hold-s", type=float, default=60)
    hold.add_argument("--timeout-s", type=float, default=10)
    hold.add_argument("--window-s", type=float, default=10)
    hold.add_argument("--before-s", type=float, default=30)
    hold.add_argument("--after-s", type=float, default=60)
    args = parser.parse_args()
    from bench.run import pg_database

    url = pg_database(SCALE_URL)
    try:
        if args.bench == "sizing":
            sizing(url, args.jobs, args.runs)
        else:
            idle(url, args)
    finally:
        from django.db import connections

        from bench.claim_backlog import drop_database

        connections.close_all()
        drop_database(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
