"""``manage.py alkstore``: stats, dead list/show, requeue, purge-dead and schedules."""

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
        "state",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["cmd.a"][:5] == ["2", "0", "0", "0", "0"]
    assert rows["cmd.b"][:5] == ["0", "0", "0", "0", "3"] and rows["cmd.b"][5] == "-"
    assert rows["cmd.a"][6] == "running"


def test_pause_and_resume__change_the_queue_once_and_say_so():
    q = store.queue("cmd.p")
    q.enqueue(1)
    store.queue("cmd.a").enqueue(1)
    assert "Paused queue 'cmd.p'" in run("pause", "cmd.p")
    assert "was already paused" in run("pause", "cmd.p")
    assert q.claim_one("w") is None
    rows = {line.split()[0]: line.split()[1:] for line in run("stats").splitlines()[2:]}
    assert rows["cmd.p"][6] == "paused"
    data = {row["queue"]: row for row in json.loads(run("stats", "--json"))}
    assert (data["cmd.p"]["paused"], data["cmd.a"]["paused"]) == (True, False)
    assert "Resumed queue 'cmd.p'" in run("resume", "cmd.p")
    assert "was not paused" in run("resume", "cmd.p")
    assert q.claim_one("w") is not None


def test_pause__refuses_a_bad_queue_name_by_name():
    with pytest.raises(CommandError, match="Invalid queue name ''"):
        run("pause", "")


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


# --- dead list / dead show -------------------------------------------------------


def test_dead_list__newest_first_with_the_errors_last_line_and_died_at_to_the_second():
    now = timezone.now().replace(microsecond=0)
    old = DeadJobFactory(queue="cmd.d", died_at=now - timedelta(hours=1), attempts=5)
    new = DeadJobFactory(
        queue="cmd.d",
        died_at=now,
        last_error="Traceback (most recent call last):\n  x\nKeyError: 'k'",
    )
    DeadJobFactory(queue="cmd.other", died_at=now - timedelta(minutes=1))
    lines = run("dead", "list", "--queue", "cmd.d").splitlines()
    assert lines[0].split() == ["id", "queue", "attempts", "died", "at", "error"]
    assert [line.split()[0] for line in lines[2:]] == [str(new.id), str(old.id)]
    assert lines[2].endswith("KeyError: 'k'")
    assert f"{timezone.localtime(now):%Y-%m-%d %H:%M:%S}" in lines[2]
    assert "5/3" in lines[3]


def test_dead_list__limit_and_json_for_machines():
    DeadJobFactory.create_batch(3, queue="cmd.d", payload={"to": "a@example.com"})
    rows = json.loads(run("dead", "list", "--limit", "2", "--json"))
    assert len(rows) == 2
    assert rows[0]["state"] == "dead" and rows[0]["payload"] == {"to": "a@example.com"}
    assert rows[0]["died_at"].endswith("Z") or "+00:00" in rows[0]["died_at"]


def test_dead_list__says_so_when_there_are_none():
    assert (
        run("dead", "list", "--queue", "cmd.none").strip() == "No dead letters in queue 'cmd.none'."
    )


def test_dead_show__prints_stamps_payload_and_the_full_error():
    dead = DeadJobFactory(payload={"to": "a@example.com"}, last_error="line 1\nValueError: two")
    out = run("dead", "show", str(dead.id))
    assert f"id           {dead.id}" in out
    assert '"to": "a@example.com"' in out
    assert out.rstrip().endswith("line 1\nValueError: two")
    data = json.loads(run("dead", "show", str(dead.id), "--json"))
    assert (data["id"], data["last_error"]) == (dead.id, "line 1\nValueError: two")


def test_dead_show__an_unknown_id_is_a_command_error():
    job_id = store.queue("cmd.live").enqueue(1)  # live, not dead
    with pytest.raises(CommandError, match=f"No dead letter with id {job_id}."):
        run("dead", "show", str(job_id))


# --- requeue: dry run, nothing matched --------------------------------------------


