"""``manage.py alkstore requeue --tag`` and ``retry --tag`` (issue 24)."""

from __future__ import annotations

import subprocess
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from alkstore_django import operations, store
from alkstore_django.errors import InvalidArgument
from alkstore_django.models import DeadJob, Job
from alkstore_django.records import join_tags
from tests.factories import DeadJobFactory

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("alkstore", *args, stdout=out)
    return out.getvalue()


def dead(queue: str, *tags: str) -> int:
    return DeadJobFactory(queue=queue, tags=join_tags(tags)).id


def waiting(queue: str, *tags: str) -> int:
    """Enqueue, claim and retry a job: it waits an hour for its next attempt."""
    q = store.queue(queue)
    q.enqueue({}, tags=list(tags))
    handle = q.claim_one("w")
    assert handle.retry("boom", delay_s=3600)
    return handle.job.id


def live_ids() -> set[int]:
    return set(Job.objects.values_list("id", flat=True))


# --- requeue --tag --------------------------------------------------------------


def test_requeue_tag__moves_the_tagged_dead_letters_of_every_queue():
    a, b = dead("cmd.a", "customer:7", "import"), dead("cmd.b", "customer:7")
    untagged, other, prefix = dead("cmd.a"), dead("cmd.a", "import"), dead("cmd.a", "customer:70")
    out = run("requeue", "--tag", "customer:7")
    assert "Requeued 2 dead letter(s) tagged 'customer:7'." in out
    assert live_ids() == {a, b}
    assert set(DeadJob.objects.values_list("id", flat=True)) == {untagged, other, prefix}
    assert store.get_job(a).tags == ("customer:7", "import")


def test_requeue_tag_and_queue__moves_only_that_queues_tagged_dead_letters():
    a, b = dead("cmd.a", "import"), dead("cmd.b", "import")
    out = run("requeue", "--queue", "cmd.a", "--tag", "import")
    assert "Requeued 1 dead letter(s) tagged 'import' of queue 'cmd.a'." in out
    assert live_ids() == {a}
    assert DeadJob.objects.filter(id=b).exists()


def test_requeue_tag__an_underscore_is_a_literal_not_a_wildcard():
    exact, lookalike = dead("cmd.a", "a_b"), dead("cmd.a", "axb")
    run("requeue", "--tag", "a_b")
    assert live_ids() == {exact}
    assert DeadJob.objects.filter(id=lookalike).exists()


def test_requeue_tag_dry_run__counts_and_moves_nothing():
    dead("cmd.a", "import"), dead("cmd.b", "import"), dead("cmd.a")
    assert run("requeue", "--tag", "import", "--dry-run").strip() == (
        "Would requeue 2 dead letter(s) tagged 'import'."
    )
    assert run("requeue", "--tag", "import", "--queue", "cmd.b", "--dry-run").strip() == (
        "Would requeue 1 dead letter(s) tagged 'import' of queue 'cmd.b'."
    )
    assert DeadJob.objects.count() == 3 and not Job.objects.exists()


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]], ids=["requeue", "dry-run"])
def test_requeue_tag__nothing_tagged_is_an_error(dry_run):
    dead("cmd.a", "import")
    with pytest.raises(CommandError) as caught:
        run("requeue", "--tag", "export", *dry_run)
    assert str(caught.value) == "No dead letter tagged 'export': nothing requeued."
    with pytest.raises(CommandError) as caught:
        run("requeue", "--tag", "import", "--queue", "cmd.b", *dry_run)
    assert str(caught.value) == "No dead letter tagged 'import' in queue 'cmd.b': nothing requeued."
    assert DeadJob.objects.count() == 1


@pytest.mark.parametrize("command", ["requeue", "retry"])
@pytest.mark.parametrize("bad", ["Customer:7", "a,b", ""])
def test_a_bad_tag__is_a_usage_error_naming_it_and_nothing_changes(command, bad):
    dead_id, waiting_id = dead("cmd.a", "import"), waiting("cmd.rn", "import")
    with pytest.raises(CommandError) as caught:
        run(command, "--tag", bad)
    assert f"argument --tag: Invalid tag {bad!r}: expected 1 to 64 characters" in str(caught.value)
    assert DeadJob.objects.filter(id=dead_id).exists()
    assert store.get_job(waiting_id).run_at > store.get_job(waiting_id).enqueued_at


