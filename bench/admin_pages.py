"""Time the dead-letter changelist and the queue overview with many dead letters.

Not a test: it prints figures. It builds its own PostgreSQL (or SQLite)
database, fills it with N dead letters spread over a few queues and a week of
``died_at``, plus some live jobs and an hour of outcome counters, then renders
each page several times through Django's test client as a superuser.

    PYTHONPATH=. DATABASE_URL=postgres://postgres@127.0.0.1:5432/alk_bench_admin \\
        .venv-django6/bin/python bench/admin_pages.py --dead 100000

The database named by DATABASE_URL is dropped and recreated (PostgreSQL) or
deleted (SQLite): point it at a scratch name.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/alk_bench_admin")


def recreate_database() -> None:
    from django.conf import settings

    db = settings.DATABASES["default"]
    if "sqlite" in db["ENGINE"]:
        Path(db["NAME"]).unlink(missing_ok=True)
        return
    import psycopg

    user, host = db.get("USER") or "postgres", db.get("HOST") or "127.0.0.1"
    admin_url = f"postgresql://{user}@{host}:{db.get('PORT') or 5432}/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}"')
        conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def fill(dead: int) -> None:
    from django.db import connection

    from alkstore_django import store
    from alkstore_django.models import DeadJob

    table = DeadJob._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"INSERT INTO {table} (id, queue, payload, priority, run_at, attempts, "
                "max_attempts, visibility_timeout_s, retry_base_s, worker_id, last_error, "
                "enqueued_at, died_at) SELECT g, 'queue-' || (g %% 8), "
                "jsonb_build_object('n', g, 'to', 'user' || g || '@example.com'), 0, now(), 3, 3, "
                "300, 5, 'w', 'TimeoutError: upstream did not answer (' || g || ')', now(), "
                "now() - make_interval(secs => (g %% 604800)) FROM generate_series(1, %s) g",
                [dead],
            )
        else:
            cursor.execute(
                f"WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s) "
                f"INSERT INTO {table} (id, queue, payload, priority, run_at, attempts, "
                "max_attempts, visibility_timeout_s, retry_base_s, worker_id, last_error, "
                "enqueued_at, died_at) SELECT n, 'queue-' || (n %% 8), "
                "json_object('n', n), 0, datetime('now'), 3, 3, 300, 5, 'w', "
                "'TimeoutError: upstream did not answer (' || n || ')', datetime('now'), "
                "datetime('now', printf('-%%d seconds', n %% 604800)) FROM g",
                [dead],
            )
            cursor.execute("ANALYZE")
    for i in range(8):
        store.queue(f"queue-{i}").enqueue_many([{"i": j} for j in range(200)])


def vacuum() -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    # Autovacuum would do this soon after a bulk load; index-only scans need it.
    from alkstore_django.models import DeadJob

    connection.ensure_connection()
    raw = connection.connection
    autocommit = raw.autocommit
    raw.autocommit = True
    try:
        raw.execute(f"VACUUM ANALYZE {DeadJob._meta.db_table}")
    finally:
        raw.autocommit = autocommit


def time_get(client, url: str, runs: int) -> tuple[float, float, int]:
    client.get(url)  # warm caches, templates and the plan cache
    samples = []
    status = 0
    for _ in range(runs):
        start = time.perf_counter()
        response = client.get(url)
        samples.append(time.perf_counter() - start)
        status = response.status_code
    return statistics.median(samples) * 1000, max(samples) * 1000, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.ALLOWED_HOSTS = ["*"]
    recreate_database()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    fill(args.dead)
    vacuum()
    print(f"filled {args.dead:,} dead letters in {time.perf_counter() - started:.1f} s")

    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    User.objects.create_superuser("bench", "b@example.com", "bench")
    client = Client()
    client.force_login(User.objects.get(username="bench"))
    pages = {
        "dead-letter changelist": "/admin/alkstore_django/deadjob/",
        "changelist, one queue": "/admin/alkstore_django/deadjob/?queue=queue-3",
        "changelist, search 'upstream'": "/admin/alkstore_django/deadjob/?q=upstream",
        "queue overview": "/admin/alkstore_django/deadjob/overview/",
        "live jobs changelist": "/admin/alkstore_django/job/",
    }
    print(f"{connection.vendor}, Django {django.get_version()}, median/max of {args.runs} runs")
    for name, url in pages.items():
        queries: list[str] = []

        def count(execute, sql, params, many, context, queries=queries):
            queries.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            client.get(url)
        median_ms, max_ms, status = time_get(client, url, args.runs)
        print(
            f"  {name:32} {median_ms:8.1f} ms median {max_ms:8.1f} ms max  "
            f"{len(queries):3d} queries  HTTP {status}"
        )


if __name__ == "__main__":
    main()
