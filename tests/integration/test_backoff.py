"""Custom backoff: a ``(attempt, error) -> seconds`` callable over the equal-jitter curve.

Each test reads the delay a failed attempt got from the job's ``run_at``
against the database's clock, the one clock the queue uses. The backoffs
(tests/testapp/backoff_jobs.py) return delays far from the curve of the
queues' ``retry_base_s``, so the curve cannot pass for the callable.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import timedelta

import pytest
from django.test import override_settings

from alkstore_django import handler, store
from alkstore_django.checks import check_settings
from alkstore_django.errors import InvalidArgument
from alkstore_django.handlers import registry
from alkstore_django.testing import run_ready_jobs
from alkstore_django.worker import Worker
from tests.helpers import ROUTING, db_now, make_due
from tests.testapp import backoff_jobs
from tests.testapp.backoff_jobs import (
    GIVEN_TEXT_S,
    HANDLER_DELAY_S,
    OPTION_DELAY_S,
    TEXT_DELAY_S,
)

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "tests.testapp.backoff_jobs"
# The curve of retry_base_s=2 for a first retry: a whole number of seconds in [1, 2].
CURVE_BASE_S = 2
# How far run_at may trail the expected delay: the statement's now() to this test's read.
SLACK_S = 5.0


def option(queue: str, path: str) -> override_settings:
    return override_settings(ALKSTORE={**ROUTING, "QUEUES": {queue: {"backoff": path}}})


def enqueue(queue: str, payload: object = None, **opts) -> int:
    return store.queue(queue, retry_base_s=CURVE_BASE_S, **opts).enqueue(payload or {})


def delay_of(job_id: int) -> float:
    """Return how far in the future the pending job's next attempt is, by the database clock."""
    job = store.get_job(job_id)
    assert job is not None and job.state == "pending", job
    assert job.attempts >= 1
    return (job.run_at - db_now()).total_seconds()


def assert_delay(job_id: int, expected_s: float) -> None:
    delay_s = delay_of(job_id)
    assert expected_s - SLACK_S < delay_s <= expected_s + 0.5, (delay_s, expected_s)


def assert_curve(job_id: int) -> None:
    assert -SLACK_S < delay_of(job_id) <= CURVE_BASE_S + 0.5


def drain(queue: str, **kwargs) -> Worker:
    worker = Worker([queue], burst=True, concurrency=1, **kwargs)
    worker.run(threading.Event())
    return worker


# --- the callable's delay is used --------------------------------------------------


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_handler_backoff__its_delay_is_used_and_it_is_given_the_exception_in_both_pools(pool):
    job_id = enqueue("b.handler")
    worker = drain("b.handler", pool=pool)
    assert worker.stats.retried == 1
    # exception_aware returns 1000 + attempt only when given the Boom itself.
    assert_delay(job_id, HANDLER_DELAY_S + 1)
    raised_in = int(store.get_job(job_id).last_error.rsplit(" ", 1)[1])
    assert (raised_in == os.getpid()) == (pool == "threads")


def test_handler_backoff__is_given_the_attempt_that_just_failed():
    job_id = enqueue("b.handler", max_attempts=5)
    run_ready_jobs(["b.handler"])
    assert_delay(job_id, HANDLER_DELAY_S + 1)
    make_due(job_id)  # the second attempt runs now
    run_ready_jobs(["b.handler"])
    assert store.get_job(job_id).attempts == 2
    assert_delay(job_id, HANDLER_DELAY_S + 2)


def test_handler_backoff__is_not_asked_for_the_last_attempt_which_dead_letters():
    job_id = enqueue("b.raising", max_attempts=1)
    runs = run_ready_jobs(["b.raising"])
    assert [run.outcome for run in runs] == ["dead"]
    assert store.get_job(job_id).state == "dead"


def test_queue_option__a_dotted_path_in_settings_is_used_with_the_exception():
    with option("b.option", f"{PATH}.option_backoff"):
        job_id = enqueue("b.option")
        drain("b.option")
    assert_delay(job_id, OPTION_DELAY_S + 1)


def test_queue_option__the_handlers_backoff_wins_over_it():
    with option("b.handler", f"{PATH}.option_backoff"):
        job_id = enqueue("b.handler")
        drain("b.handler")
    assert_delay(job_id, HANDLER_DELAY_S + 1)


def test_queue_option__on_a_handle_applies_to_its_manual_retry_given_the_error_text():
    queue = store.queue("b.manual", retry_base_s=CURVE_BASE_S, backoff=f"{PATH}.text_backoff")
    job_id = queue.enqueue({})
    handle = queue.claim_one("tester")
    assert handle.retry("four") is True
    assert_delay(job_id, TEXT_DELAY_S + 4)


def test_manual_retry__a_backoff_given_to_it_wins_over_the_queue_option():
    queue = store.queue("b.manual", retry_base_s=CURVE_BASE_S, backoff=f"{PATH}.text_backoff")
    job_id = queue.enqueue({})
    handle = queue.claim_one("tester")
    assert handle.retry("x", backoff=backoff_jobs.exception_aware) is True
    assert_delay(job_id, HANDLER_DELAY_S + GIVEN_TEXT_S + 1)  # given text, not a Boom


