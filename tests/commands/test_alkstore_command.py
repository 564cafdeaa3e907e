"""``manage.py alkstore``: stats, requeue and purge-dead."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from alkstore_django import store
from alkstore_django.models import DeadJob, Job
from tests.factories import DeadJobFactory

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("alkstore", *args, stdout=out)
    return out.getvalue()


def test_stats__prints_a_table_per_queue():
    store.queue("cmd.a").enqueue_many([1, 2])
    DeadJobFactory.create_batch(3, queue="cmd.b")
    lines = run("stats").splitlines()
    assert lines[0].split() == [
        "queue", "pending", "scheduled", "processing", "overdue", "dead", "oldest", "pending",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["cmd.a"][:5] == ["2", "0", "0", "0", "0"]
    assert rows["cmd.b"][:5] == ["0", "0", "0", "0", "3"] and rows["cmd.b"][5] == "-"


def test_stats__json_for_machines():
    store.queue("cmd.a").enqueue(1)
    data = {row["queue"]: row for row in json.loads(run("stats", "--json"))}
    assert data["cmd.a"]["pending"] == 1
    assert set(data["cmd.a"]) >= {"scheduled", "processing", "overdue", "dead"}
    assert data["cmd.a"]["oldest_pending_age_s"] >= 0


def test_requeue__moves_the_queues_dead_letters_with_progress():
    DeadJobFactory.create_batch(3, queue="cmd.r")
    other = DeadJobFactory(queue="cmd.other")
    out = run("requeue", "--queue", "cmd.r")
    assert "requeued 3" in out
    assert "Requeued 3 dead letter(s) of queue 'cmd.r'." in out
    assert Job.objects.filter(queue="cmd.r", state="pending", attempts=0).count() == 3
    assert list(DeadJob.objects.values_list("id", flat=True)) == [other.id]


def test_requeue__only_the_given_ids():
    first, second, third = DeadJobFactory.create_batch(3, queue="cmd.r")
    out = run("requeue", "--queue", "cmd.r", "--id", str(first.id), "--id", str(third.id))
    assert "Requeued 2 dead letter(s)" in out
    assert sorted(Job.objects.values_list("id", flat=True)) == [first.id, third.id]
    assert list(DeadJob.objects.values_list("id", flat=True)) == [second.id]


def test_purge_dead__deletes_older_than_the_age():
    DeadJobFactory.create_batch(2, queue="cmd.p", died_at=timezone.now() - timedelta(days=8))
    young = DeadJobFactory(queue="cmd.p")
    out = run("purge-dead", "--queue", "cmd.p", "--older-than", "7d")
    assert "deleted 2" in out
    assert "Deleted 2 dead letter(s) of queue 'cmd.p' older than 7d." in out
    assert list(DeadJob.objects.values_list("id", flat=True)) == [young.id]


@pytest.mark.parametrize("age", ["7", "7w", "1.5h", "-3d", "soon"])
def test_purge_dead__bad_age_is_a_command_error_naming_the_value(age):
    with pytest.raises(CommandError, match=f"Invalid --older-than '{age}'"):
        run("purge-dead", "--queue", "cmd.p", f"--older-than={age}")


def test_requeue__reserved_or_bad_queue_names_are_command_errors():
    with pytest.raises(CommandError, match="queue name ''"):
        run("requeue", "--queue", "")


@pytest.mark.django_db(transaction=True)
def test_command__runs_as_a_process_and_exits_nonzero_on_bad_input(python, subprocess_env):
    DeadJobFactory(queue="cmd.proc")
    manage = ["-m", "django", "alkstore"]
    ok = subprocess.run(
        [python, *manage, "stats", "--json"], env=subprocess_env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert any(row["queue"] == "cmd.proc" for row in json.loads(ok.stdout))
    bad = subprocess.run(
        [python, *manage, "purge-dead", "--queue", "cmd.proc", "--older-than", "7w"],
        env=subprocess_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 1
    assert "Invalid --older-than '7w'" in bad.stderr
