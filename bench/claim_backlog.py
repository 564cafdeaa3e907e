"""Claim+ack throughput on PostgreSQL behind a backlog in other queues (10k, 1M, 10M rows).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/alk_scale_backlog python bench/claim_backlog.py

Each backlog gets a database of its own, named after DATABASE_URL's with the
size appended (``alk_scale_backlog_10k``, ``…_1m``, ``…_10m``), created if
missing, migrated, emptied and filled; they are dropped at the end (``--keep``
keeps them): the 10M fill takes gigabytes (the run prints each database's
size), so check ``df -h`` first. The backlogs: 10k pending rows spread over
ten other queues; 1M, with 1M dead letters; 10M, with 1M dead letters. Each
run enqueues JOBS jobs on one queue and times a single worker draining them
with ``claim_one`` + ``ack``; the runs alternate between the backlogs, round
by round (the order reversed every other round), so a change in the
machine's load falls on every figure alike.
It prints a table and one JSON line per figure. The claim must not grow with
the backlog: the target is each figure within 1.5x of the 10k one (the ratio
of the medians, and the median of the per-round ratios).

The fill is one ``INSERT … SELECT … FROM generate_series(1, N)`` per table, in
SQL: the stamps a queue handle writes come from the engine defaults
(``conf.ENGINE_DEFAULTS``: max_attempts, visibility_timeout_s, retry_base_s),
the columns with a database default (generation, snoozes, max_snoozes) are
left to it; the rows are due over the last day, priorities 0-4. ``ANALYZE``
follows, as autovacuum would leave the statistics, then a ``CHECKPOINT`` (the
fill's dirty pages are written before the runs, not during them).

At the end it reads ``pg_prepared_statements`` (generic_plans and
custom_plans, PostgreSQL 14+) for each backlog's claim: the PostgreSQL
dialect prepares its own statements (``prepare=True``), so the counts say
whether PostgreSQL switched the claim to a generic plan after its first five
custom ones. ``--pooler`` runs as a site behind a transaction-mode pooler does
(``DISABLE_SERVER_SIDE_CURSORS``): the claim is then bound server-side but
not prepared, planned afresh each call.

Options: --jobs N (default 2000), --runs N (default 5), --batch N (claim_batch
size; default 1, i.e. claim_one), --sizes 10k,1m,10m (which backlogs; the
first is the reference), --pooler, --keep.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
OTHER_QUEUES = 10
# --sizes name: (label, pending rows in other queues, dead letters).
BACKLOGS = {
    "10k": ("10k pending", 10_000, 0),
    "1m": ("1M pending + 1M dead", 1_000_000, 1_000_000),
    "10m": ("10M pending + 1M dead", 10_000_000, 1_000_000),
}


def admin_url(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(scheme="postgresql", path="/postgres"))


def backlog_url(url: str, size: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"{parts.path}_{size}"))


def ensure_database(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{urlsplit(url).path.lstrip("/")}" WITH (FORCE)')


def setup_django(aliases: dict[str, str], pooler: bool) -> None:
    """Start Django on ``default``; add one alias per backlog database, migrated."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    for alias, url in aliases.items():
        config = copy.deepcopy(connections.settings["default"])
        config["NAME"] = urlsplit(url).path.lstrip("/")
        # Read by the dialect at each statement: with it, the claim is not prepared.
        config["DISABLE_SERVER_SIDE_CURSORS"] = pooler
        connections.settings[alias] = config
        call_command("migrate", database=alias, verbosity=0)


