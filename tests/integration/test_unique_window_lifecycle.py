"""What releases a ``unique_for_s`` window besides its end: its dead letter leaving.

A dead-lettered job's window holds nothing while its dead letter is there; once
the dead letter is deleted, purged or requeued, the window must not take the
key back (returning the id of a job that exists nowhere, or of a requeued job
that runs without its key).
"""

from __future__ import annotations

import pytest

from alkstore_django import operations, store
from alkstore_django.models import Job, UniqueWindow
from tests.helpers import live_count

pytestmark = pytest.mark.django_db(transaction=True)


def dead_with_window(queue: str) -> int:
    """Enqueue a keyed job with an hour's window and dead-letter it; return its id."""
    q = store.queue(queue)
    job_id = q.enqueue({}, unique_key="k", unique_for_s=3600)
    assert q.claim_one("w").fail()
    return job_id


@pytest.mark.parametrize(
    "leave",
    [
        pytest.param(lambda job_id: operations.delete_dead([job_id]), id="deleted"),
        pytest.param(lambda job_id: operations.purge_dead("u.gone", older_than_s=0), id="purged"),
        pytest.param(
            lambda job_id: store.queue("u.gone", dead_letter_retention_s=0).sweep_expired(),
            id="retention",
        ),
    ],
)
def test_unique_for_s__a_dead_letter_that_is_gone_leaves_the_key_free(leave):
    dead_id = dead_with_window("u.gone")
    leave(dead_id)

    new_id = store.queue("u.gone").enqueue({}, unique_key="k")

    assert new_id != dead_id
    assert store.get_job(new_id) is not None and live_count("u.gone") == 1
    assert not UniqueWindow.objects.filter(job_id=dead_id).exists()


def test_unique_for_s__a_requeued_dead_letter_holds_its_key_by_no_window():
    dead_id = dead_with_window("u.requeued")
    assert operations.requeue_dead([dead_id]) == 1
    assert store.queue("u.requeued").claim_one("w").ack()  # it runs (keyless) and succeeds

    new_id = store.queue("u.requeued").enqueue({}, unique_key="k")

    assert new_id != dead_id and Job.objects.filter(id=new_id, unique_key="k").exists()
    assert not UniqueWindow.objects.filter(job_id=dead_id).exists()


def test_unique_for_s__deleting_other_dead_letters_keeps_a_succeeded_jobs_window():
    q = store.queue("u.kept")
    held = q.enqueue({}, unique_key="k", unique_for_s=3600)
    assert q.claim_one("w").ack()
    other = dead_with_window("u.other")
    operations.delete_dead([other, held])  # ``held`` is no dead letter: its window stays

    assert q.enqueue({}, unique_key="k") == held