@pytest.mark.parametrize("command", ["requeue", "retry"])
def test_id_and_tag_together__are_refused(command):
    job_id = dead("cmd.a", "import")
    with pytest.raises(CommandError, match="Give --id or --tag, not both"):
        run(command, "--queue", "cmd.a", "--id", str(job_id), "--tag", "import")
    assert DeadJob.objects.filter(id=job_id).exists()


def test_requeue__without_queue_or_tag_is_an_error():
    with pytest.raises(CommandError, match=r"Nothing to requeue: give --queue QUEUE .*--tag TAG"):
        run("requeue")


@pytest.mark.django_db(transaction=True)
def test_requeue_bad_tag__exits_with_a_usage_error_as_a_process(python, subprocess_env):
    done = subprocess.run(
        [python, "-m", "django", "alkstore", "requeue", "--tag", "Bad"],
        env=subprocess_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "argument --tag: Invalid tag 'Bad'" in done.stderr


# --- retry --tag ----------------------------------------------------------------


def test_retry_tag__makes_the_tagged_waiting_jobs_due_now():
    tagged, elsewhere = waiting("cmd.rn", "import"), waiting("cmd.other", "import")
    untagged, lookalike = waiting("cmd.rn"), waiting("cmd.rn", "imports")
    due = store.queue("cmd.rn").enqueue({}, tags=["import"])  # never attempted: not waiting
    out = run("retry", "--tag", "import")
    assert "Made 2 job(s) tagged 'import' due now." in out
    # The never-attempted job was due already; untagged and lookalike still wait.
    assert {h.job.id for h in store.queue("cmd.rn").claim_batch("w", 10)} == {tagged, due}
    assert store.queue("cmd.other").claim_one("w").job.id == elsewhere
    assert {store.get_job(i).attempts for i in (untagged, lookalike)} == {1}


def test_retry_tag_and_queue__only_that_queue():
    waiting("cmd.rn", "import")
    other = waiting("cmd.other", "import")
    out = run("retry", "--tag", "import", "--queue", "cmd.rn")
    assert "Made 1 job(s) tagged 'import' in queue 'cmd.rn' due now." in out
    assert store.queue("cmd.other").claim_one("w") is None
    assert store.get_job(other).state == "pending"


def test_retry_tag__nothing_waiting_with_it_is_an_error():
    waiting("cmd.rn", "import")
    with pytest.raises(CommandError) as caught:
        run("retry", "--tag", "export")
    assert str(caught.value) == "No job tagged 'export' waiting for a retry: nothing retried."
    with pytest.raises(CommandError) as caught:
        run("retry", "--tag", "import", "--queue", "cmd.other")
    assert str(caught.value) == (
        "No job tagged 'import' waiting for a retry in queue 'cmd.other': nothing retried."
    )


# --- the services behind them ---------------------------------------------------


def test_requeue_dead_and_retry_now__take_a_tag_and_narrow_ids_by_it():
    a, b = dead("cmd.a", "import"), dead("cmd.a")
    assert operations.count_dead(tag="import") == 1
    assert operations.requeue_dead([a, b], tag="import") == 1
    assert live_ids() == {a}
    first, second = waiting("cmd.rn", "x"), waiting("cmd.rn")
    assert operations.retry_now([first, second], tag="x") == 1
    assert store.get_job(second).run_at > store.get_job(second).enqueued_at
    assert operations.retry_now(tag="x") == 0  # already due


@pytest.mark.parametrize("call", ["requeue_dead", "retry_now", "count_dead"])
def test_the_services__refuse_a_bad_tag_by_name(call):
    job_id = dead("cmd.a", "import")
    with pytest.raises(InvalidArgument, match="Invalid tag 'IMPORT'"):
        getattr(operations, call)(tag="IMPORT")
    assert DeadJob.objects.filter(id=job_id).exists()
