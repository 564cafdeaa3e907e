"""The django-tasks-db peer's tasks: a no-op and a latency stamp."""

from __future__ import annotations

from django.tasks import task

from bench.peers import common


@task()
def noop(i: int = 0) -> None:
    common.mark_first()


@task(queue_name="latency")
def stamp(i: int = 0) -> None:
    common.mark_job(i)
