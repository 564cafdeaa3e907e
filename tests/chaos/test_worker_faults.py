"""Workers killed, poisoned and paused: nothing lost, nothing run twice unexplained.

Scenarios 1, 6 and 7 of the reliability suite (docs/reliability.md). They run
on both engines: a SIGKILL, a SIGSTOP and ``os._exit`` hurt a worker process
the same way whichever database it talks to.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time

import pytest

from alkstore_django import store
from alkstore_django.models import DeadJob, Job
from tests.chaos.harness import account, drained, settle
from tests.helpers import VENDOR, process_alive, wait_for
from tests.testapp.models import ChaosRun

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

CONCURRENCY = 4
BATCH = CONCURRENCY * 4


@pytest.mark.timeout(150)
def test_kill_storm__a_random_worker_sigkilled_every_second_loses_nothing(
    fleet, report, chaos_long
):
    """Scenario 1: 4 workers, one SIGKILLed at random every second and restarted.

    The short form stops killing after ``max_kills`` (each restart costs a
    Django boot, which dominates a small CI machine); the long form kills
    every second until the queue is drained.
    """
    started = time.monotonic()
    count = 10_000 if chaos_long else 2_000
    max_kills = 10**6 if chaos_long else 12
    queue = store.queue("chaos.work", visibility_timeout_s=2, max_attempts=50, retry_base_s=1)
    ids = queue.enqueue_many([{"work_ms": 2}] * count)
    slots = [f"kill-w{i}" for i in range(4)]
    workers = {
        slot: fleet.start_worker(slot, ["chaos.work"], concurrency=CONCURRENCY, batch=BATCH)
        for slot in slots
    }
    rng = random.Random(6)
    is_drained = drained(["chaos.work"])
    deadline = time.monotonic() + (1200 if chaos_long else 90)
    while fleet.kills < max_kills and not is_drained() and time.monotonic() < deadline:
        time.sleep(1.0)
        # Only a worker that is up holds claims; killing one still booting proves nothing.
        working = [slot for slot in slots if workers[slot].ready()]
        if not working:
            continue
        slot = rng.choice(working)
        fleet.kill(workers[slot])
        workers[slot] = fleet.start_worker(
            slot, ["chaos.work"], concurrency=CONCURRENCY, batch=BATCH
        )
        fleet.restarts += 1
    assert wait_for(is_drained, timeout=60), fleet.tail()
    # Four workers restarted every second on a small machine can starve a loop
    # past its stall limit (a third of the 2 s claim, at least 1 s): its
    # sentinel then kills it, as it must before the claims lapse.
    fleet.stop_all_cleanly(watchdog_kills=True)
    figures = account("1 kill storm", VENDOR, ids, fleet)
    settle(figures, fleet, started, report)
    assert figures.acked == count
    assert fleet.kills >= 1
    # A kill can interrupt at most the jobs its worker held under claim.
    assert figures.rerun_after_kill <= (fleet.kills + len(fleet.watchdog_killed())) * BATCH
    assert figures.rerun_after_retry == 0


def rescue(job_id: int, timeout: float):
    """Claim ``job_id`` as another worker once its claim lapses; hold it for a minute."""
    found = []

    def claimed():
        handle = store.queue("chaos.stale").claim_one("rescuer")
        if handle is not None:
            found.append(handle)
        return handle is not None

    assert wait_for(claimed, timeout=timeout, interval=0.05)
    handle = found[0]
    assert handle.job.id == job_id
    # Held well past the checks, so the resumed worker cannot take it back in turn.
    assert handle.heartbeat(120)
    return handle


def signal_sentinel(worker, signum: int) -> None:
    """Send ``signum`` to the sentinel ``worker`` logged at start-up."""
    match = re.search(r"sentinel started pid=(\d+)", worker.log())
    assert match, worker.log()
    os.kill(int(match.group(1)), signum)


@pytest.mark.timeout(180)
def test_stale_worker__paused_past_its_lease_changes_nothing_when_resumed(
    fleet, report, chaos_long
):
    """Scenario 6: SIGSTOP a worker mid-job, let another re-claim the job, then SIGCONT.

    Below the lease the job is not stolen and the worker acks it. Past the
    lease the rescuer holds attempt 2; the resumed worker's heartbeat, ack,
    retry and fail (one outcome per round) must all be refused and change
    nothing. The long form repeats the rounds with pauses jittered around
    the timeout.
    """
    started = time.monotonic()
    vt_s = 4
    queue = store.queue("chaos.stale", visibility_timeout_s=vt_s, max_attempts=10, retry_base_s=0)
    worker = fleet.start_worker("stale-w", ["chaos.stale"], concurrency=1, batch=1)
    assert wait_for(worker.ready, timeout=60), fleet.tail()
    rounds = [("under", "ack"), ("over", "ack"), ("over", "retry"), ("over", "fail")]
    rng = random.Random(6)
    if chaos_long:
        rounds *= 5
    ids, refused, survived = [], 0, 0
    for kind, outcome in rounds:
        job_id = queue.enqueue({"work_s": 1.5, "outcome": outcome})
        ids.append(job_id)
        assert wait_for(lambda j=job_id: ChaosRun.objects.filter(job_id=j).exists(), 60)
        # The whole process group, as a paused host or container: the sentinel too,
        # or its watchdog would (rightly) kill a worker stopped on its own.
        fleet.pause(worker)
        signal_sentinel(worker, signal.SIGSTOP)
        if kind == "under":
            # The claim has at least two thirds of its lease left (heartbeats every third).
            time.sleep(rng.uniform(0.3, 1.0) if chaos_long else 1.0)
            assert queue.claim_one("rescuer") is None, "a live claim was stolen"
            signal_sentinel(worker, signal.SIGCONT)
            fleet.resume(worker)
            assert wait_for(lambda j=job_id: store.get_job(j) is None, 30), fleet.tail()
            survived += 1
            continue
        handle = rescue(job_id, timeout=vt_s + 20)
        assert handle.job.attempts == 2
        time.sleep(rng.uniform(0.1, 2.0) if chaos_long else 0.5)
        signal_sentinel(worker, signal.SIGCONT)
        fleet.resume(worker)
        lost = f"job id={job_id} queue=chaos.stale outcome=lost"
        assert wait_for(lambda m=lost: m in worker.log(), 30), fleet.tail()
        assert f"claim lost id={job_id} " in worker.log()  # the heartbeat was refused
        row = Job.objects.get(id=job_id)
        assert (row.state, row.worker_id, row.attempts, row.last_error) == (
            "processing",
            "rescuer",
            2,
            None,
        )
        assert not DeadJob.objects.filter(id=job_id).exists()
        refused += 1
        assert handle.ack()
    fleet.stop_all_cleanly()
    figures = account("6 stale worker", VENDOR, ids, fleet)
    figures.restarts = 0
    figures.notes = {"pauses_under_lease": survived, "pauses_past_lease": refused}
    # The rescuer acked without running the handler: those jobs show one run each.
    settle(figures, fleet, started, report)
    assert figures.acked == len(rounds)
    assert figures.double_run == 0


@pytest.mark.timeout(150)
def test_stalled_worker__sigstopped_past_all_its_claims_takes_them_back_and_lives(
    fleet, report, chaos_long
):
    """Scenario 6b: a busy worker (and its sentinel) SIGSTOPped past every claim it holds.

    Resumed, it claims its own lapsed jobs again while it still holds them:
    each new claim supersedes the held one, which is never run (or is refused
    if it was running). Nothing is lost, no (job, attempt) runs twice, and
    the worker lives on to drain the queue. The sentinel is stopped with it,
    as a host or container pause would: its watchdog must not judge a pause
    it did not see.
    """
    started = time.monotonic()
    vt_s = 2
    count = 400 if chaos_long else 150
    queue = store.queue("chaos.work", visibility_timeout_s=vt_s, max_attempts=50, retry_base_s=0)
    # Slow enough that claims come while the lapsed prefetched jobs still wait.
    ids = queue.enqueue_many([{"work_ms": 150}] * count)
    # Deep prefetch: most held claims wait for a thread, and lapse unstarted.
    worker = fleet.start_worker("stall-w", ["chaos.work"], concurrency=2, batch=32)
    assert wait_for(worker.ready, timeout=60), fleet.tail()
    pauses = 10 if chaos_long else 5
    for _ in range(pauses):
        time.sleep(0.5)
        assert worker.alive(), fleet.tail()
        fleet.pause(worker)
        signal_sentinel(worker, signal.SIGSTOP)
        time.sleep(vt_s + 1.0)
        # The sentinel first, as a resumed host may: its watchdog must not judge the pause.
        signal_sentinel(worker, signal.SIGCONT)
        fleet.resume(worker)
    assert wait_for(drained(["chaos.work"]), timeout=90), fleet.tail()
    assert worker.alive(), fleet.tail()
    assert "Traceback" not in worker.log(), fleet.tail()
    assert "claim lost id=" in worker.log()  # the stalls did outlast the claims
    codes = fleet.stop_all()
    assert codes == {worker.name: 0}, (codes, fleet.tail())
    figures = account("6b stalled worker", VENDOR, ids, fleet)
    figures.notes = {"pauses_past_claims": pauses}
    settle(figures, fleet, started, report)
    assert figures.acked == count
    assert figures.same_attempt_twice == 0


@pytest.mark.timeout(150)
def test_poison_job__dead_lettered_after_exactly_max_attempts_while_others_carry_on(
    fleet, report, chaos_long
):
    """Scenario 7: a handler that ``os._exit``s its worker, among ordinary jobs."""
    started = time.monotonic()
    count = 2_000 if chaos_long else 300
    work = store.queue("chaos.work", visibility_timeout_s=2, max_attempts=50, retry_base_s=1)
    poison = store.queue("chaos.poison", visibility_timeout_s=1, max_attempts=3, retry_base_s=1)
    ids = work.enqueue_many([{"work_ms": 2}] * (count // 2))
    poison_id = poison.enqueue({"poison": True})
    ids += work.enqueue_many([{"work_ms": 2}] * (count - count // 2))
    queues = ["chaos.poison", "chaos.work"]
    slots = ["poison-w0", "poison-w1"]
    workers = {
        slot: fleet.start_worker(slot, queues, concurrency=CONCURRENCY, batch=BATCH)
        for slot in slots
    }
    is_drained = drained(queues)
    deadline = time.monotonic() + (600 if chaos_long else 100)
    exit_codes = []
    while not is_drained() and time.monotonic() < deadline:
        for proc in fleet.reap():
            exit_codes.append(proc.popen.returncode)
            slot = proc.name.rsplit(".", 1)[0]
            # As a process supervisor would: the worker comes back.
            workers[slot] = fleet.start_worker(slot, queues, concurrency=CONCURRENCY, batch=BATCH)
            fleet.restarts += 1
        time.sleep(0.2)
    assert is_drained(), fleet.tail()
    # The last death may come after the drain: its sentinel buries the job at once.
    exit_codes += [proc.popen.returncode for proc in fleet.reap()]
    fleet.stop_all_cleanly()
    dead = DeadJob.objects.get(id=poison_id)
    assert dead.attempts == 3
    assert "died while running this job" in dead.last_error
    attempts = sorted(ChaosRun.objects.filter(job_id=poison_id).values_list("attempt", flat=True))
    assert attempts == [1, 2, 3]
    assert exit_codes == [3, 3, 3]
    figures = account("7 poison job", VENDOR, [*ids, poison_id], fleet)
    figures.notes = {"poison_claims": dead.attempts, "worker_deaths": len(exit_codes)}
    settle(figures, fleet, started, report)
    assert (figures.acked, figures.dead) == (count, 1)
    assert figures.rerun_after_kill <= fleet.kills * BATCH


@pytest.mark.timeout(120)
def test_poison_job__its_prefetched_neighbours_never_pay_for_its_crashes(fleet, report):
    """Scenario 7b: ``--concurrency 1 --batch 4``, a job that ``os._exit``s and three others.

    The three are held (prefetched) behind it each time it kills the worker:
    they must be acked at their first attempt, never charged for its crashes,
    while it is dead-lettered after exactly ``max_attempts`` runs.
    """
    started = time.monotonic()
    queue = store.queue("chaos.work", visibility_timeout_s=30, max_attempts=3, retry_base_s=0)
    killer = queue.enqueue({"exit": True}, priority=1)  # claimed first, every time it is due
    innocent = queue.enqueue_many([{"work_ms": 2}] * 3)
    exit_codes = []
    fleet.start_worker("prefetch", ["chaos.work"], concurrency=1, batch=4)
    is_drained = drained(["chaos.work"])
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (is_drained() and len(exit_codes) >= 3):
        for proc in fleet.reap():
            exit_codes.append(proc.popen.returncode)
            fleet.start_worker("prefetch", ["chaos.work"], concurrency=1, batch=4)
            fleet.restarts += 1
        time.sleep(0.1)
    assert is_drained(), fleet.tail()
    fleet.stop_all_cleanly()
    assert exit_codes == [3, 3, 3]
    runs = sorted(ChaosRun.objects.filter(job_id=killer).values_list("attempt", flat=True))
    assert runs == [1, 2, 3]
    assert DeadJob.objects.get(id=killer).attempts == 3
    for job_id in innocent:
        assert list(ChaosRun.objects.filter(job_id=job_id).values_list("attempt", flat=True)) == [1]
    figures = account("7b poison's neighbours", VENDOR, [killer, *innocent], fleet)
    settle(figures, fleet, started, report)
    assert (figures.acked, figures.dead) == (3, 1)


@pytest.mark.timeout(150)
def test_forking_child_killed__its_job_is_retried_and_the_process_pool_worker_lives(
    fleet, report, tmp_path, chaos_long
):
    """A process-pool child forks a helper (holding its pipes), then is SIGKILLed.

    The OOM killer's shape under ``multiprocessing``: the worker must see the
    child die although its result pipe stays open, retry only that attempt,
    end the helper with the child's process group, and keep working.
    """
    started = time.monotonic()
    count, forks = (1_000, 20) if chaos_long else (200, 5)
    queue = store.queue("chaos.fork", visibility_timeout_s=30, max_attempts=5, retry_base_s=0)
    ids = queue.enqueue_many([{"work_ms": 2}] * count)
    forking = queue.enqueue_many([{"pid_dir": str(tmp_path)}] * forks)
    worker_id = "fork-w.g1"
    argv = ["-m", "django", "runworker", "--settings", "tests.settings", "--worker-id", worker_id]
    argv += ["--queue", "chaos.fork", "--pool", "processes", "--concurrency", "2"]
    worker = fleet.start(worker_id, argv)
    assert wait_for(drained(["chaos.fork"]), timeout=100), fleet.tail()
    assert worker.alive(), fleet.tail()
    helpers = [int(path.read_text()) for path in tmp_path.iterdir() if path.name.isdigit()]
    assert len(helpers) == forks
    assert not [pid for pid in helpers if process_alive(pid)]
    fleet.stop_all_cleanly()
    for job_id in forking:
        runs = ChaosRun.objects.filter(job_id=job_id).values_list("attempt", flat=True)
        assert sorted(runs) == [1, 2]
    figures = account("child forks, then killed", VENDOR, [*ids, *forking], fleet)
    figures.notes = {"children_killed": forks}
    settle(figures, fleet, started, report)
    assert figures.acked == count + forks
    assert figures.rerun_after_retry == forks
