"""Queue controls under real workers: pause and resume, max_running, rate.

Every test drains the queue ``t.tracked`` with ``runworker`` subprocesses;
its handler appends ``start``/``end`` lines with the wall clock to a log file,
so the peaks and the starts per second are the handlers' own record.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from alkstore_django import store
from alkstore_django.conf import app_settings
from alkstore_django.models import DeadJob, Job
from tests.helpers import live_count, runworker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(150)]

QUEUE = "t.tracked"


def events(log: Path) -> list[tuple[str, int, float]]:
    """Return the handlers' (kind, job id, time) lines, in time order."""
    if not log.exists():
        return []
    rows = []
    for line in log.read_text().splitlines():
        kind, job_id, at = line.split()
        rows.append((kind, int(job_id), float(at)))
    return sorted(rows, key=lambda row: (row[2], row[0] == "start"))


def starts(log: Path) -> list[float]:
    return [at for kind, _, at in events(log) if kind == "start"]


def peak_running(log: Path) -> int:
    """Return the most handlers running at once (an end sorts before a start at the same time)."""
    running = peak = 0
    for kind, _, _ in events(log):
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    return peak


def limited(settings_variant, **keys: object) -> dict[str, str]:
    """Return the workers' environment with ``keys`` in ``ALKSTORE["QUEUES"][QUEUE]``."""
    return settings_variant(f"ALKSTORE = {{**ALKSTORE, 'QUEUES': {{{QUEUE!r}: {keys!r}}}}}")


def start_workers(env: dict[str, str], count: int, concurrency: int) -> list:
    return [
        runworker(env, "--queue", QUEUE, "--concurrency", str(concurrency), wait=False)
        for _ in range(count)
    ]


def stop_workers(procs: list) -> list[str]:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    outs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * len(procs), outs
    return outs


def assert_each_started_once(log: Path, ids: list[int]) -> None:
    started = Counter(job_id for kind, job_id, _ in events(log) if kind == "start")
    assert sorted(started) == sorted(ids)  # none lost
    assert max(started.values()) == 1  # none doubled
    assert live_count(QUEUE) == 0
    assert not DeadJob.objects.exists()


def test_pause__stops_new_starts_of_two_draining_workers_and_resume_restarts_them(
    subprocess_env, tmp_path
):
    # PostgreSQL tells every worker at once (NOTIFY); elsewhere a worker reads
    # the paused queues on its poll (POLL_INTERVAL_S, 1 s in the test settings).
    notified = store.dialect.supports_listen_notify
    bound_s = 1.0 if notified else app_settings.poll_interval_s + 1.0
    log = tmp_path / "runs.log"
    q = store.queue(QUEUE)
    ids = q.enqueue_many([{"log": str(log), "sleep_s": 0.05}] * 600)
    procs = start_workers(subprocess_env, 2, 4)
    try:
        assert wait_for(lambda: len(starts(log)) >= 40, timeout=60)
        assert q.pause() is True
        paused_at = time.time()
        time.sleep(bound_s + 2.0)
        late = [at - paused_at for at in starts(log) if at > paused_at]
        print(f"pause: {len(late)} starts after it, the last {max(late, default=0.0):.3f} s after")
        assert max(late, default=0.0) < bound_s, f"started {len(late)} jobs after the pause"
        before_resume = len(starts(log))
        assert before_resume < len(ids)  # the pause held jobs back
        q.enqueue({"log": str(log)})  # enqueue still works while paused
        time.sleep(0.5)
        assert len(starts(log)) == before_resume
        assert q.resume() is True
        assert wait_for(lambda: live_count(QUEUE) == 0, timeout=90)
    finally:
        outs = stop_workers(procs)
    assert sum(out.count("outcome=acked") for out in outs) == len(ids) + 1
    assert_each_started_once(log, [*ids, max(ids) + 1])


def test_max_running_2__holds_over_four_workers_of_four_threads_and_500_jobs(
    subprocess_env, settings_variant, tmp_path
):
    env = limited(settings_variant, max_running=2)
    log = tmp_path / "runs.log"
    ids = store.queue(QUEUE).enqueue_many([{"log": str(log), "sleep_s": 0.01}] * 500)
    procs = start_workers(env, 4, 4)
    try:
        assert wait_for(lambda: live_count(QUEUE) == 0, timeout=120)
    finally:
        stop_workers(procs)
    peak = peak_running(log)
    print(f"max_running 2: peak {peak} handlers running at once over {len(ids)} jobs")
    assert peak == 2  # reached, never exceeded
    assert_each_started_once(log, ids)


def test_rate_20_per_second__starts_190_to_220_jobs_in_10_seconds(
    subprocess_env, settings_variant, tmp_path
):
    env = limited(settings_variant, rate="20/s")
    log = tmp_path / "runs.log"
    store.queue(QUEUE).enqueue_many([{"log": str(log)}] * 400)
    procs = start_workers(env, 2, 4)
    try:
        assert wait_for(lambda: starts(log), timeout=60)
        first = starts(log)[0]
        time.sleep(max(first + 10.5 - time.time(), 0.0))
    finally:
        stop_workers(procs)
    in_ten_s = [at for at in starts(log) if at < first + 10.0]
    # A window opens at its first claim and a start follows its claim: when the
    # first start lags its claim more than later ones, an eleventh window's
    # starts fall inside the ten seconds (seen under load), never a twelfth.
    assert 190 <= len(in_ten_s) <= 220
    print(f"rate 20/s: {len(in_ten_s)} starts in the first 10 s")
    # Jobs held back by the rate waited without spending an attempt.
    waiting = Job.objects.filter(queue=QUEUE).values_list("attempts", flat=True)
    assert waiting and set(waiting) == {0}
