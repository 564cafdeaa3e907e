"""A failing task's traceback is logged once per failed attempt, not by us and by Django."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from alkstore_django.testing import run_ready_jobs, run_ready_tasks
from tests.helpers import make_due
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def tracebacks(caplog) -> list[str]:
    """Return the logger of every record that carries a traceback."""
    return [r.name for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


def test_failing_task__its_traceback_is_logged_once(caplog):
    caplog.set_level(logging.INFO)
    tasks.fail_value_error.enqueue("logged once")
    assert run_ready_tasks() == 1
    assert len(tracebacks(caplog)) == 1, tracebacks(caplog)  # before the fix: 2
    assert caplog.text.count("Traceback (most recent call last)") == 1, caplog.text


def test_retried_task__each_failed_attempt_logs_its_traceback_once(caplog):
    caplog.set_level(logging.INFO)
    result = tasks.flaky.using(backend="retry").enqueue(succeed_at=99)
    runs = run_ready_jobs(["tasks-retry"])
    make_due(int(result.id))
    runs += run_ready_jobs(["tasks-retry"])
    make_due(int(result.id))
    runs += run_ready_jobs(["tasks-retry"])
    assert [r.outcome for r in runs] == ["retried", "retried", "dead"]
    assert len(tracebacks(caplog)) == 3, tracebacks(caplog)