def fill(alias: str, pending: int, dead: int) -> None:
    """Empty the tables, then write the backlog with one INSERT … SELECT each."""
    from django.db import connections

    from alkstore_django.conf import ENGINE_DEFAULTS as d
    from alkstore_django.models import DeadJob, Job

    job, dead_table = Job._meta.db_table, DeadJob._meta.db_table
    stamps = [d.max_attempts, d.visibility_timeout_s, d.retry_base_s]
    with connections[alias].cursor() as cursor:
        cursor.execute(f"TRUNCATE {job}, {dead_table}")
        cursor.execute(
            f"INSERT INTO {job} (queue, payload, priority, run_at, attempts, max_attempts, "
            "visibility_timeout_s, retry_base_s, state, enqueued_at) "
            f"SELECT 'other-' || (g %% {OTHER_QUEUES}), jsonb_build_object('n', g), g %% 5, "
            "now() - make_interval(secs => g %% 86400), 0, %s, %s, %s, 'pending', now() "
            "FROM generate_series(1, %s) AS g",
            [*stamps, pending],
        )
        if dead:
            cursor.execute(
                f"INSERT INTO {dead_table} (id, queue, payload, priority, run_at, attempts, "
                "max_attempts, visibility_timeout_s, retry_base_s, worker_id, enqueued_at, "
                "last_error, died_at) "
                f"SELECT -g, 'other-' || (g %% {OTHER_QUEUES}), '{{}}'::jsonb, 0, now(), %s, %s, "
                "%s, %s, 'w', now(), 'max attempts exceeded', "
                "now() - make_interval(secs => g %% 86400) FROM generate_series(1, %s) AS g",
                [d.max_attempts, *stamps, dead],
            )
        cursor.execute(f"ANALYZE {job}")
        cursor.execute(f"ANALYZE {dead_table}")
        # The fill's dirty pages are written now, not by a checkpoint during the runs.
        cursor.execute("CHECKPOINT")


def one_run(alias: str, jobs: int, batch: int) -> float:
    """Enqueue ``jobs`` on the bench queue of ``alias`` and return the drain rate in jobs/s."""
    from alkstore_django import Store

    q = Store(alias).queue("bench")
    q.enqueue_many([{"n": n} for n in range(jobs)])
    done = 0
    started = time.perf_counter()
    while True:
        handles = q.claim_batch("bench-worker", batch)
        if not handles:
            break
        for handle in handles:
            if not handle.ack():
                raise RuntimeError(f"ack refused for job {handle.job.id}")
            done += 1
    elapsed = time.perf_counter() - started
    if done != jobs:
        left = q.stats()
        raise RuntimeError(
            f"drained {done} of {jobs} jobs; the queue now holds {left.pending} pending, "
            f"{left.processing} processing: is something else using this database?"
        )
    return jobs / elapsed


