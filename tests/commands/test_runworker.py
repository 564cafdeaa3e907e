"""``manage.py runworker`` as users run it: a real subprocess on the test database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from alkstore_django import store
from alkstore_django.models import DeadJob, Job
from tests.helpers import listener_pids, postgres_only, runworker, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]


def test_runworker__three_processes_drain_2000_jobs_each_exactly_once(subprocess_env):
    ids = store.queue("t.record").enqueue_many(list(range(2000)))
    procs = [
        runworker(subprocess_env, "--queue", "t.record", "--burst", wait=False) for _ in range(3)
    ]
    outs = [proc.communicate(timeout=80)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], outs
    runs = list(Run.objects.values_list("job_id", flat=True))
    assert sorted(runs) == ids  # each exactly once
    assert not Job.objects.exists()
    assert sum(out.count("outcome=acked") for out in outs) == 2000
    assert sum(1 for out in outs if "outcome=acked" in out) >= 2


def test_runworker_helper__a_worker_logging_past_its_pipe_is_not_blocked_by_it(subprocess_env):
    # 2,000 job lines are about 190 KB, three times a pipe's 64 KB: unread,
    # the worker blocked on a log line, holding its claims (a concurrency
    # test on MariaDB timed out so when one worker took nearly every job).
    store.queue("t.record").enqueue_many(list(range(2000)))
    proc = runworker(subprocess_env, "--queue", "t.record", "--burst", wait=False)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    out, _ = proc.communicate(timeout=10)
    assert out.count("outcome=acked") == 2000
    assert not Job.objects.exists()


def test_runworker__retries_a_raising_handler_then_dead_letters_it(subprocess_env):
    job_id = store.queue("t.raise", max_attempts=2, retry_base_s=0).enqueue("p")
    for _ in range(2):
        code, out = runworker(subprocess_env, "--queue", "t.raise", "--burst")
        assert code == 0, out
    dead = DeadJob.objects.get(id=job_id)
    assert (dead.attempts, dead.last_error) == (2, "ValueError: boom p")
    assert Run.objects.filter(job_id=job_id).count() == 2


def test_runworker__fail_dead_letters_at_once(subprocess_env):
    job_id = store.queue("t.fail").enqueue("p")
    code, out = runworker(subprocess_env, "--queue", "t.fail", "--burst")
    assert code == 0, out
    assert "outcome=dead" in out
    assert DeadJob.objects.get(id=job_id).last_error == "refused: bad input"


def test_sigterm__lets_the_running_job_finish_and_exits_0(subprocess_env):
    job_id = store.queue("t.slow").enqueue({"sleep_s": 1.5})
    proc = runworker(subprocess_env, "--queue", "t.slow", wait=False)
    assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "outcome=acked" in out
    assert store.get_job(job_id) is None


def test_second_sigterm__exits_at_once_and_the_running_attempt_is_failed_not_given_back(
    subprocess_env,
):
    job_id = store.queue("t.slow", retry_base_s=0).enqueue({"sleep_s": 30})
    proc = runworker(subprocess_env, "--queue", "t.slow", wait=False)
    assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists())
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)  # the sentinel has settled once the pipe closes
    assert time.monotonic() - started < 5
    assert proc.returncode != 0
    job = store.get_job(job_id)
    # The sentinel saw the job running: its attempt is spent with the reason, never returned.
    assert (job.state, job.attempts) == ("pending", 1), out
    assert "died while running this job" in job.last_error
    Job.objects.filter(id=job_id).update(payload={"sleep_s": 0})
    handle = store.queue("t.slow").claim_one("rescuer")
    assert (handle.job.id, handle.job.attempts) == (job_id, 2)


def test_sigkill__the_sentinel_fails_running_jobs_and_releases_prefetched_ones(subprocess_env):
    q = store.queue("t.slow", visibility_timeout_s=60, retry_base_s=0)
    running = q.enqueue_many([{"sleep_s": 30}] * 2)
    waiting = q.enqueue_many([{"sleep_s": 0}] * 3)
    proc = runworker(
        subprocess_env, "--queue", "t.slow", "--concurrency", "2", "--batch", "5", wait=False
    )
    assert wait_for(lambda: Run.objects.count() == 2)
    assert wait_for(lambda: Job.objects.filter(state="processing").count() == 5)
    proc.kill()
    out, _ = proc.communicate(timeout=10)
    for job_id in running:
        job = store.get_job(job_id)
        assert (job.state, job.attempts) == ("pending", 1), out
        assert "died while running this job" in job.last_error
    for job_id in waiting:
        job = store.get_job(job_id)
        assert (job.state, job.attempts, job.last_error) == ("pending", 0, None), out
    assert sorted(Run.objects.values_list("job_id", flat=True)) == running


def test_sigkill_of_the_whole_process_group__claims_lapse_and_are_reclaimed(subprocess_env):
    """Without its sentinel the database cannot tell running from prefetched: each spends one."""
    ids = store.queue("t.slow", visibility_timeout_s=1).enqueue_many([{"sleep_s": 30}] * 3)
    proc = runworker(
        subprocess_env, "--queue", "t.slow", "--concurrency", "3", wait=False, new_session=True
    )
    assert wait_for(lambda: Run.objects.count() == 3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    Job.objects.update(payload={"sleep_s": 0})
    # A burst worker started before the claims lapse finds nothing; run until all are done.
    assert wait_for(
        lambda: (
            runworker(subprocess_env, "--queue", "t.slow", "--burst")[0] == 0
            and not Job.objects.exists()
        ),
        timeout=30,
    )
    assert sorted(Run.objects.filter(attempt=2).values_list("job_id", flat=True)) == ids
    assert not DeadJob.objects.exists()


@postgres_only("SQLite has no LISTEN connection to terminate; its wake-up watches the file")
def test_lost_notification__is_covered_by_the_poll_and_the_listener_reconnects(subprocess_env):
    proc = runworker(subprocess_env, "--queue", "t.record", wait=False)
    try:
        with connection.cursor() as cursor:
            assert wait_for(lambda: listener_pids())
            old = listener_pids()
            for pid in old:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            job_id = store.queue("t.record").enqueue("after the drop")
            # POLL_INTERVAL_S is 1 s in the test settings.
            assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists(), timeout=5)
            assert wait_for(lambda: listener_pids() and listener_pids() != old, timeout=5)
            started = time.monotonic()
            job_id = store.queue("t.record").enqueue("after the reconnect")
            assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists(), timeout=5)
            assert time.monotonic() - started < 1.0  # woken by NOTIFY again, not the poll
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "listener reconnected" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "nope"], "No handler for 'nope'"),
        (["--concurrency", "0"], "expected a positive integer"),
        (["--batch", "x"], "expected a positive integer"),
        (["--concurrency", "100000"], "up to 1024"),
        (["--grace-s", "-1"], "expected a number of seconds"),
    ],
)
def test_bad_arguments__raise_command_error(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("runworker", *args)


@pytest.mark.timeout(60)
def test_autoreload__a_code_change_restarts_the_worker_which_lets_its_jobs_go_first(
    subprocess_env,
):
    from pathlib import Path

    watched = Path(__file__).resolve().parent.parent / "testapp" / "pool_jobs.py"
    proc = runworker(
        subprocess_env, "--queue", "t.record", "--autoreload", wait=False, new_session=True
    )
    try:
        first = store.queue("t.record").enqueue("before")
        assert wait_for(lambda: Run.objects.filter(job_id=first).exists())
        time.sleep(1.5)  # the reloader has taken its first look at the files
        os.utime(watched)  # a new modification time is a change to the reloader
        time.sleep(2.5)  # the stat reloader looks once a second
        second = store.queue("t.record").enqueue("after")
        assert wait_for(lambda: Run.objects.filter(job_id=second).exists())
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in its terminal: the reloader and its child
        out, _ = proc.communicate(timeout=30)
    assert out.count("worker started") == 2, out
    assert out.count("worker stopped") == 2, out
    assert not Job.objects.exists()


# Run as its own process: a child subreaper inherits the sentinel should it outlive the command.
OUTLIVED_BY_SENTINEL = """
import ctypes, os, signal, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
sentinel = None
for line in proc.stdout:
    if "sentinel started pid=" in line:
        sentinel = int(line.split("sentinel started pid=")[1].split()[0])
    if "worker started" in line:
        break
proc.send_signal(signal.SIGTERM)
code = proc.wait(30)
try:
    os.waitpid(sentinel, 0)  # re-parented to this process: it outlived the command
    outlived = True
except ChildProcessError:
    outlived = False
print(code, outlived)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER")
def test_sigterm__the_command_exits_only_after_its_sentinel_has(subprocess_env):
    """A supervisor that signals the group once the command has exited finds no sentinel."""
    cmd = [sys.executable, "-m", "django", "runworker", "--settings", "tests.settings"]
    driver = subprocess.run(
        [sys.executable, "-c", OUTLIVED_BY_SENTINEL, *cmd, "--queue", "t.slow"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert driver.stdout.split() == ["0", "False"], driver.stdout + driver.stderr
