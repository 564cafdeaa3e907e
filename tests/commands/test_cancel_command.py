"""``manage.py alkstore cancel --id N``: one line per id, pending deleted, running asked."""

from __future__ import annotations

import subprocess
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from alkstore_django import store
from alkstore_django.models import Job

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("alkstore", *args, stdout=out)
    return out.getvalue()


def test_cancel__says_per_id_cancelled_requested_or_not_found():
    queue = store.queue("cmd.cancel")
    running = queue.enqueue({})
    queue.claim_one("w1")
    pending = queue.enqueue({})
    lines = run("cancel", "--id", str(pending), "--id", str(running), str(10**12)).splitlines()
    assert lines == [
        f"job {pending}: cancelled",
        f"job {running}: cancel requested (running: its worker stops it)",
        f"job {10**12}: not found (finished, dead-lettered or unknown)",
    ]
    assert not Job.objects.filter(id=pending).exists()
    assert Job.objects.get(id=running).cancel_requested_at is not None


def test_cancel__an_id_given_twice_is_cancelled_once():
    job_id = store.queue("cmd.cancel").enqueue({})
    assert run("cancel", "--id", str(job_id), str(job_id)).splitlines() == [
        f"job {job_id}: cancelled"
    ]


def test_cancel__without_an_id_is_a_usage_error_and_changes_nothing():
    job_id = store.queue("cmd.cancel").enqueue({})
    with pytest.raises(CommandError, match="--id N"):
        run("cancel")
    assert Job.objects.filter(id=job_id).exists()


def test_cancel__an_id_out_of_range_is_refused_before_anything_is_cancelled():
    job_id = store.queue("cmd.cancel").enqueue({})
    with pytest.raises(CommandError, match=r"Invalid job id 9223372036854775808"):
        run("cancel", "--id", str(job_id), str(2**63))
    assert Job.objects.filter(id=job_id).exists()


@pytest.mark.django_db(transaction=True)
def test_cancel__from_the_command_line_exits_zero(subprocess_env, python):
    job_id = store.queue("cmd.cancel").enqueue({})
    done = subprocess.run(
        [python, "-m", "django", "alkstore", "cancel", "--id", str(job_id), "-v", "0"],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"job {job_id}: cancelled" in done.stdout
    assert not Job.objects.filter(id=job_id).exists()
