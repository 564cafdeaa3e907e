"""Claim+ack throughput on PostgreSQL behind a backlog in other queues.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/alk_bench python bench/claim_backlog.py

The database named in DATABASE_URL is created if missing, migrated, and
emptied: use a database of its own. For each backlog (10k, then 1M pending
rows spread over ten other queues, the second also with 1M dead letters) it
enqueues JOBS jobs on one queue and times a single worker draining them with
``claim_one`` + ``ack``, three runs; it prints a table and one JSON line per
figure. The claim must not grow with the backlog: the target is the 1M figure
within 1.5x of the 10k one.

Options: --jobs N (default 2000), --runs N (default 3), --batch N (claim_batch
size; default 1, i.e. claim_one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
OTHER_QUEUES = 10


def ensure_database(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(pending: int, dead: int) -> None:
    """Empty the tables, then write the backlog with one INSERT … SELECT each."""
    from django.db import connection

    from alkstore_django.models import DeadJob, Job

    job, dead_table = Job._meta.db_table, DeadJob._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {job}, {dead_table}")
        cursor.execute(
            f"INSERT INTO {job} (queue, payload, priority, run_at, attempts, max_attempts, "
            "visibility_timeout_s, retry_base_s, state, enqueued_at) "
            f"SELECT 'other-' || (g %% {OTHER_QUEUES}), jsonb_build_object('n', g), g %% 5, "
            "now() - make_interval(secs => g %% 86400), 0, 3, 300, 5, 'pending', now() "
            "FROM generate_series(1, %s) AS g",
            [pending],
        )
        if dead:
            cursor.execute(
                f"INSERT INTO {dead_table} (id, queue, payload, priority, run_at, attempts, "
                "max_attempts, visibility_timeout_s, retry_base_s, worker_id, enqueued_at, "
                "last_error, died_at) "
                f"SELECT -g, 'other-' || (g %% {OTHER_QUEUES}), '{{}}'::jsonb, 0, now(), 3, 3, "
                "300, 5, 'w', now(), 'max attempts exceeded', "
                "now() - make_interval(secs => g %% 86400) FROM generate_series(1, %s) AS g",
                [dead],
            )
        cursor.execute(f"ANALYZE {job}")
        cursor.execute(f"ANALYZE {dead_table}")


def one_run(jobs: int, batch: int) -> float:
    """Enqueue ``jobs`` on the bench queue and return the drain rate in jobs/s."""
    from alkstore_django import store

    q = store.queue("bench")
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


def figure(label: str, pending: int, dead: int, jobs: int, runs: int, batch: int) -> dict:
    started = time.perf_counter()
    fill(pending, dead)
    fill_s = time.perf_counter() - started
    rates = [one_run(jobs, batch) for _ in range(runs)]
    return {
        "figure": label,
        "pending_in_other_queues": pending,
        "dead_letters": dead,
        "jobs": jobs,
        "batch": batch,
        "runs": runs,
        "median_jobs_per_s": round(statistics.median(rates), 1),
        "min_jobs_per_s": round(min(rates), 1),
        "max_jobs_per_s": round(max(rates), 1),
        "fill_s": round(fill_s, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        print("DATABASE_URL must name a PostgreSQL database of its own (e.g. alk_bench).")
        return 2
    ensure_database(url)
    setup_django()
    from django.db import connection

    # Two runs on one database would truncate each other's jobs mid-drain.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtext('alkstore bench/claim_backlog'))")
        if not cursor.fetchone()[0]:
            print("Another claim_backlog run is using this database: wait for it or use another.")
            return 2

    version = connection.pg_version
    print(f"PostgreSQL {version}; {args.jobs} jobs x {args.runs} runs, batch {args.batch}")
    results = [
        figure("10k pending", 10_000, 0, args.jobs, args.runs, args.batch),
        figure("1M pending + 1M dead", 1_000_000, 1_000_000, args.jobs, args.runs, args.batch),
    ]
    print(f"{'backlog in other queues':<26}{'median jobs/s':>15}{'min-max':>20}")
    for r in results:
        spread = f"{r['min_jobs_per_s']:.0f}-{r['max_jobs_per_s']:.0f}"
        print(f"{r['figure']:<26}{r['median_jobs_per_s']:>15.0f}{spread:>20}")
    ratio = results[0]["median_jobs_per_s"] / results[1]["median_jobs_per_s"]
    print(f"10k/1M ratio: {ratio:.2f} (target <= 1.5)")
    for r in results:
        print(json.dumps(r))
    return 0 if ratio <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
