"""Scenario 2: PostgreSQL restarted mid-drain.

Two workers and a scheduler are draining when the cluster is restarted with
``pg_ctlcluster … restart``. They must log the outage, reconnect and finish
with nothing lost; every schedule boundary fires exactly once (catch-up after
the outage). Enqueues attempted from the test process during the restart
either succeed (and are then found) or raise a ``DatabaseError`` to the
caller; none is dropped silently and none is half-written.

This restarts the whole server, so it only runs when the server is local,
``pg_ctlcluster`` exists (the cluster restarted is the one ``pg_lsclusters``
lists on the test database's port) and ``ALKSTORE_CHAOS_NO_PG_RESTART`` is not
set; it always waits for ``pg_isready`` afterwards.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time

import pytest
from django.db import DatabaseError, connection

from alkstore_django import store
from alkstore_django.models import DeadJob, Job, Schedule
from tests.chaos.harness import account, drained, env_flag, settle
from tests.helpers import VENDOR, wait_for
from tests.testapp.models import ChaosRun

pytestmark = [pytest.mark.chaos, pytest.mark.django_db(transaction=True)]

LOCAL_HOSTS = {"", "localhost", "127.0.0.1", "::1"}


def local_cluster() -> tuple[str, str, str] | None:
    """Return (version, name, owner) of the local cluster on the test database's port."""
    port = str(connection.settings_dict.get("PORT") or 5432)
    listing = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=False)
    for line in listing.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[2] == port:
            return fields[0], fields[1], fields[4]
    return None


def restart_refusal() -> str | None:
    """Return why the server must not be restarted here, or None."""
    if VENDOR != "postgresql":
        return (
            "PostgreSQL only: SQLite has no server to restart (its sibling holds the "
            "file's write lock instead); the MariaDB server is not restarted by the suite"
        )
    host = str(connection.settings_dict.get("HOST") or "")
    if host not in LOCAL_HOSTS and not host.startswith("/"):
        return f"the PostgreSQL server {host!r} is not local: it is not ours to restart"
    if shutil.which("pg_ctlcluster") is None or shutil.which("pg_lsclusters") is None:
        return "pg_ctlcluster is not installed: cannot restart the cluster"
    cluster = local_cluster()
    if cluster is None:
        return "no local cluster listens on the test database's port"
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != cluster[2]:
        return f"only root or {cluster[2]!r} may restart the cluster"
    if env_flag("ALKSTORE_CHAOS_NO_PG_RESTART"):
        return "ALKSTORE_CHAOS_NO_PG_RESTART is set"
    return None


def pg_isready(timeout: float = 90.0) -> bool:
    s = connection.settings_dict
    args = ["pg_isready", "-q", "-h", str(s.get("HOST") or "127.0.0.1")]
    args += ["-p", str(s.get("PORT") or 5432)]
    return wait_for(lambda: subprocess.run(args, check=False).returncode == 0, timeout, 0.2)


def pg_ctlcluster(action: str) -> subprocess.Popen:
    version, name, _owner = local_cluster()  # type: ignore[misc]
    return subprocess.Popen(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def probe_during(restart: subprocess.Popen, number: int) -> tuple[list[int], list[int]]:
    """Enqueue probes numbered after ``number`` until a second after the restart returns."""
    probes = store.queue("chaos.probe")
    accepted, refused = [], []
    settled_at = None
    while settled_at is None or time.monotonic() - settled_at < 1.0:
        number += 1
        try:
            probes.enqueue({"probe": number})
            accepted.append(number)
        except DatabaseError:
            refused.append(number)
            connection.close()  # the next attempt reconnects
        if settled_at is None and restart.poll() is not None:
            settled_at = time.monotonic()
        time.sleep(0.02)
    return accepted, refused


@pytest.mark.timeout(300)
def test_postgres_restarted_mid_drain__everyone_reconnects_and_nothing_is_lost(
    fleet, report, chaos_long
):
    reason = restart_refusal()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    count = 5_000 if chaos_long else 800
    queue = store.queue("chaos.work", visibility_timeout_s=5, max_attempts=50, retry_base_s=1)
    ids = queue.enqueue_many([{"work_ms": 5}] * count)
    registered = store.schedule("chaos-outage", "@every 1s", "chaos.tick", {"work_ms": 0})
    workers = [fleet.start_worker(f"outage-w{i}", ["chaos.work", "chaos.tick"]) for i in (0, 1)]
    scheduler = fleet.start_scheduler("outage-sched")
    restarts = 2 if chaos_long else 1
    accepted: list[int] = []
    refused: list[int] = []
    for _ in range(restarts):
        done = ChaosRun.objects.filter(queue="chaos.work").count()
        assert wait_for(
            lambda d=done: ChaosRun.objects.filter(queue="chaos.work").count() >= d + count // 5,
            120,
        ), fleet.tail()
        restart = pg_ctlcluster("restart")
        try:
            ok, failed = probe_during(restart, len(accepted) + len(refused))
            accepted += ok
            refused += failed
        finally:
            output, _ = restart.communicate(timeout=120)
            if not pg_isready():
                # Never leave a shared server down: try a plain start before failing.
                pg_ctlcluster("start").communicate(timeout=120)
                assert pg_isready(), "PostgreSQL did not come back"
            connection.close()
        assert restart.returncode == 0, output
        fleet.restarts += 1
    assert wait_for(drained(["chaos.work"]), 180), fleet.tail()
    assert fleet.stop(scheduler) == 0
    assert wait_for(drained(["chaos.tick"]), 60), fleet.tail()
    fleet.stop_all_cleanly()
    logs = {p.name: p.log() for p in fleet.procs}
    assert any("database unavailable" in logs[w.name] for w in workers), fleet.tail()
    # The scheduler saw the outage: in a tick ("unavailable", then it waits for
    # the server) or, as here most often, while sleeping between ticks (it logs
    # the error and goes on with a new connection, keeping its lease).
    assert re.search(
        r"scheduler database (unavailable|error while sleeping)", logs["outage-sched"]
    ), fleet.tail()
    # Enqueues during the outage failed loudly; none was dropped or half-written.
    assert refused, "no enqueue saw the outage"
    stored = sorted(p["probe"] for p in Job.objects.filter(queue="chaos.probe").values_list(
        "payload", flat=True))  # fmt: skip
    assert stored == accepted
    # Every boundary from the first to the schedule's next one fired exactly once.
    final = Schedule.objects.get(name="chaos-outage")
    boundaries = round((final.next_run_at - registered.next_run_at).total_seconds())
    ticks = set(ChaosRun.objects.filter(queue="chaos.tick").values_list("job_id", flat=True))
    ticks |= set(DeadJob.objects.filter(queue="chaos.tick").values_list("id", flat=True))
    assert len(ticks) == boundaries, (len(ticks), boundaries)
    figures = account("2 PostgreSQL restarted", VENDOR, [*ids, *sorted(ticks)], fleet)
    figures.notes = {
        "server_restarts": restarts,
        "enqueues_refused_during_restart": len(refused),
        "enqueues_accepted_during_restart": len(accepted),
        "boundaries_fired_once": boundaries,
    }
    settle(figures, fleet, started, report)
    assert figures.acked == count + boundaries
