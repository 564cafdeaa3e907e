"""Run the bench workloads on django-tasks-db (PostgreSQL), from .venv-peers.

Tasks are enqueued with Django's Tasks API (``task.enqueue``, one by one:
there is no bulk call); workers are its ``db_worker`` command, as its users
run it (``--batch`` for the drain: process what is there, then exit).
"""

from __future__ import annotations

import os
import sys

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "bench.peers.tasksdb_settings"
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402

from bench.peers import common  # noqa: E402
from bench.peers.tasksdb_tasks import noop, stamp  # noqa: E402


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", "db_worker", *args]


def clear() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_tasks_database_dbtaskresult")
    connections.close_all()


def setup() -> dict:
    call_command("migrate", verbosity=0)
    return {"ok": True}


def capabilities() -> dict:
    return {"batches": [], "latency": True}


def enqueue(n: str, batch: str) -> dict:
    clear()
    return common.timed_enqueue(int(n), int(batch), lambda i: noop.enqueue(i=i), None)


def drain(n: str, procs: str) -> dict:
    clear()
    for i in range(int(n)):
        noop.enqueue(i=i)
    connections.close_all()

    def left() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'READY'"
            )
            return cursor.fetchone()[0]

    return common.drain(cli("--batch", "--queue-name", "default"), int(n), int(procs), left)


def latency(n: str) -> dict:
    clear()
    return common.latency(cli("--queue-name", "latency"), lambda i: stamp.enqueue(i=i), int(n))


if __name__ == "__main__":
    common.main(
        {
            "setup": setup,
            "capabilities": capabilities,
            "enqueue": enqueue,
            "drain": drain,
            "latency": latency,
        }
    )
