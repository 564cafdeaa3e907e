"""Tags: validated at enqueue, kept on the job, its dead letter and its result (issue 24)."""

from __future__ import annotations

import threading

import pytest

from alkstore_django import operations, store
from alkstore_django.errors import InvalidArgument
from alkstore_django.models import DeadJob, Job, JobResult
from alkstore_django.validation import MAX_TAGS
from alkstore_django.worker import Worker
from tests.helpers import expire_job

pytestmark = pytest.mark.django_db(transaction=True)

TAGS = ["customer:7", "import"]


def drain(queue: str, pool: str = "threads") -> None:
    Worker([queue], burst=True, concurrency=2, pool=pool).run(threading.Event())


def test_enqueue__stores_the_tags_in_order_and_get_job_returns_them():
    job_id = store.queue("t.record").enqueue({}, tags=TAGS)
    assert store.get_job(job_id).tags == ("customer:7", "import")
    assert Job.objects.get(id=job_id).tags == ",customer:7,import,"
    plain = store.queue("t.record").enqueue({})
    assert store.get_job(plain).tags == ()
    assert Job.objects.get(id=plain).tags is None


def test_enqueue__repeated_tags_are_kept_once_and_none_is_no_tags():
    job_id = store.queue("t.record").enqueue({}, tags=["a", "b", "a"])
    assert store.get_job(job_id).tags == ("a", "b")
    empty = store.queue("t.record").enqueue({}, tags=[])
    assert store.get_job(empty).tags == ()


def test_enqueue_many__tags_every_job():
    ids = store.queue("t.record").enqueue_many([{}, {}, {}], tags=["batch:1"])
    assert [store.get_job(i).tags for i in ids] == [("batch:1",)] * 3


@pytest.mark.parametrize(
    "bad",
    ["Customer:7", "", "a,b", "-lead", "x" * 65, "sp ace", 7, None],
    ids=["upper", "empty", "comma", "dash-first", "too-long", "space", "int", "none"],
)
def test_a_bad_tag__is_refused_by_name_and_nothing_is_written(bad):
    queue = store.queue("t.record")
    with pytest.raises(InvalidArgument) as caught:
        queue.enqueue({}, tags=["ok", bad])
    assert f"Invalid tag {bad!r}" in str(caught.value)
    with pytest.raises(InvalidArgument, match="Invalid tag"):
        queue.enqueue_many([{}, {}], tags=[bad])
    assert not Job.objects.exists()


@pytest.mark.parametrize("bad", ["customer:7", b"x", {"a": 1}, 7])
def test_tags_that_are_not_a_list__are_refused_by_name(bad):
    with pytest.raises(InvalidArgument, match=r"Invalid tags .*expected a list of tags"):
        store.queue("t.record").enqueue({}, tags=bad)
    assert not Job.objects.exists()


def test_more_than_max_tags__is_refused_and_nothing_written():
    with pytest.raises(InvalidArgument, match=f"{MAX_TAGS + 1} tags; expected at most {MAX_TAGS}"):
        store.queue("t.record").enqueue({}, tags=[f"t{n}" for n in range(MAX_TAGS + 1)])
    assert store.queue("t.record").enqueue({}, tags=[f"t{n}" for n in range(MAX_TAGS)])
    assert Job.objects.count() == 1


def test_a_dead_letter__keeps_the_tags_and_a_requeue_brings_them_back():
    job_id = store.queue("t.fail").enqueue("p", tags=TAGS)
    drain("t.fail")
    assert DeadJob.objects.get(id=job_id).tags == ",customer:7,import,"
    dead = store.get_job(job_id)
    assert (dead.state, dead.tags) == ("dead", ("customer:7", "import"))
    assert operations.get_dead(job_id).tags == ("customer:7", "import")
    assert operations.requeue_dead([job_id]) == 1
    live = store.get_job(job_id)
    assert (live.state, live.tags) == ("pending", ("customer:7", "import"))


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_a_succeeded_result__keeps_the_tags(pool):
    # t.noop touches no table: a process-pool child need not reach the test database.
    job_id = store.queue("t.noop").enqueue({}, keep_result_s=60, tags=TAGS)
    drain("t.noop", pool)
    result = store.get_result(job_id)
    assert (result.state, result.tags) == ("succeeded", ("customer:7", "import"))
    assert JobResult.objects.get(job_id=job_id).tags == ",customer:7,import,"


def test_results_of_acked_jobs_in_one_batch__each_keep_their_own_tags():
    queue = store.queue("t.record")
    tagged = queue.enqueue({}, keep_result_s=60, tags=["a"])
    other = queue.enqueue({}, keep_result_s=60, tags=["b", "c"])
    plain = queue.enqueue({}, keep_result_s=60)
    drain("t.record")
    assert store.get_result(tagged).tags == ("a",)
    assert store.get_result(other).tags == ("b", "c")
    assert store.get_result(plain).tags == ()
    assert JobResult.objects.get(job_id=plain).tags is None


def test_a_failed_result__keeps_the_tags():
    job_id = store.queue("t.fail").enqueue("p", keep_result_s=60, tags=TAGS)
    drain("t.fail")
    result = store.get_result(job_id)
    assert (result.state, result.tags) == ("failed", ("customer:7", "import"))


def test_a_cancelled_result__keeps_the_tags():
    queue = store.queue("t.record")
    first, second = queue.enqueue_many([{}, {}], keep_result_s=60, tags=["import"])
    assert queue.cancel(first) is True
    assert operations.cancel_jobs([second]) == 1
    for job_id in (first, second):
        result = store.get_result(job_id)
        assert (result.state, result.tags) == ("cancelled", ("import",))


def test_the_dead_letter_fallback_result__reads_the_dead_letters_tags():
    job_id = store.queue("t.record").enqueue({}, keep_result_s=60, expires_s=60, tags=TAGS)
    expire_job(job_id)
    store.queue("t.record").sweep_expired()
    assert not JobResult.objects.filter(job_id=job_id).exists()  # no outcome wrote one
    result = store.get_result(job_id)
    assert (result.state, result.error, result.tags) == (
        "failed",
        "expired",
        ("customer:7", "import"),
    )
