"""The raw-psycopg floor: what PostgreSQL itself allows, with no queue semantics at all.

Enqueue: one single-row INSERT per transaction (autocommit), into a minimal
table (``enqueue``) and, to separate the schema's cost from the library's, into
alkstore's own job table with all its indexes (``enqueue-schema``, on the
database named by ``BENCH_ALKSTORE_URL``). Drain: each
process deletes batches of 100 rows chosen ``FOR UPDATE SKIP LOCKED`` (claim
and "ack" in one statement) until the table is empty.
"""

from __future__ import annotations

import os
import sys

import psycopg

from bench.peers import common

TABLE = "floor_job"


def connect() -> psycopg.Connection:
    url = os.environ["BENCH_DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    return psycopg.connect(url, autocommit=True)


def setup() -> dict:
    with connect() as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, "
            "payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute(f"TRUNCATE {TABLE}")
    return {"ok": True}


def capabilities() -> dict:
    return {"batches": [], "latency": False}


def enqueue(n: str, batch: str) -> dict:
    with connect() as conn:
        conn.execute(f"TRUNCATE {TABLE}")

        def one(i: int) -> None:
            conn.execute(f"INSERT INTO {TABLE} (payload) VALUES (%s::jsonb)", [f'{{"i": {i}}}'])

        return common.timed_enqueue(int(n), int(batch), one, None)


def enqueue_schema(n: str, batch: str) -> dict:
    url = os.environ["BENCH_ALKSTORE_URL"].replace("postgres://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM alkstore_django_job WHERE queue = 'floor'")
        sql = (
            "INSERT INTO alkstore_django_job (queue, payload, priority, run_at, attempts, "
            "max_attempts, visibility_timeout_s, retry_base_s, state, enqueued_at) "
            "VALUES ('floor', %s::jsonb, 0, now(), 0, 3, 300, 5, 'pending', now())"
        )

        def one(i: int) -> None:
            conn.execute(sql, [f'{{"i": {i}}}'])

        result = common.timed_enqueue(int(n), int(batch), one, None)
        conn.execute("DELETE FROM alkstore_django_job WHERE queue = 'floor'")
        return result


def drain(n: str, procs: str) -> dict:
    with connect() as conn:
        conn.execute(f"TRUNCATE {TABLE}")
        conn.execute(
            f"INSERT INTO {TABLE} (payload) SELECT 'null'::jsonb FROM generate_series(1, %s)",
            [int(n)],
        )
        conn.execute(f"VACUUM ANALYZE {TABLE}")

    def left() -> int:
        with connect() as conn:
            return conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]  # type: ignore[index]

    worker = [sys.executable, "-m", "bench.peers.floor", "worker"]
    return common.drain(worker, int(n), int(procs), left)


def worker() -> dict:
    done = 0
    with connect() as conn:
        common.mark_first()
        while True:
            rows = conn.execute(
                f"DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE} ORDER BY id "
                "LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING id, payload"
            ).fetchall()
            if not rows:
                return {"done": done}
            done += len(rows)


if __name__ == "__main__":
    common.main(
        {
            "setup": setup,
            "capabilities": capabilities,
            "enqueue": enqueue,
            "enqueue-schema": enqueue_schema,
            "drain": drain,
            "worker": worker,
        }
    )