def claim_plans(alias: str) -> str:
    """Say how this session's claim was planned: its prepared statement's plan counts, if any."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE %s",
            ["%SET state = 'processing'%"],
        )
        rows = cursor.fetchall()
    if not rows:
        return "not prepared (planned afresh each call)"
    generic, custom = (sum(r[i] for r in rows) for i in (0, 1))
    return f"prepared: {generic} generic plans, {custom} custom plans"


def figures(sizes: list[str], jobs: int, runs: int, batch: int) -> list[dict]:
    """Fill every backlog, then run them in alternating rounds; one dict per backlog."""
    from django.db import connections

    fills, sizes_bytes = {}, {}
    for size in sizes:
        started = time.perf_counter()
        fill(size, *BACKLOGS[size][1:])
        fills[size] = time.perf_counter() - started
        with connections[size].cursor() as cursor:
            cursor.execute("SELECT pg_database_size(current_database())")
            sizes_bytes[size] = cursor.fetchone()[0]
        # A fresh session for the runs: its prepared statements are the runs' alone.
        connections[size].close()
        gb = sizes_bytes[size] / 1e9
        print(f"filled {BACKLOGS[size][0]} in {fills[size]:.0f} s: {gb:.2f} GB", flush=True)
    rates: dict[str, list[float]] = {size: [] for size in sizes}
    for run in range(runs):
        for size in sizes if run % 2 == 0 else reversed(sizes):
            rates[size].append(one_run(size, jobs, batch))
        print(f"round {run + 1} of {runs}: load average {os.getloadavg()[0]:.2f}", flush=True)
    ref = rates[sizes[0]]
    return [
        {
            "figure": BACKLOGS[size][0],
            "pending_in_other_queues": BACKLOGS[size][1],
            "dead_letters": BACKLOGS[size][2],
            "jobs": jobs,
            "batch": batch,
            "runs": runs,
            "median_jobs_per_s": round(statistics.median(rates[size]), 1),
            "min_jobs_per_s": round(min(rates[size]), 1),
            "max_jobs_per_s": round(max(rates[size]), 1),
            "rates": [round(r, 1) for r in rates[size]],
            "round_ratio_median": round(
                statistics.median(a / b for a, b in zip(ref, rates[size], strict=True)), 2
            ),
            "fill_s": round(fills[size], 1),
            "database_bytes": sizes_bytes[size],
            "claim_plan": claim_plans(size),
        }
        for size in sizes
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--sizes", default="10k,1m,10m", help="Backlogs among 10k, 1m, 10m.")
    parser.add_argument("--pooler", action="store_true", help="As behind a pooler: no prepare.")
    parser.add_argument("--keep", action="store_true", help="Keep the databases at the end.")
    args = parser.parse_args()
    sizes = list(dict.fromkeys(s.strip().lower() for s in args.sizes.split(",") if s.strip()))
    unknown = [s for s in sizes if s not in BACKLOGS]
    if unknown or not sizes:
        print(f"Invalid --sizes {args.sizes!r}: expected some of {', '.join(BACKLOGS)}.")
        return 2
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        print("DATABASE_URL must name a PostgreSQL database of its own (e.g. alk_bench).")
        return 2
    import psycopg

    aliases = {size: backlog_url(url, size) for size in sizes}
    for each in [url, *aliases.values()]:
        ensure_database(each)
    # Two runs on these databases would truncate each other's jobs mid-drain (and
    # drop them under the other): the lock is held on a session of its own.
    lock = psycopg.connect(urlunsplit(urlsplit(url)._replace(scheme="postgresql")))
    got = lock.execute("SELECT pg_try_advisory_lock(hashtext('alkstore claim_backlog'))")
    if not got.fetchone()[0]:
        print("Another claim_backlog run is using these databases: wait for it or use another.")
        return 2
    try:
        return measure(args, sizes, aliases)
    finally:
        lock.close()
        if not args.keep:
            from django.db import connections

            connections.close_all()
            for each in [*aliases.values(), url]:
                drop_database(each)


def measure(args: argparse.Namespace, sizes: list[str], aliases: dict[str, str]) -> int:
    setup_django(aliases, args.pooler)
    from django.db import connections

    version = connections[sizes[0]].pg_version
    mode = "DISABLE_SERVER_SIDE_CURSORS (pooler)" if args.pooler else "default settings"
    print(
        f"PostgreSQL {version}; {args.jobs} jobs x {args.runs} runs, batch {args.batch}, {mode}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    results = figures(sizes, args.jobs, args.runs, args.batch)
    head = f"{'backlog in other queues':<26}{'median jobs/s':>15}{'min-max':>14}{'fill s':>8}"
    print(f"{head}  claim")
    for r in results:
        spread = f"{r['min_jobs_per_s']:.0f}-{r['max_jobs_per_s']:.0f}"
        print(
            f"{r['figure']:<26}{r['median_jobs_per_s']:>15.0f}{spread:>14}{r['fill_s']:>8.0f}  "
            f"{r['claim_plan']}"
        )
    ok = True
    for r in results[1:]:
        ratio = results[0]["median_jobs_per_s"] / r["median_jobs_per_s"]
        ok = ok and ratio <= 1.5
        print(
            f"{results[0]['figure']} / {r['figure']}: {ratio:.2f} of the medians, "
            f"{r['round_ratio_median']:.2f} median of the rounds (target <= 1.5)"
        )
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    for r in results:
        print(json.dumps(r))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
