"""``runworker --pool processes``: handlers in child processes the worker supervises.

Real subprocesses on the test database: a child that segfaults fails only its
own job, a leaking child is recycled, SIGTERM stops a long job without a
second run. Each test also runs in the thread pool where the behaviour is
shared, so the two pools are pinned side by side.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from alkstore_django import store
from alkstore_django.models import DeadJob
from tests.helpers import assert_acked_once, process_alive, runworker, wait_for
from tests.testapp.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def pids_of(ids):
    return {w for w in Run.objects.filter(job_id__in=ids).values_list("worker_id", flat=True)}


def test_processes__run_handlers_outside_the_worker_process(subprocess_env):
    ids = store.queue("p.work").enqueue_many([{}] * 40)
    proc = runworker(
        subprocess_env, "--queue", "p.work", "--pool", "processes", "--concurrency", "2",
        "--burst", wait=False,
    )  # fmt: skip
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    assert_acked_once(ids)
    pids = pids_of(ids)
    assert f"pid:{proc.pid}" not in pids
    assert 1 <= len(pids) <= 2


def test_processes__the_child_decodes_the_stored_payload_with_the_sites_codec(settings_variant):
    """A codec whose decoded payload is not JSON: the child gets the stored text, not the value."""
    env = settings_variant(
        "ALKSTORE = {**ALKSTORE, 'PAYLOAD_CODEC': 'tests.testapp.pool_jobs.DecimalCodec'}"
    )
    ids = store.queue("p.work").enqueue_many([{"price": "9.90"}] * 3)
    code, out = runworker(
        env, "--queue", "p.work", "--pool", "processes", "--concurrency", "1", "--burst"
    )
    assert code == 0, out
    # Acked at the first attempt by a handler that saw a Decimal, in a child process.
    assert_acked_once(ids)
    assert len(pids_of(ids)) == 1


def test_processes__a_child_that_segfaults_fails_only_its_own_job(subprocess_env):
    q = store.queue("p.work", max_attempts=1)
    before = q.enqueue_many([{}] * 10)
    crasher = q.enqueue({"segfault": True})
    after = q.enqueue_many([{}] * 10)
    code, out = runworker(
        subprocess_env, "--queue", "p.work", "--pool", "processes", "--concurrency", "2", "--burst"
    )
    assert code == 0, out
    assert_acked_once(before + after)
    dead = DeadJob.objects.get(id=crasher)
    assert dead.last_error == "the child process was killed by SIGSEGV while running this job"
    assert Run.objects.filter(job_id=crasher).count() == 1


def test_processes__a_leaking_child_is_recycled_and_nothing_is_lost(subprocess_env):
    ids = store.queue("p.work").enqueue_many([{"leak_mb": 50}] * 8)
    code, out = runworker(
        subprocess_env, "--queue", "p.work", "--pool", "processes", "--concurrency", "1",
        "--max-memory-per-child", "150", "--burst",
    )  # fmt: skip
    assert code == 0, out
    assert_acked_once(ids)
    assert out.count("child recycled") >= 2, out
    assert len(pids_of(ids)) >= 3  # each child ran at most three 50 MB jobs


def test_processes__max_jobs_per_child_replaces_children(subprocess_env):
    ids = store.queue("p.work").enqueue_many([{}] * 12)
    code, out = runworker(
        subprocess_env, "--queue", "p.work", "--pool", "processes", "--concurrency", "1",
        "--max-jobs-per-child", "5", "--burst",
    )  # fmt: skip
    assert code == 0, out
    assert_acked_once(ids)
    assert len(pids_of(ids)) == 3  # 5 + 5 + 2


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_sigterm_during_a_long_job__exits_0_and_never_runs_it_twice(subprocess_env, pool):
    job_id = store.queue("p.work", retry_base_s=0).enqueue({"sleep_s": 30})
    proc = runworker(
        subprocess_env, "--queue", "p.work", "--pool", pool, "--grace-s", "0.5", wait=False
    )
    assert wait_for(lambda: Run.objects.filter(job_id=job_id).exists(), timeout=60)
    [pid] = pids_of([job_id])
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert time.monotonic() - started < 8
    job = store.get_job(job_id)
    assert (job.state, job.attempts) == ("pending", 1)
    assert job.last_error.startswith("interrupted: the worker shut down")
    # The process that ran the handler is gone: the job cannot be running twice.
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid.removeprefix("pid:")), 0)
    assert Run.objects.filter(job_id=job_id).count() == 1


def test_processes__a_child_that_cannot_start_stops_the_worker_and_charges_nothing(
    subprocess_env,
):
    ids = store.queue("p.work").enqueue_many([{}] * 5)
    cmd = [sys.executable, "-m", "django", "runworker", "--settings", "tests.settings_broken_child"]
    proc = subprocess.run(
        [*cmd, "--queue", "p.work", "--pool", "processes", "--burst"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "could not start a child process" in proc.stderr
    for job_id in ids:
        job = store.get_job(job_id)
        assert (job.state, job.attempts) == ("pending", 0)  # never started: never charged
    assert not Run.objects.exists()


def test_processes__a_handler_past_its_time_limit_is_killed_retried_then_dead_lettered(
    subprocess_env,
):
    q = store.queue("p.work", max_attempts=2, retry_base_s=0)
    looping = q.enqueue({"loop": True}, timeout_s=1)
    innocent = q.enqueue_many([{"sleep_s": 0.2}] * 6)
    started = time.monotonic()
    code, out = runworker(
        subprocess_env, "--queue", "p.work", "--pool", "processes", "--concurrency", "2", "--burst"
    )
    assert code == 0, out
    dead = DeadJob.objects.get(id=looping)
    assert (dead.attempts, dead.last_error) == (2, "timed out after 1 s")
    assert Run.objects.filter(job_id=looping).count() == 2
    assert_acked_once(innocent)
    # Two attempts of 1 s each (backoff 0), the children that replace the killed
    # ones, and the worker's own start-up.
    assert time.monotonic() - started < 2 * 1 + 15
    # From the first attempt's start, not the enqueue: the worker's own start-up
    # (Django's, several seconds on a loaded machine) is not the time limit's.
    first_run = Run.objects.filter(job_id=looping).earliest("created_at")
    assert (dead.died_at - first_run.created_at).total_seconds() < 2 * (1 + 2 + 2)


def test_threads__a_handler_past_its_time_limit_is_stopped_retried_then_dead_lettered(
    subprocess_env,
):
    """The time-out is raised in the handler's thread: the worker goes on, no restart needed."""
    q = store.queue("p.work", max_attempts=2, retry_base_s=0)
    looping = q.enqueue({"loop": True}, timeout_s=1)
    innocent = q.enqueue_many([{"sleep_s": 0.1}] * 6)
    code, out = runworker(subprocess_env, "--queue", "p.work", "--concurrency", "2", "--burst")
    assert code == 0, out
    dead = DeadJob.objects.get(id=looping)
    assert (dead.attempts, dead.last_error) == (2, "timed out after 1 s")
    assert Run.objects.filter(job_id=looping).count() == 2
    assert_acked_once(innocent)
    durations = re.findall(rf"job id={looping} .*duration_ms=([\d.]+)", out)
    assert len(durations) == 2 and all(float(d) >= 1000 for d in durations), out


