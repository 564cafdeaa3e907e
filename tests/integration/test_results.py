"""Kept results: ``get_result`` after success, failure, cancel, requeue, expiry; off by default."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.test import override_settings

from alkstore_django import operations, results, store
from alkstore_django.errors import InvalidArgument
from alkstore_django.models import Job, JobResult
from alkstore_django.testing import run_ready_jobs
from alkstore_django.worker import Worker
from tests.helpers import ROUTING, db_now, expire_job, expire_result, make_due, runworker
from tests.testapp.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def drain(queue: str, **kwargs) -> Worker:
    worker = Worker([queue], burst=True, concurrency=2, **kwargs)
    worker.run(threading.Event())
    return worker


def test_get_result__after_success_holds_the_return_value_attempts_and_times():
    job_id = store.queue("t.record").enqueue({}, keep_result_s=3600)
    assert store.get_job(job_id).keep_result_s == 3600
    assert store.get_result(job_id) is None  # still live: no result yet
    before = db_now()
    drain("t.record")
    after = db_now()
    result = store.get_result(job_id)
    assert (result.job_id, result.queue, result.state) == (job_id, "t.record", "succeeded")
    assert (result.value, result.error, result.attempts) == ({"ok": job_id}, None, 1)
    assert before <= result.finished_at <= after
    assert result.expires_at - result.finished_at == timedelta(seconds=3600)
    assert store.get_job(job_id) is None  # the job itself is gone, as any acked job


def test_get_result__after_a_retried_then_dead_job_is_failed_with_its_error():
    job_id = store.queue("t.raise", retry_base_s=0).enqueue("p", max_attempts=2, keep_result_s=60)
    drain("t.raise")
    result = store.get_result(job_id)
    assert (result.state, result.value, result.attempts) == ("failed", None, 2)
    assert result.error == "ValueError: boom p"
    assert Run.objects.filter(job_id=job_id).count() == 2


def test_get_result__after_fail_is_failed_at_once():
    job_id = store.queue("t.fail").enqueue("p", keep_result_s=60)
    drain("t.fail")
    result = store.get_result(job_id)
    assert (result.state, result.error, result.attempts) == ("failed", "refused: bad input", 1)


def test_get_result__of_a_job_dead_lettered_by_the_expiry_sweep_reads_its_dead_letter():
    job_id = store.queue("t.record").enqueue({}, keep_result_s=60, expires_s=60)
    expire_job(job_id)
    store.queue("t.record").sweep_expired()
    result = store.get_result(job_id)
    assert (result.state, result.error, result.attempts, result.value) == (
        "failed",
        "expired",
        0,
        None,
    )
    assert result.expires_at - result.finished_at == timedelta(seconds=60)


def test_get_result__none_once_expired_and_prune_deletes_it():
    kept, young = store.queue("t.record").enqueue_many([{}, {}], keep_result_s=60)
    drain("t.record")
    expire_result(kept)
    assert store.get_result(kept) is None
    assert store.get_result(young) is not None
    assert results.prune(store) == 1
    assert list(JobResult.objects.values_list("job_id", flat=True)) == [young]
    assert results.prune(store) == 0


def test_prune__is_run_by_the_workers_upkeep():
    job_id = store.queue("t.record").enqueue({}, keep_result_s=60)
    drain("t.record")
    expire_result(job_id)
    drain("t.record")
    assert not JobResult.objects.exists()


def test_a_tiny_keep_result_s__expires_by_itself():
    job_id = store.queue("t.record").enqueue({}, keep_result_s=0.001)
    drain("t.record")
    assert Run.objects.filter(job_id=job_id).exists()
    assert store.get_result(job_id) is None


def test_without_keep_result_s__nothing_is_kept():
    job_id = store.queue("t.record").enqueue({})
    assert store.get_job(job_id).keep_result_s is None
    drain("t.record")
    assert Run.objects.filter(job_id=job_id).exists()
    assert store.get_result(job_id) is None
    assert not JobResult.objects.exists()
    assert store.get_result(2**62) is None  # never a job


def test_the_queue_option__keeps_every_job_of_the_handle():
    queue = store.queue("t.record", keep_result_s=60)
    job_id = queue.enqueue({})
    plain = store.queue("t.record").enqueue({})
    assert store.get_job(job_id).keep_result_s == 60
    assert store.get_job(plain).keep_result_s is None
    drain("t.record")
    assert store.get_result(job_id).value == {"ok": job_id}
    assert store.get_result(plain) is None


@override_settings(ALKSTORE={**ROUTING, "QUEUES": {"t.record": {"keep_result_s": 120}}})
def test_the_queue_option_in_settings__keeps_results_and_a_call_overrides_it():
    kept = store.queue("t.record").enqueue({})
    shorter = store.queue("t.record").enqueue({}, keep_result_s=5)
    assert (store.get_job(kept).keep_result_s, store.get_job(shorter).keep_result_s) == (120, 5)
    drain("t.record")
    result = store.get_result(shorter)
    assert result.expires_at - result.finished_at == timedelta(seconds=5)


@pytest.mark.django_db
@pytest.mark.parametrize("keep", [0, -1, "60", float("nan"), True])
def test_keep_result_s__refuses_what_is_not_a_positive_duration(keep):
    with pytest.raises(InvalidArgument, match="keep_result_s"):
        store.queue("t.record").enqueue({}, keep_result_s=keep)
    with pytest.raises(InvalidArgument, match="keep_result_s"):
        store.queue("t.record", keep_result_s=keep)
    assert not Job.objects.exists()


def test_enqueue_many__with_keep_result_s_keeps_each_jobs_result():
    ids = store.queue("t.record").enqueue_many([{}] * 5, keep_result_s=60)
    assert {store.get_job(i).keep_result_s for i in ids} == {60}
    drain("t.record")
    assert [store.get_result(i).value for i in ids] == [{"ok": i} for i in ids]


def test_a_unique_enqueue__marks_only_the_job_it_created():
    queue = store.queue("t.record")
    holder = queue.enqueue({}, unique_key="k")
    assert queue.enqueue({}, unique_key="k", keep_result_s=60) == holder
    assert store.get_job(holder).keep_result_s is None
    first = queue.enqueue({}, unique_key="other", keep_result_s=60)
    assert store.get_job(first).keep_result_s == 60
    ids = queue.enqueue_many([{}, {}], unique_keys=["k", "new"], keep_result_s=30)
    assert ids[0] == holder
    assert store.get_job(holder).keep_result_s is None
    assert store.get_job(ids[1]).keep_result_s == 30
    drain("t.record")
    assert store.get_result(holder) is None
    assert store.get_result(ids[1]).value == {"ok": ids[1]}


def test_cancel__of_a_kept_job_keeps_cancelled():
    queue = store.queue("t.record")
    job_id, other = queue.enqueue_many([{}, {}], keep_result_s=60)
    assert queue.cancel(job_id) is True
    result = store.get_result(job_id)
    assert (result.state, result.error, result.attempts, result.value) == (
        "cancelled",
        "cancelled",
        0,
        None,
    )
    assert operations.cancel_jobs([other]) == 1
    assert store.get_result(other).state == "cancelled"


def test_requeue__of_a_failed_kept_job_forgets_its_result_until_it_ends_again():
    job_id = store.queue("t.raise").enqueue("p", max_attempts=1, keep_result_s=60)
    drain("t.raise")
    assert store.get_result(job_id).state == "failed"
    assert operations.requeue_dead([job_id]) == 1
    assert store.get_result(job_id) is None
    assert not JobResult.objects.filter(job_id=job_id).exists()
    assert store.get_job(job_id).keep_result_s == 60
    drain("t.raise")
    result = store.get_result(job_id)
    assert (result.state, result.attempts) == ("failed", 1)
    assert Run.objects.filter(job_id=job_id).count() == 2


def test_a_return_value_that_is_not_json__fails_the_attempt_and_the_job_is_retried():
    queue = store.queue("t.wf", retry_base_s=60)
    job_id = queue.enqueue({"bad_return": True}, keep_result_s=60, max_attempts=2)
    assert drain("t.wf").stats.acked == 0
    job = store.get_job(job_id)
    assert (job.state, job.attempts) == ("pending", 1)  # waiting for its retry
    assert job.last_error.startswith("the ack outcome could not be recorded: PayloadError: ")
    assert "Return value" in job.last_error
    assert store.get_result(job_id) is None
    make_due(job_id)
    drain("t.wf")
    dead = store.get_job(job_id)
    assert (dead.state, dead.attempts, dead.last_error) == ("dead", 2, job.last_error)
    result = store.get_result(job_id)
    assert (result.state, result.error, result.value) == ("failed", job.last_error, None)
    assert Run.objects.filter(job_id=job_id).count() == 2


def test_a_return_value_that_is_not_json__is_not_checked_when_nothing_keeps_it():
    job_id = store.queue("t.wf").enqueue({"bad_return": True})
    assert drain("t.wf").stats.acked == 1
    assert store.get_job(job_id) is None


def test_the_process_pool__keeps_the_value_the_child_returned(subprocess_env):
    job_id = store.queue("t.record").enqueue({}, keep_result_s=60)
    code, out = runworker(
        subprocess_env, "--queue", "t.record", "--pool", "processes", "--concurrency", "1",
        "--burst",
    )  # fmt: skip
    assert code == 0, out
    assert "outcome=acked" in out
    assert store.get_result(job_id).value == {"ok": job_id}


def test_the_process_pool__a_return_value_that_is_not_json_fails_with_the_threads_error(
    subprocess_env,
):
    job_id = store.queue("t.wf").enqueue({"bad_return": True}, keep_result_s=60, max_attempts=1)
    code, out = runworker(
        subprocess_env, "--queue", "t.wf", "--pool", "processes", "--concurrency", "1", "--burst"
    )
    assert code == 0, out
    dead = store.get_job(job_id)
    assert dead.state == "dead"
    assert dead.last_error.startswith("the ack outcome could not be recorded: PayloadError: ")
    assert "Return value" in dead.last_error
    assert store.get_result(job_id).error == dead.last_error


@pytest.mark.django_db
def test_run_ready_jobs__keeps_the_result_inside_the_tests_transaction():
    job_id = store.queue("t.record").enqueue({}, keep_result_s=60)
    runs = run_ready_jobs(["t.record"])
    assert [run.job_id for run in runs] == [job_id]
    assert store.get_result(job_id).value == {"ok": job_id}


def test_a_drain_of_kept_jobs__writes_each_result_once_and_a_bad_value_fails_alone():
    # The worker writes a round's kept acks together; one value that is not JSON
    # among them fails its own attempt and nothing else.
    queue = store.queue("t.wf", keep_result_s=600, max_attempts=1)
    good = queue.enqueue_many([{"n": n} for n in range(60)])
    bad = queue.enqueue({"bad_return": True})
    worker = Worker(["t.wf"], burst=True, concurrency=8)
    worker.run(threading.Event())
    assert worker.stats.acked == 60
    kept = {r.job_id: r for r in JobResult.objects.all()}
    assert sorted(kept) == sorted([*good, bad])
    assert {kept[job_id].state for job_id in good} == {"succeeded"}
    assert all(kept[job_id].value["step"] is None for job_id in good)
    assert kept[bad].state == "failed"
    assert "Return value" in kept[bad].error
    assert Run.objects.filter(job_id__in=good).count() == 60
