"""``manage.py runscheduler``: failover between processes, clean stops, bad input."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from django.core.management import CommandError, call_command

from alkstore_django import store
from alkstore_django.models import Job
from alkstore_django.scheduler import LEADER_TTL_S
from tests.helpers import ROOT, leader_lock, wait_for


def leader_pid() -> int | None:
    """Return the pid in the live leader's owner token (host:pid:random), or None."""
    row = leader_lock()
    return int(row.owner.rsplit(":", 2)[1]) if row else None


def fired_after(job_id: int) -> bool:
    return Job.objects.filter(queue="beats", id__gt=job_id).exists()


def last_job_id() -> int:
    return (
        Job.objects.filter(queue="beats").order_by("-id").values_list("id", flat=True).first() or 0
    )


def logs(tmp_path) -> str:
    return "".join(p.read_text() for p in sorted(tmp_path.glob("scheduler-*.log")))


@pytest.mark.django_db(transaction=True)
def test_runscheduler__fails_over_on_sigkill_and_releases_on_sigterm(
    subprocess_env, python, tmp_path
):
    store.schedule("beat", "@every 1s", "beats")
    procs = {}
    for i in range(3):
        with (tmp_path / f"scheduler-{i}.log").open("w") as log:
            proc = subprocess.Popen(
                [python, "-m", "django", "runscheduler", "--standby-interval", "0.5"],
                env=subprocess_env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        procs[proc.pid] = proc
    try:
        first = wait_for(leader_pid, 30)  # three Django start-ups
        assert first in procs, f"no runscheduler took leadership:\n{logs(tmp_path)}"
        assert wait_for(lambda: fired_after(0), 5), "the leader did not fire"

        # SIGTERM: the leader releases at once and exits 0; a standby takes
        # over within its retry interval, long before the 10 s lease would lapse.
        procs[first].send_signal(signal.SIGTERM)
        assert procs[first].wait(timeout=10) == 0
        assert leader_pid() != first, "the lease outlived the process that held it"
        second = wait_for(lambda: (pid := leader_pid()) not in (None, first) and pid, 5)
        assert second in procs

        # SIGKILL: nothing is released; the last standby fires the next boundary
        # once the lease lapses: within the TTL and a few seconds.
        assert wait_for(lambda: fired_after(0) and leader_pid() == second, 5)
        procs[second].kill()
        procs[second].wait(timeout=5)
        killed_at = time.monotonic()
        before = last_job_id()
        assert wait_for(lambda: fired_after(before), LEADER_TTL_S + 5), "no failover"
        assert time.monotonic() - killed_at < LEADER_TTL_S + 5
        (third,) = set(procs) - {first, second}
        assert leader_pid() == third

        procs[third].send_signal(signal.SIGTERM)
        assert procs[third].wait(timeout=10) == 0
        assert leader_pid() is None
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)
    text = logs(tmp_path)
    assert "scheduler standing by" in text
    assert "scheduler released leadership" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--standby-interval", "0"], "--standby-interval"),
        (["--standby-interval", "nan"], "--standby-interval"),
        (["--database", "nope"], "'nope'"),
    ],
)
def test_runscheduler__refuses_bad_input(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("runscheduler", *args)
