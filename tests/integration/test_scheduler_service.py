"""``scheduler.serve``: the standby loop behind ``runscheduler``, and database outages."""

from __future__ import annotations

import logging
import time

import pytest
from django.db import OperationalError

from alkstore_django import store
from alkstore_django.locks import acquire
from alkstore_django.models import Job
from alkstore_django.scheduler import LEADER_LOCK, serve
from alkstore_django.scheduler import leader as scheduler
from tests.helpers import (
    LoopThread,
    alkstore_connection,
    leader_lock,
    postgres_only,
    unpooled,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def leader_owner() -> str | None:
    return getattr(leader_lock(), "owner", None)


class Serving(LoopThread):
    """``serve`` in a thread, started; ``halt`` also asserts it raised nothing."""

    def __init__(self, owner: str) -> None:
        super().__init__(serve, retry_s=0.2, owner=owner)
        self.start()

    def halt(self, timeout_s: float = 5.0) -> None:
        super().halt(timeout_s)
        assert self.error is None


def test_serve__stands_by_while_another_runner_leads_then_takes_over(caplog):
    caplog.set_level(logging.INFO, logger="alkstore_django")
    other = acquire(store, LEADER_LOCK, ttl_s=60, owner="other")
    serving = Serving("standby")
    time.sleep(0.6)

    assert leader_owner() == "other"
    assert "scheduler standing by owner=standby" in caplog.text

    other.release()
    assert wait_for(lambda: leader_owner() == "standby", 3)
    serving.halt()
    assert leader_owner() is None


def test_serve__logs_an_outage_and_carries_on(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="alkstore_django")
    store.schedule("beat", "@every 1s", "beats")
    real_tick = scheduler.tick
    failures = []

    def flaky_tick(*args, **kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return real_tick(*args, **kwargs)

    monkeypatch.setattr(scheduler, "tick", flaky_tick)
    serving = Serving("runner")

    assert wait_for(lambda: Job.objects.filter(queue="beats").exists(), 5)
    serving.halt()
    assert "scheduler database unavailable" in caplog.text
    assert "scheduler database reachable again" in caplog.text


@postgres_only("SQLite has no server session to terminate; the sibling is the outage test above")
@unpooled("PgBouncer replaces a terminated server connection; the client session never sees it")
def test_serve__survives_its_connection_being_terminated(caplog):
    caplog.set_level(logging.INFO, logger="alkstore_django")
    store.schedule("beat", "@every 1s", "beats")
    serving = Serving("runner")
    assert wait_for(lambda: Job.objects.filter(queue="beats").exists(), 5)

    with alkstore_connection().cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    before = Job.objects.filter(queue="beats").order_by("-id").first().id

    assert wait_for(lambda: Job.objects.filter(queue="beats", id__gt=before).count() >= 2, 6)
    serving.halt()
    # Dropped in a tick, serve() retries; dropped while sleeping, the lead goes on.
    assert ("scheduler database unavailable" in caplog.text
            or "scheduler database error while sleeping" in caplog.text)  # fmt: skip
    assert leader_owner() is None
