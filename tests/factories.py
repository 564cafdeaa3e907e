"""factory-boy factories for rows the public API cannot reach directly.

Dead letters with given errors and dates (for the admin), schedules and locks
in any state. Live jobs are made through ``store.queue(...).enqueue(...)``.
"""

from __future__ import annotations

from datetime import timedelta

import factory
from django.utils import timezone

from alkstore_django.models import DeadJob, Lock, Schedule

# Far above any id the live table's sequence hands out in a test run, so a
# requeued dead letter never collides with an enqueued job.
DEAD_ID_BASE = 10_000_000


class DeadJobFactory(factory.django.DjangoModelFactory):
    """A dead letter; pass ``last_error``, ``died_at``, ``queue`` or ``payload`` as needed."""

    class Meta:
        model = DeadJob

    id = factory.Sequence(lambda n: DEAD_ID_BASE + n)
    queue = "dead.q"
    payload = factory.Sequence(lambda n: {"n": n})
    priority = 0
    run_at = factory.LazyFunction(lambda: timezone.now() - timedelta(minutes=5))
    attempts = 3
    max_attempts = 3
    visibility_timeout_s = 300.0
    retry_base_s = 5.0
    expires_at = None
    worker_id = "worker-1"
    last_error = "ValueError: boom"
    enqueued_at = factory.LazyFunction(lambda: timezone.now() - timedelta(minutes=10))
    died_at = factory.LazyFunction(timezone.now)


class ScheduleFactory(factory.django.DjangoModelFactory):
    """A registered schedule; ``next_run_at`` in the past makes it due."""

    class Meta:
        model = Schedule

    name = factory.Sequence(lambda n: f"schedule-{n}")
    spec = "@every 1m"
    interval_s = 60
    queue = "sched.q"
    payload = None
    priority = 0
    max_attempts = 3
    visibility_timeout_s = 300.0
    retry_base_s = 5.0
    expires_s = None
    enabled = True
    next_run_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=1))
    last_fired_at = None
    created_at = factory.LazyFunction(timezone.now)
    updated_at = factory.LazyFunction(timezone.now)


class LockFactory(factory.django.DjangoModelFactory):
    """A lease; ``expires_at`` in the past makes it expired."""

    class Meta:
        model = Lock

    name = factory.Sequence(lambda n: f"lock-{n}")
    owner = "host:1:abc"
    fence = 1
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=30))
    acquired_at = factory.LazyFunction(timezone.now)
