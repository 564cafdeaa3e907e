"""``max_running_per_key`` under real workers: four ``runworker`` processes of four threads.

The handler of ``t.tracked`` appends ``start``/``end`` lines with the wall
clock to a log file, so the peaks per key are the handlers' own record.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

from alkstore_django import store
from tests.concurrency.test_queue_controls import (
    QUEUE,
    assert_each_started_once,
    events,
    limited,
    start_workers,
    stop_workers,
)
from tests.helpers import live_count, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def peaks_by_key(log: Path, key_of: dict[int, str]) -> dict[str, int]:
    """Return the most handlers of each key running at once."""
    running: dict[str, int] = defaultdict(int)
    peaks: dict[str, int] = defaultdict(int)
    for kind, job_id, _ in events(log):
        key = key_of[job_id]
        running[key] += 1 if kind == "start" else -1
        peaks[key] = max(peaks[key], running[key])
    return dict(peaks)


def test_max_running_per_key_2__holds_for_20_keys_of_50_jobs_over_four_workers_of_four_threads(
    subprocess_env, settings_variant, tmp_path
):
    env = limited(settings_variant, max_running_per_key=2)
    log = tmp_path / "runs.log"
    q = store.queue(QUEUE)
    key_of: dict[int, str] = {}
    for k in range(20):
        key = f"customer:{k}"
        for job_id in q.enqueue_many(
            [{"log": str(log), "sleep_s": 0.02}] * 50, concurrency_key=key
        ):
            key_of[job_id] = key
    procs = start_workers(env, 4, 4)
    try:
        assert wait_for(lambda: live_count(QUEUE) == 0, timeout=150)
    finally:
        stop_workers(procs)
    peaks = peaks_by_key(log, key_of)
    print(f"max_running_per_key 2: peaks per key {sorted(peaks.values())} over {len(key_of)} jobs")
    assert set(peaks) == set(key_of.values())
    assert max(peaks.values()) == 2  # reached, never exceeded
    assert_each_started_once(log, list(key_of))


def test_a_new_keys_single_job__starts_within_a_claim_round_behind_10000_of_another_key(
    subprocess_env, settings_variant, tmp_path
):
    env = limited(settings_variant, max_running_per_key=2)
    log = tmp_path / "runs.log"
    q = store.queue(QUEUE)
    q.enqueue_many([{"log": str(log), "sleep_s": 0.05}] * 10_000, concurrency_key="big")
    procs = start_workers(env, 1, 4)
    try:
        assert wait_for(lambda: len(events(log)) >= 10, timeout=60)
        enqueued_at = time.time()
        small = q.enqueue({"log": str(log)}, concurrency_key="small")
        assert wait_for(lambda: any(e[1] == small for e in events(log)), timeout=30)
    finally:
        stop_workers(procs)
    started = next(at for kind, job_id, at in events(log) if job_id == small and kind == "start")
    waited = started - enqueued_at
    # One claim round: the worker's next claim after the enqueue (woken by
    # it, or at the latest by a big job finishing, every 50 ms here).
    print(f"a new key's job behind 10,000 of another: started {waited * 1000:.0f} ms after enqueue")
    assert waited < 1.0
