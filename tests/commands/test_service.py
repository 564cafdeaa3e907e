"""What ``runworker`` and ``runscheduler`` share: their logging, the migrations check, bad input."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from alkstore_django import store
from tests.helpers import leader_lock, manage, wait_for

pytestmark = pytest.mark.timeout(120)

WITHOUT_LOGGING = "del LOGGING  # a site that configures no logging at all\n"


def leading() -> bool:
    return leader_lock() is not None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("verbosity", "lines", "logger_names"),
    [("0", False, False), ("1", True, False), ("2", True, True)],
)
def test_runscheduler__logs_to_stderr_without_logging_settings_as_v_asks(
    settings_variant, verbosity, lines, logger_names
):
    env = settings_variant(WITHOUT_LOGGING)
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "runscheduler", "-v", verbosity],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(leading, 30), "runscheduler did not take leadership"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert ("scheduler leading owner=" in err) is lines, err
    assert ("scheduler released leadership" in err) is lines, err
    assert ("alkstore_django.scheduler" in err) is logger_names, err
    assert out == ""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("verbosity", "lines", "logger_names"),
    [("0", False, False), ("1", True, False), ("3", True, True)],
)
def test_runworker__logs_to_stderr_without_logging_settings_as_v_asks(
    settings_variant, verbosity, lines, logger_names
):
    store.queue("t.noop").enqueue("x")
    env = settings_variant(WITHOUT_LOGGING)
    done = manage(env, "runworker", "--queue", "t.noop", "--burst", "-v", verbosity)
    assert done.returncode == 0, done.stderr
    assert ("outcome=acked" in done.stderr) is lines, done.stderr
    assert ("alkstore_django.worker" in done.stderr) is logger_names, done.stderr


@pytest.mark.django_db(transaction=True)
def test_site_logging__is_left_alone(subprocess_env):
    """tests.settings routes alkstore_django to its own handler: -v 0 does not silence it."""
    store.queue("t.noop").enqueue("x")
    done = manage(subprocess_env, "runworker", "--queue", "t.noop", "--burst", "-v", "0")
    assert done.returncode == 0, done.stderr
    assert "outcome=acked" in done.stderr
    assert done.stderr.count("outcome=acked") == 1  # one handler, not ours stacked on it


@pytest.mark.parametrize(
    "command",
    [["runworker", "--burst"], ["runworker", "--queue", "t.record"], ["runscheduler"]],
    ids=["runworker-burst", "runworker", "runscheduler"],
)
def test_unmigrated_database__says_run_migrate_once_and_exits_nonzero(
    command, subprocess_env, empty_database_url
):
    env = {**subprocess_env, "DATABASE_URL": empty_database_url}
    started = time.monotonic()
    done = manage(env, *command, timeout=30)  # before the fix: retried forever
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("run `manage.py migrate` first") == 1, done.stderr
    assert "Database 'default' lacks" in done.stderr
    assert "0001_initial" in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["runworker", "--concurrency", "0"], "argument --concurrency: Invalid value '0'"),
        (["runworker", "--grace-s", "nan"], "argument --grace-s: Invalid value 'nan'"),
        (["runworker", "--grace-s", "inf"], "argument --grace-s: Invalid value 'inf'"),
        (["runworker", "--grace-s", "1e300"], "up to 86400"),
        (["runscheduler", "--standby-interval", "nan"], "Invalid value 'nan'"),
        (["runscheduler", "--database", "nosuch"], "Unknown database 'nosuch'"),
        (["alkstore", "--database", "nosuch", "stats"], "Unknown database 'nosuch'"),
    ],
)
def test_bad_arguments__are_usage_errors_without_a_traceback(args, message, subprocess_env):
    done = manage(subprocess_env, *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