def test_without_any_backoff__the_curve_is_used_as_before():
    job_id = enqueue("b.option")
    run_ready_jobs(["b.option"])
    assert_curve(job_id)


# --- what fails falls back to the curve, logged, the job kept ---------------------------


def test_raising_backoff__falls_back_to_the_curve_with_a_warning_naming_job_and_callable(caplog):
    job_id = enqueue("b.raising")
    with caplog.at_level(logging.WARNING, logger="alkstore_django"):
        drain("b.raising")
    assert_curve(job_id)
    [line] = [r.getMessage() for r in caplog.records if "backoff failed" in r.getMessage()]
    assert f"id={job_id} " in line and "queue=b.raising" in line and "attempt=1" in line
    assert f"backoff={PATH}.raising:" in line
    assert "it raised RuntimeError: backoff exploded" in line


@pytest.mark.parametrize(
    ("payload", "shown"),
    [
        ({"value": -1}, "-1"),
        ({"value": True}, "True"),
        ({"value": "5"}, "'5'"),
        ({"value": None}, "None"),
        ({"float": "nan"}, "nan"),
        ({"float": "inf"}, "inf"),
        ({"huge": True}, "1000000000000"),
    ],
)
def test_bad_return_value__falls_back_to_the_curve_with_a_warning_naming_it(caplog, payload, shown):
    job_id = enqueue("b.echo", payload)
    with caplog.at_level(logging.WARNING, logger="alkstore_django"):
        runs = run_ready_jobs(["b.echo"])
    assert [run.outcome for run in runs] == ["retried"]
    assert_curve(job_id)
    [line] = [r.getMessage() for r in caplog.records if "backoff failed" in r.getMessage()]
    assert f"id={job_id} " in line and f"backoff={PATH}.echo:" in line
    assert f"it returned {shown}, not seconds from 0 to" in line


def test_good_return_values__zero_is_due_at_once():
    """No curve: with 0 s every attempt runs in the one call, the curve would wait >= 1 s."""
    job_id = enqueue("b.echo", {"value": 0})
    runs = run_ready_jobs(["b.echo"])
    assert [(run.job_id, run.outcome) for run in runs] == [
        (job_id, "retried"),
        (job_id, "retried"),
        (job_id, "dead"),
    ]


def test_good_return_values__a_float_is_a_delay():
    job_id = enqueue("b.echo", {"float": "600.5"})
    run_ready_jobs(["b.echo"])
    assert_delay(job_id, 600.5)


def test_queue_option__a_path_that_cannot_be_imported_falls_back_at_run_time(caplog):
    with option("b.option", f"{PATH}.missing"), caplog.at_level(logging.WARNING):
        job_id = enqueue("b.option")
        run_ready_jobs(["b.option"])
    assert_curve(job_id)
    [line] = [r.getMessage() for r in caplog.records if "backoff failed" in r.getMessage()]
    assert f"backoff={PATH}.missing: Backoff '{PATH}.missing' cannot be imported" in line


# --- eager validation ------------------------------------------------------------------


@pytest.mark.parametrize("bad", [5, "tests.testapp.backoff_jobs.echo", int])
def test_handler_decorator__refuses_a_backoff_that_is_not_a_plain_callable(bad):
    with pytest.raises(InvalidArgument, match=r"Invalid backoff for queue 'b\.never' .*callable"):
        handler("b.never", backoff=bad)
    assert registry.get("b.never") is None


def test_handler_decorator__refuses_an_async_backoff():
    async def later(attempt, error):
        return 1

    with pytest.raises(InvalidArgument, match="not a class or an async def"):
        handler("b.never", backoff=later)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (f"{PATH}.missing", f"Backoff '{PATH}.missing' cannot be imported"),
        ("nowhere_at_all.backoff", "Backoff 'nowhere_at_all.backoff' cannot be imported"),
        (f"{PATH}.NOT_CALLABLE", f"Backoff '{PATH}.NOT_CALLABLE' is 42: expected a callable"),
    ],
)
def test_system_check__reports_a_backoff_path_that_cannot_be_used(path, message):
    with option("b.option", path):
        errors = [e for e in check_settings() if e.id == "alkstore.E014"]
    assert len(errors) == 1
    assert errors[0].msg.startswith("ALKSTORE['QUEUES']['b.option']['backoff']: ")
    assert message in errors[0].msg


def test_system_check__accepts_a_backoff_path_to_a_function():
    with option("b.option", f"{PATH}.option_backoff"):
        assert [e.id for e in check_settings() if e.id.startswith("alkstore.E")] == []


def test_run_at__is_the_database_clock_plus_the_delay():
    """The delay is added to the database's now, whatever this process's clock says."""
    before = db_now()
    job_id = enqueue("b.handler")
    run_ready_jobs(["b.handler"])
    run_at = store.get_job(job_id).run_at
    assert before + timedelta(seconds=HANDLER_DELAY_S + 1) <= run_at
    assert run_at <= db_now() + timedelta(seconds=HANDLER_DELAY_S + 1)