def test_requeue_dry_run__says_how_many_and_moves_nothing():
    first, _ = DeadJobFactory.create_batch(2, queue="cmd.r")
    assert run("requeue", "--queue", "cmd.r", "--dry-run").strip() == (
        "Would requeue 2 dead letter(s) of queue 'cmd.r'."
    )
    out = run("requeue", "--queue", "cmd.r", "--id", str(first.id), "--dry-run")
    assert out.strip() == "Would requeue 1 dead letter(s) of queue 'cmd.r'."
    assert DeadJob.objects.count() == 2 and not Job.objects.exists()


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["requeue", "dry-run"])
def test_requeue__a_queue_without_dead_letters_is_an_error_naming_those_with_some(dry_run):
    DeadJobFactory(queue="cmd.r")
    with pytest.raises(CommandError) as caught:
        run("requeue", "--queue", "cmd.typo", *dry_run)
    assert str(caught.value) == (
        "Queue 'cmd.typo' has no dead letters: nothing requeued. Queues with dead letters: 'cmd.r'."
    )


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["requeue", "dry-run"])
def test_requeue__an_unknown_id_is_an_error_and_nothing_moves(dry_run):
    known = DeadJobFactory(queue="cmd.r")
    elsewhere = DeadJobFactory(queue="cmd.other")
    with pytest.raises(CommandError) as caught:
        run(
            "requeue", "--queue", "cmd.r", "--id", str(known.id), "999", str(elsewhere.id), *dry_run
        )
    assert str(caught.value) == (
        f"No dead letter 999, {elsewhere.id} in queue 'cmd.r': nothing requeued."
    )
    assert DeadJob.objects.count() == 2 and not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_requeue__nothing_matched_exits_nonzero_as_a_process(python, subprocess_env):
    done = subprocess.run(
        [python, "-m", "django", "alkstore", "requeue", "--queue", "cmd.none", "--id", "5"],
        env=subprocess_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "No dead letter 5 in queue 'cmd.none': nothing requeued." in done.stderr
    assert "Requeued 0" not in done.stdout


def test_schedules__lists_next_runs_in_zone_and_utc_origin_state_and_refusals():
    from alkstore_django.models import Schedule

    store.schedule("report", "@cron 0 9 * * *", "reports", zone="Asia/Tokyo", misfire="skip")
    store.schedule("beat", "@every 1h", "beats")
    Schedule.objects.filter(name="beat").update(
        enabled=False,
        refused_from=Schedule.objects.get(name="beat").next_run_at,
        last_error="PayloadError: Payload of 400 bytes is larger than MAX_PAYLOAD_BYTES (100).",
    )

    lines = run("schedules").splitlines()

    assert lines[0].split()[:5] == ["name", "spec", "zone", "misfire", "queue"]
    beat, report = lines[2], lines[3]
    assert beat.startswith("beat") and "paused" in beat and "REFUSED since" in beat
    assert "larger than MAX_PAYLOAD_BYTES (100)." in beat
    assert "Asia/Tokyo" in report and "skip" in report and "active" in report
    assert " 09:00:00 " in report  # next run in the schedule's zone
    assert " 00:00:00 " in report  # 09:00 in Tokyo is midnight UTC


def test_schedules__json_for_machines_and_none_said_so():
    assert run("schedules") == "No schedules.\n"
    store.schedule("report", "@cron 0 9 * * *", "reports", zone="Asia/Tokyo")

    (row,) = json.loads(run("schedules", "--json"))

    assert (row["name"], row["zone"], row["misfire"], row["declared"]) == (
        "report",
        "Asia/Tokyo",
        "all",
        False,
    )
    assert row["next_run_in_zone"].endswith("T09:00:00+09:00")
    assert row["last_error"] is None and row["refused_from"] is None


def retry_waiting(queue: str) -> int:
    """Enqueue, claim and retry a job of ``queue``: it waits an hour for its next attempt."""
    q = store.queue(queue)
    q.enqueue({})
    handle = q.claim_one("w")
    assert handle.retry("boom", delay_s=3600)
    return handle.job.id


def test_retry__by_id_makes_the_jobs_due_now():
    first, second = retry_waiting("cmd.rn"), retry_waiting("cmd.rn")
    out = run("retry", "--id", str(first))
    assert "Made 1 job(s) due now." in out
    assert store.queue("cmd.rn").claim_one("w").job.id == first
    assert store.queue("cmd.rn").claim_one("w") is None
    assert Job.objects.get(id=second).state == "pending"


def test_retry__by_queue():
    retry_waiting("cmd.rn"), retry_waiting("cmd.rn")
    other = retry_waiting("cmd.other")
    assert "Made 2 job(s) in queue 'cmd.rn' due now." in run("retry", "--queue", "cmd.rn")
    assert len(store.queue("cmd.rn").claim_batch("w", 5)) == 2
    assert store.queue("cmd.other").claim_one("w") is None
    assert Job.objects.get(id=other).attempts == 1


def test_retry__an_unknown_id_is_an_error_and_nothing_changes():
    waiting = retry_waiting("cmd.rn")
    with pytest.raises(CommandError) as caught:
        run("retry", "--id", str(waiting), "--id", "999")
    assert str(caught.value) == (
        "No job 999 waiting for a retry (unknown, running, due already, or never attempted): "
        "nothing retried."
    )
    assert store.queue("cmd.rn").claim_one("w") is None


def test_retry__a_queue_with_nothing_waiting_or_no_selection_is_an_error():
    with pytest.raises(CommandError, match=r"No job waiting for a retry in queue 'cmd\.none'"):
        run("retry", "--queue", "cmd.none")
    with pytest.raises(CommandError, match="Nothing to retry: give --id"):
        run("retry")


@pytest.mark.django_db(transaction=True)
def test_retry__an_unknown_id_exits_nonzero_as_a_process(python, subprocess_env):
    done = subprocess.run(
        [python, "-m", "django", "alkstore", "retry", "--id", "5"],
        env=subprocess_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "No job 5 waiting for a retry" in done.stderr
    assert "Made 0" not in done.stdout
