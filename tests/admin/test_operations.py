"""The operators' services behind the admin and the command."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from alkstore_django import operations, overview, store
from alkstore_django.errors import InvalidArgument
from alkstore_django.models import DeadJob, Job, OutcomeMinute
from alkstore_django.throughput import prune_throughput, recent_throughput, record_throughput
from tests.factories import DeadJobFactory

pytestmark = pytest.mark.django_db


def test_requeue_dead__keeps_id_and_error_resets_attempts_due_now():
    dead = DeadJobFactory(queue="r.q", attempts=3, last_error="boom", priority=4)
    assert operations.requeue_dead([dead.id]) == 1
    job = store.get_job(dead.id)
    assert (job.state, job.attempts, job.last_error, job.priority) == ("pending", 0, "boom", 4)
    assert abs(job.run_at - store.dialect.database_now()) < timedelta(seconds=5)
    handle = store.queue("r.q").claim_one("w")
    assert handle is not None and handle.job.id == dead.id and handle.job.attempts == 1


def test_requeue_dead__drops_a_passed_expiry_keeps_a_future_one():
    past = DeadJobFactory(expires_at=timezone.now() - timedelta(hours=1), last_error="expired")
    future = DeadJobFactory(expires_at=timezone.now() + timedelta(hours=1))
    operations.requeue_dead([past.id, future.id])
    assert Job.objects.get(id=past.id).expires_at is None
    assert Job.objects.get(id=future.id).expires_at is not None


def test_requeue_dead__whole_queue_in_batches_with_progress():
    DeadJobFactory.create_batch(7, queue="big.q")
    other = DeadJobFactory(queue="other.q")
    seen: list[int] = []
    assert operations.requeue_dead(queue="big.q", batch_size=3, progress=seen.append) == 7
    assert seen == [3, 6, 7]
    assert Job.objects.filter(queue="big.q", state="pending").count() == 7
    assert list(DeadJob.objects.values_list("id", flat=True)) == [other.id]


def test_requeue_dead__ids_restricted_to_queue():
    mine = DeadJobFactory(queue="a.q")
    theirs = DeadJobFactory(queue="b.q")
    assert operations.requeue_dead([mine.id, theirs.id], queue="a.q") == 1
    assert DeadJob.objects.filter(id=theirs.id).exists()


def test_requeue_dead__unknown_ids_move_nothing():
    assert operations.requeue_dead([123456789]) == 0


def test_requeue_dead__needs_ids_or_queue():
    with pytest.raises(InvalidArgument):
        operations.requeue_dead()


def test_requeue_dead__is_one_statement_per_batch_not_per_row(django_assert_max_num_queries):
    dead = DeadJobFactory.create_batch(50, queue="n.q")
    # MariaDB's requeue takes 8; the release of their unique windows is one more per
    # batch, and so are the forgetting of kept results and the resume of workflow steps;
    # inside the test's transaction its atomic block is a savepoint (two more).
    with django_assert_max_num_queries(13):
        assert operations.requeue_dead([d.id for d in dead]) == 50


def test_delete_dead__deletes_only_the_ids():
    doomed = DeadJobFactory.create_batch(2)
    kept = DeadJobFactory()
    assert operations.delete_dead([d.id for d in doomed]) == 2
    assert list(DeadJob.objects.values_list("id", flat=True)) == [kept.id]


def test_purge_dead__deletes_older_than_cutoff_in_batches():
    old = timezone.now() - timedelta(days=8)
    DeadJobFactory.create_batch(5, queue="p.q", died_at=old)
    young = DeadJobFactory(queue="p.q")
    elsewhere = DeadJobFactory(queue="x.q", died_at=old)
    seen: list[int] = []
    assert operations.purge_dead("p.q", 7 * 86400, batch_size=2, progress=seen.append) == 5
    assert seen == [2, 4, 5]
    assert sorted(DeadJob.objects.values_list("id", flat=True)) == sorted([young.id, elsewhere.id])


def test_cancel_jobs__deletes_pending_and_processing():
    queue = store.queue("c.q")
    ids = queue.enqueue_many([1, 2, 3])
    queue.claim_one("w")
    assert operations.cancel_jobs(ids[:2]) == 2
    assert list(Job.objects.values_list("id", flat=True)) == [ids[2]]


def test_queue_overview__counts_every_queue_in_grouped_queries(django_assert_max_num_queries):
    store.queue("o.a").enqueue_many([1, 2])
    store.queue("o.b").enqueue(1, delay_s=600)
    DeadJobFactory.create_batch(3, queue="o.c")
    # The clock, three grouped counts, the live workers, recent time-outs and the paused queues.
    with django_assert_max_num_queries(7):
        stats = {s.queue: s for s in overview.queue_overview()}
    assert (stats["o.a"].pending, stats["o.a"].dead) == (2, 0)
    assert stats["o.a"].oldest_pending_age_s is not None
    assert (stats["o.b"].pending, stats["o.b"].scheduled) == (0, 1)
    assert stats["o.b"].oldest_pending_age_s is None
    assert stats["o.c"].dead == 3


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("15m", 900), ("12h", 43200), ("7d", 604800)]
)
def test_parse_age__accepts_units(text, seconds):
    assert operations.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["7", "7w", "-1d", "0d", "1.5h", "", "7 d"])
def test_parse_age__refuses_anything_else_naming_the_value(text):
    with pytest.raises(InvalidArgument, match=repr(text).replace("\\", "\\\\").replace(".", r"\.")):
        operations.parse_age(text)


def test_record_throughput__adds_to_the_current_minute_in_one_upsert(django_assert_num_queries):
    record_throughput(connection.alias, {"m.q": (1, 0, 0)})
    with django_assert_num_queries(1):
        record_throughput(connection.alias, {"m.q": (2, 1, 1), "n.q": (1, 0, 0)})
    rows = {r.queue: r for r in OutcomeMinute.objects.all()}
    assert (rows["m.q"].acked, rows["m.q"].retried, rows["m.q"].dead) == (3, 1, 1)
    assert rows["n.q"].acked == 1
    assert rows["m.q"].minute.second == 0 and rows["m.q"].minute.microsecond == 0


def test_record_throughput__skips_zeros_and_refuses_negative_counts():
    record_throughput(connection.alias, {"z.q": (0, 0, 0)})
    assert not OutcomeMinute.objects.exists()
    with pytest.raises(InvalidArgument):
        record_throughput(connection.alias, {"z.q": (-1, 0, 0)})


def test_recent_throughput__zero_fills_the_hour_and_counts_dead_from_died_at():
    record_throughput(connection.alias, {"h.q": (4, 0, 0)})
    DeadJobFactory(queue="h.q", died_at=timezone.now())
    DeadJobFactory(queue="h.q", died_at=timezone.now() - timedelta(hours=2))
    buckets = recent_throughput(connection.alias, 60)
    assert len(buckets) == 60
    assert sum(b.acked for b in buckets) == 4
    assert sum(b.dead for b in buckets) == 1
    assert buckets[-1].minute > buckets[0].minute


def test_prune_throughput__drops_rows_older_than_a_day():
    OutcomeMinute.objects.create(queue="old.q", minute=timezone.now() - timedelta(days=2), acked=1)
    record_throughput(connection.alias, {"new.q": (1, 0, 0)})
    assert prune_throughput(connection.alias) == 1
    assert list(OutcomeMinute.objects.values_list("queue", flat=True)) == ["new.q"]


def test_dead_letter_queues__lists_each_queue_once_sorted():
    DeadJobFactory.create_batch(3, queue="q.b")
    DeadJobFactory(queue="q.a")
    assert operations.dead_letter_queues() == ["q.a", "q.b"]


def test_list_dead__newest_first_limited_and_by_queue():
    now = timezone.now()
    old = DeadJobFactory(queue="l.q", died_at=now - timedelta(minutes=2))
    new = DeadJobFactory(queue="l.q", died_at=now)
    DeadJobFactory(queue="l.other", died_at=now - timedelta(minutes=1))
    assert [j.id for j in operations.list_dead(queue="l.q")] == [new.id, old.id]
    assert [j.queue for j in operations.list_dead(limit=2)] == ["l.q", "l.other"]
    assert {j.state for j in operations.list_dead()} == {"dead"}


@pytest.mark.parametrize("limit", [0, 10_001, "5", True])
def test_list_dead__bad_limit_is_refused_naming_it(limit):
    with pytest.raises(InvalidArgument, match=f"Invalid limit {limit!r}"):
        operations.list_dead(limit=limit)


def test_get_dead__only_dead_letters():
    dead = DeadJobFactory()
    live = store.queue("g.q").enqueue(1)
    assert operations.get_dead(dead.id).id == dead.id
    assert operations.get_dead(live) is None


def test_count_and_missing_dead__what_a_requeue_would_find():
    a, b = DeadJobFactory.create_batch(2, queue="c.q")
    other = DeadJobFactory(queue="c.other")
    assert operations.count_dead("c.q") == 2
    assert operations.count_dead("c.none") == 0
    assert operations.missing_dead([a.id, b.id], queue="c.q") == []
    assert operations.missing_dead([other.id, 5, a.id], queue="c.q") == [5, other.id]
    assert operations.missing_dead([other.id, 5]) == [5]
