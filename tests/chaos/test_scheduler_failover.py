"""Scenario 4: the scheduler leader SIGKILLed, then SIGSTOPped past its lease and resumed.

Three ``runscheduler`` processes and one worker run on the test database. The
leader is killed; a standby must take over once the 10 s lease lapses. The
new leader is then paused past its lease; another standby takes over, and the
paused one, resumed, must notice the lost lease before firing. Every
boundary from the first to the last must fire exactly once, for an
``@every 1s`` and for a ``@cron`` with a seconds field read in a zone: the
fired jobs' recorded boundaries are exactly the spec's boundaries the
schedule's ``next_run_at`` moved across, none twice, and the worker acks
each once. Runs on every engine (the lease and the tick are the same SQL;
SQLite's tick is a ``BEGIN IMMEDIATE`` transaction).
"""

from __future__ import annotations

import time

import pytest

from alkstore_django import store
from alkstore_django.models import DeadJob, Job, Lock, Schedule, ScheduleFire
from alkstore_django.scheduler import LEADER_LOCK, LEADER_TTL_S
from alkstore_django.specs import boundaries, parse_spec
from tests.chaos.harness import Fleet, Proc, account, drained, settle
from tests.helpers import VENDOR, db_now, wait_for
from tests.testapp.models import ChaosRun

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

TAKEOVER_S = LEADER_TTL_S + 20  # the lease, the standby's retry and a loaded machine


def leader(fleet: Fleet) -> Proc | None:
    """Return the process holding an unexpired scheduler lease, if any."""
    row = Lock.objects.filter(name=LEADER_LOCK).first()
    if row is None or row.expires_at <= db_now():
        return None
    pid = int(row.owner.rsplit(":", 2)[1])  # owner is host:pid:random
    return fleet.by_pid(pid)


def fired() -> int:
    """Jobs the schedule has enqueued so far: run, live or dead."""
    run = set(ChaosRun.objects.filter(queue="chaos.work").values_list("job_id", flat=True))
    live = set(Job.objects.filter(queue="chaos.work").values_list("id", flat=True))
    dead = set(DeadJob.objects.filter(queue="chaos.work").values_list("id", flat=True))
    return len(run | live | dead)


def new_leader(fleet: Fleet, old: Proc) -> Proc:
    found: list[Proc] = []

    def taken() -> bool:
        current = leader(fleet)
        if current is not None and current is not old:
            found.append(current)
        return bool(found)

    assert wait_for(taken, timeout=TAKEOVER_S, interval=0.2), fleet.tail()
    return found[0]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("spec", "zone"), [("@every 1s", None), ("@cron */2 * * * * *", "Europe/Paris")]
)
def test_scheduler_failover__a_standby_takes_over_and_no_boundary_fires_twice(
    fleet, report, chaos_long, spec, zone
):
    started = time.monotonic()
    registered = store.schedule("chaos-tick", spec, "chaos.work", {"work_ms": 0}, zone=zone)
    first_boundary = registered.next_run_at
    worker = fleet.start_worker("tick-w", ["chaos.work"], concurrency=2)
    schedulers = {f"sched-{i}": fleet.start_scheduler(f"sched-{i}") for i in range(3)}
    assert wait_for(lambda: leader(fleet) is not None, timeout=60), fleet.tail()
    cycles = 4 if chaos_long else 1
    paused_leaders = 0
    for cycle in range(cycles):
        current = leader(fleet)
        assert current is not None
        before = fired()
        assert wait_for(lambda b=before: fired() >= b + 2, timeout=30), fleet.tail()
        fleet.kill(current)
        current = new_leader(fleet, current)
        before = fired()
        assert wait_for(lambda b=before: fired() >= b + 2, timeout=30), fleet.tail()
        fleet.pause(current)
        replacement = new_leader(fleet, current)
        fleet.resume(current)
        paused_leaders += 1
        # The resumed runner renews within 2 s of waking and finds the lease gone.
        time.sleep(3.0)
        assert leader(fleet) is replacement, "the resumed leader took the lease back"
        # Bring the fleet back to three runners for the next cycle.
        for name, proc in list(schedulers.items()):
            if proc.killed:
                schedulers[name] = fleet.start_scheduler(f"{name}-c{cycle + 1}")
                fleet.restarts += 1
    before = fired()
    assert wait_for(lambda: fired() >= before + 2, timeout=30), fleet.tail()
    codes = {p.name: fleet.stop(p) for p in fleet.procs if p is not worker and not p.killed}
    assert wait_for(drained(["chaos.work"]), timeout=60), fleet.tail()
    codes.update(fleet.stop_all())
    assert set(codes.values()) == {0}, (codes, fleet.tail())
    final = Schedule.objects.get(name="chaos-tick")
    parsed = parse_spec(spec, zone or "UTC")
    expected = boundaries(parsed, first_boundary, final.next_run_at, 10**6)[:-1]
    ids = sorted(set(ChaosRun.objects.values_list("job_id", flat=True)))
    recorded = list(
        ScheduleFire.objects.filter(job_id__in=ids)
        .order_by("boundary")
        .values_list("boundary", flat=True)
    )
    # Every boundary from the first to the schedule's next one fired exactly once.
    assert fired() == len(ids) == len(expected), (fired(), len(ids), len(expected), fleet.tail())
    assert recorded == expected  # each boundary once, none twice, none skipped
    figures = account(f"4 scheduler failover {spec}", VENDOR, ids, fleet)
    lock = Lock.objects.filter(name=LEADER_LOCK).first()
    figures.notes = {
        "boundaries": len(expected),
        "fired": len(ids),
        "leaders_paused": paused_leaders,
        "fence": lock.fence if lock else None,
    }
    settle(figures, fleet, started, report)
    assert figures.double_run == 0
