"""Django Tasks the tests/tasks suite runs (Django 6 only: imported only from there)."""

from __future__ import annotations

import time
from pathlib import Path

import django
from django.tasks import TaskContext, task

from alkstore_django.tasks import task as alkstore_task

from .models import Run


@task()
def add(a, b):
    return a + b


@task()
async def async_add(a, b):
    return a + b


@task()
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task()
def fail_value_error(message="boom"):
    raise ValueError(message)


@task()
def system_exit():
    raise SystemExit("This task called exit")


@task()
def not_json():
    return object()


@task(takes_context=True)
def context_view(context: TaskContext):
    return {
        "attempt": context.attempt,
        "id": context.task_result.id,
        "status": context.task_result.status,
        "worker_ids": context.task_result.worker_ids,
    }


@task(takes_context=True, queue_name="tasks-retry", backend="retry")
def flaky(context: TaskContext, succeed_at: int):
    """Fail until attempt ``succeed_at``, then return the attempt number."""
    if context.attempt < succeed_at:
        raise RuntimeError(f"attempt {context.attempt} failed")
    return context.attempt


def _fail_first_attempt(context: TaskContext):
    if context.attempt < 2:
        raise RuntimeError("first attempt fails")
    return context.attempt


# alkstore's @task takes max_attempts on every Django 6; Django's own from 6.1 on.
@alkstore_task(takes_context=True, queue_name="tasks-retry", max_attempts=2)
def flaky_per_task(context: TaskContext):
    """Retries switched on for this task alone, on the default (retries off) backend."""
    return _fail_first_attempt(context)


PER_TASK_ATTEMPTS = [flaky_per_task]
if django.VERSION >= (6, 1):

    @task(takes_context=True, queue_name="tasks-retry", max_attempts=2)
    def flaky_django_task(context: TaskContext):
        """The same, declared with Django's own @task (Django 6.1+)."""
        return _fail_first_attempt(context)

    PER_TASK_ATTEMPTS.append(flaky_django_task)


@task()
def record(label):
    """Write a row, so a test can see which tasks ran and in what order."""
    Run.objects.create(job_id=0, attempt=0, queue=label)
    return label


@task(takes_context=True)
def hang_first_attempt(context: TaskContext, marker: str):
    """On attempt 1 mark the file and hang (to be SIGKILLed); later attempts succeed."""
    if context.attempt == 1:
        Path(marker).write_text(context.task_result.id)
        time.sleep(120)
    return {"recovered_on": context.attempt}


@task()
def returns_nan():
    return {"ratio": float("nan")}


@task()
def returns_nul():
    return "bad \x00 byte"


@task(takes_context=True)
def scheduled_boundary(context: TaskContext, label):
    """A scheduled task that reports which boundary it runs for."""
    from alkstore_django import store

    fire = store.fired_for(context.task_result.id)
    return {"label": label, "schedule": fire.schedule, "boundary": fire.boundary.isoformat()}


@alkstore_task(timeout_s=5)
def limited():
    return None


@alkstore_task(unique=True)
def unique_add(a, b):
    return a + b


@alkstore_task(unique=True, unique_for_s=3600)
def unique_for_an_hour(n):
    return n