def test_threads__a_handler_that_does_not_stop_makes_the_worker_exit_75_and_its_sentinel_records_it(
    subprocess_env,
):
    """A handler inside C (``time.sleep``) cannot take the raised time-out: its job stays held."""
    q = store.queue("p.work", max_attempts=2, retry_base_s=0)
    stuck = q.enqueue({"sleep_s": 60}, timeout_s=1)
    started = time.monotonic()
    code, out = runworker(subprocess_env, "--queue", "p.work", "--grace-s", "1", "--burst")
    assert code == 75, out
    assert "its thread did not stop" in out
    assert time.monotonic() - started < 30
    # The sentinel records the attempt once the process has gone.
    assert wait_for(lambda: store.get_job(stuck).state == "pending", timeout=10), out
    job = store.get_job(stuck)
    assert (job.attempts, job.last_error) == (1, "timed out after 1 s")
    assert Run.objects.filter(job_id=stuck).count() == 1


def _end_all(proc, *pid_files):
    """Kill what a failing test left running: the worker's group and the handlers' processes."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        proc.communicate(timeout=10)
    for pid_file in pid_files:
        if pid_file.exists() and process_alive(pid := int(pid_file.read_text())):
            os.kill(pid, signal.SIGKILL)


def test_processes__a_child_killed_beside_a_helper_it_forked_fails_its_attempt_and_ends_it(
    subprocess_env, tmp_path
):
    """The helper holds the result pipe open: the worker must watch the child's exit itself."""
    helper_file = tmp_path / "helper.pid"
    job_id = store.queue("h.fork-then-die", max_attempts=1).enqueue({"pid_file": str(helper_file)})
    innocent = store.queue("p.work").enqueue_many([{}] * 3)
    proc = runworker(
        subprocess_env, "--queue", "h.fork-then-die", "--queue", "p.work", "--pool", "processes",
        "--concurrency", "1", "--burst", wait=False, new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        _end_all(proc, helper_file)
    assert proc.returncode == 0, out
    dead = DeadJob.objects.get(id=job_id)
    assert dead.last_error == "the child process was killed by SIGKILL while running this job"
    assert_acked_once(innocent)
    # The helper went with the child's process group.
    assert not process_alive(int(helper_file.read_text()))


def test_processes__sigterm_kills_a_child_that_ignores_it_before_its_attempt_is_recorded(
    subprocess_env, tmp_path
):
    child_file = tmp_path / "child.pid"
    job_id = store.queue("h.deaf", retry_base_s=0).enqueue({"pid_file": str(child_file)})
    proc = runworker(
        subprocess_env, "--queue", "h.deaf", "--pool", "processes", "--grace-s", "0.5",
        wait=False, new_session=True,
    )  # fmt: skip
    try:
        assert wait_for(child_file.exists, timeout=60)
        assert wait_for(lambda: child_file.read_text(), timeout=5)
        child = int(child_file.read_text())
        proc.send_signal(signal.SIGTERM)
        # Due again the moment its attempt is recorded (no backoff): by then the child is gone.
        assert wait_for(lambda: store.get_job(job_id).state == "pending", timeout=20, interval=0.01)
        assert not process_alive(child)
        out, _ = proc.communicate(timeout=30)
    finally:
        _end_all(proc, child_file)
    assert proc.returncode == 0, out
    job = store.get_job(job_id)
    assert (job.state, job.attempts) == ("pending", 1)
    assert job.last_error.startswith("interrupted: the worker shut down")
    assert Run.objects.filter(job_id=job_id).count() == 1
