"""The dialect contract: every engine's ``Dialect`` must pass these tests.

Like Django's ``SessionTestsMixin``, the tests live on a mixin and each engine
has a module of one subclass (``test_postgresql.py``, ``test_sqlite.py``,
``test_mysql.py``). Adding an engine is adding its dialect module and one
such test module, then passing this suite. The tests drive the ``Dialect``
directly, below the public API, so a new engine fails here first, by name.
The suite runs against whatever database ``DATABASE_URL`` selects; each
engine's module is marked to skip on the others.
"""

from __future__ import annotations

import time
from datetime import UTC, timedelta

import pytest
from django.db import connection, transaction

from alkstore_django import store
from alkstore_django.dialects import Dialect, dialect_class, dialect_for
from alkstore_django.models import DeadJob, Job, OutcomeMinute, Schedule
from alkstore_django.notify import open_watcher
from tests.factories import DeadJobFactory
from tests.helpers import expire_job, lapse_claim, make_due, waiting_worker


def stamps(queue: str, **changes):
    """The stamps of a plain ``enqueue`` on ``queue``, with ``changes``."""
    from dataclasses import replace

    return replace(store.queue(queue)._plain, **changes)


@pytest.mark.django_db(transaction=True)
class DialectContract:
    """The statements every engine implements, and what each must guarantee."""

    vendor = ""

    @pytest.fixture
    def dialect(self) -> Dialect:
        return dialect_for(connection.alias)

    def enqueue(self, dialect, queue="c", payloads=("{}",), **changes):
        return dialect.enqueue(stamps(queue, **changes), list(payloads))

    def test_dialect_for__returns_this_engines_class_once_per_alias(self, dialect):
        assert type(dialect) is dialect_class(self.vendor)
        assert dialect_for(connection.alias) is dialect
        assert dialect.vendor == self.vendor

    def test_database_now__is_utc_aware_with_sub_second_precision(self, dialect):
        readings = []
        for _ in range(5):
            readings.append(dialect.database_now())
            time.sleep(0.003)
        assert all(r.utcoffset() == timedelta(0) for r in readings)
        assert len(set(readings)) == len(readings)
        assert readings == sorted(readings)
        assert any(r.microsecond % 1000 for r in readings) or any(r.microsecond for r in readings)

    def test_enqueue__returns_ascending_ids_in_payload_order_and_stamps_rows(self, dialect):
        ids = self.enqueue(dialect, payloads=['{"n": 1}', '{"n": 2}', '{"n": 3}'], priority=4)
        assert ids == sorted(ids) and len(set(ids)) == 3
        rows = {job.id: job for job in Job.objects.filter(id__in=ids)}
        assert [rows[i].payload for i in ids] == [{"n": 1}, {"n": 2}, {"n": 3}]
        assert {(r.priority, r.state, r.attempts, r.generation) for r in rows.values()} == {
            (4, "pending", 0, 0)
        }
        later = self.enqueue(dialect, delay_s=60)[0]
        row = Job.objects.get(id=later)
        assert timedelta(seconds=59) < row.run_at - row.enqueued_at <= timedelta(seconds=60)

    def test_claim_and_ack__claims_in_priority_run_at_id_order_and_fences_each_claim(self, dialect):
        low = self.enqueue(dialect, priority=0)[0]
        high = self.enqueue(dialect, priority=5)[0]
        later_low = self.enqueue(dialect, priority=0)[0]
        acked, jobs = dialect.claim_and_ack("c", "w", 2, "w", ())
        assert acked == [] and [job.id for job in jobs] == [high, low]
        job = jobs[0]
        assert (job.state, job.attempts, job.generation, job.worker_id) == ("processing", 1, 1, "w")
        vt = timedelta(seconds=job.visibility_timeout_s)
        assert abs(job.claim_expires_at - dialect.database_now() - vt) < timedelta(seconds=5)
        assert [j.id for j in dialect.claim("c", "w", 5)] == [later_low]

    def test_claim_and_ack__skips_rows_not_yet_due_and_expired(self, dialect):
        self.enqueue(dialect, delay_s=3600)
        expired = self.enqueue(dialect, expires_s=60)[0]
        expire_job(expired)
        assert dialect.claim("c", "w", 5) == []

    def test_claim_and_ack__acks_only_fences_still_held_by_that_worker(self, dialect):
        ids = self.enqueue(dialect, payloads=["1", "2", "3"])
        jobs = dialect.claim("c", "w", 3)
        fences = [(j.id, j.generation) for j in jobs]
        stale = [(ids[0], fences[0][1] + 1)]
        assert dialect.claim_and_ack("c", "w", 0, "w", stale)[0] == []
        assert dialect.claim_and_ack("c", "w", 0, "other", fences)[0] == []
        acked, claimed = dialect.claim_and_ack("c", "w", 1, "w", fences[:2])
        assert sorted(acked) == sorted(ids[:2]) and claimed == []
        assert list(Job.objects.values_list("id", flat=True)) == [ids[2]]
        assert dialect.ack_fenced("w", fences[2:]) == [ids[2]]

    def test_claim_and_ack__buries_exhausted_lapsed_claims_and_reclaims_the_others(self, dialect):
        spent = self.enqueue(dialect, max_attempts=1)[0]
        again = self.enqueue(dialect, max_attempts=3)[0]
        dialect.claim("c", "dead-worker", 2)
        lapse_claim(spent)
        lapse_claim(again)
        jobs = dialect.claim("c", "w2", 5)
        assert [(j.id, j.attempts, j.generation) for j in jobs] == [(again, 2, 2)]
        assert DeadJob.objects.get(id=spent).last_error == "max attempts exceeded"

    def test_handle_statements__refuse_a_stale_generation_and_honour_a_live_one(self, dialect):
        job_id = self.enqueue(dialect)[0]
        job = dialect.claim("c", "w", 1)[0]
        g = job.generation
        assert not dialect.heartbeat(job_id, g + 1, "w", 30)
        assert not dialect.ack(job_id, g, "not-w")
        assert not dialect.bury_claimed(job_id, g - 1, "w", "x")
        assert dialect.heartbeat(job_id, g, "w", 30)
        assert dialect.requeue_claimed(job_id, g, "w", delay_s=None, error="e")
        row = Job.objects.get(id=job_id)
        assert (row.state, row.attempts, row.last_error) == ("pending", 0, "e")
        job = dialect.claim("c", "w", 1)[0]
        assert dialect.requeue_claimed(job_id, job.generation, "w", delay_s=60, error=None)
        assert Job.objects.get(id=job_id).attempts == 1
        make_due(job_id)
        job = dialect.claim("c", "w", 1)[0]
        assert dialect.bury_claimed(job_id, job.generation, "w", "failed")
        assert not dialect.ack(job_id, job.generation, "w")
        assert DeadJob.objects.get(id=job_id).last_error == "failed"

    def test_expire_and_purge_dead__move_and_delete_by_the_database_clock(self, dialect):
        job_id = self.enqueue(dialect, expires_s=60)[0]
        expire_job(job_id)
        assert dialect.expire("c") == 1
        dead = DeadJob.objects.get(id=job_id)
        assert dead.last_error == "expired"
        assert dialect.purge_dead("c", 3600) == 0
        DeadJob.objects.filter(id=job_id).update(died_at=dead.died_at - timedelta(hours=2))
        assert dialect.purge_dead("c", 3600) == 1

    def test_locks__take_renew_refuse_release_and_grow_the_fence(self, dialect):
        fence, expires_at = dialect.acquire_lock("L", "a", 30)
        assert expires_at.tzinfo is not None
        assert dialect.acquire_lock("L", "b", 30) is None
        assert dialect.acquire_lock("L", "a", 60)[0] == fence  # the owner renews
        assert dialect.renew_lock("L", "a", fence, 90) > expires_at
        assert dialect.renew_lock("L", "b", fence, 90) is None
        assert dialect.release_lock("L", "a", fence)
        assert not dialect.release_lock("L", "a", fence)
        assert dialect.acquire_lock("L", "b", 30)[0] == fence + 1

    def test_names__compare_exactly_case_accents_and_trailing_spaces(self, dialect):
        names = ["name", "Name", "name ", "nàme"]
        for name in names:
            assert dialect.acquire_lock(name, name, 30) is not None
            self.enqueue(dialect, queue=name)
        for name in names:
            assert [j.queue for j in dialect.claim(name, "w", 5)] == [name]

    def test_upsert_schedule__keeps_next_run_at_unless_the_spec_or_zone_changes(self, dialect):
        values = {
            "name": "s", "spec": "@every 1h", "interval_s": 3600, "zone": "UTC",
            "misfire": "all", "declared": False, "queue": "q",
            "payload": '{"a": 1}', "priority": 0, "max_attempts": 3,
            "visibility_timeout_s": 30.0, "retry_base_s": 5.0, "expires_s": None,
        }  # fmt: skip
        first = dialect.database_now().replace(microsecond=0) + timedelta(hours=1)
        dialect.upsert_schedule(values, first)
        dialect.upsert_schedule({**values, "priority": 7}, first + timedelta(hours=5))
        row = Schedule.objects.get(name="s")
        assert (row.priority, row.next_run_at, row.payload) == (7, first, {"a": 1})
        Schedule.objects.filter(name="s").update(refused_from=first, admin_edited_at=first)
        dialect.upsert_schedule({**values, "misfire": "skip"}, first + timedelta(hours=5))
        row = Schedule.objects.get(name="s")
        assert (row.misfire, row.next_run_at, row.refused_from) == ("skip", first, first)
        assert row.admin_edited_at is None
        dialect.upsert_schedule({**values, "zone": "Europe/Paris"}, first + timedelta(hours=3))
        row = Schedule.objects.get(name="s")
        assert (row.zone, row.next_run_at, row.refused_from) == (
            "Europe/Paris",
            first + timedelta(hours=3),
            None,
        )
        dialect.upsert_schedule({**values, "spec": "@every 2h"}, first + timedelta(hours=2))
        assert Schedule.objects.get(name="s").next_run_at == first + timedelta(hours=2)
        assert 2 * 3600 < dialect.seconds_until_next_fire() <= 3 * 3600

    def test_operator_statements__requeue_delete_purge_and_count(self, dialect):
        old = dialect.database_now() - timedelta(days=2)
        a, b, _ = (DeadJobFactory(queue=q, died_at=old) for q in ("x", "x", "y"))
        assert dialect.dead_queues() == ["x", "y"]
        assert dialect.dead_ids("x", 0, 10) == sorted([a.id, b.id])
        with dialect.write_transaction() as cursor:
            assert dialect.move_dead_to_live(cursor, [a.id]) == {"x": 1}
        assert Job.objects.get(id=a.id).attempts == 0
        assert dialect.delete_dead([b.id]) == 1
        assert dialect.purge_dead_batch("y", dialect.database_now(), 10) == 1
        dialect.record_outcomes([("x", 2, 1, 0), ("y", 1, 0, 1)])
        dialect.record_outcomes([("x", 1, 0, 0)])
        assert OutcomeMinute.objects.get(queue="x").acked == 3
        assert dialect.prune_outcomes(dialect.database_now() - timedelta(hours=1), 10) == 0
        overview = dialect.overview(dialect.database_now())
        assert overview["x"]["pending"] == 1

    def test_stats_and_next_due_at__count_by_the_database_clock(self, dialect):
        self.enqueue(dialect, payloads=["1", "2"])
        self.enqueue(dialect, delay_s=120)
        dialect.claim("c", "w", 1)
        pending, scheduled, processing, overdue, dead, age = dialect.stats("c")
        assert (pending, scheduled, processing, overdue, dead) == (1, 1, 1, 0, 0)
        assert age is not None and age >= 0
        assert 100 < dialect.next_due_at(["c"]) <= 120

    def test_watcher__wakes_on_a_committed_enqueue_only(self, dialect):
        # Producers wake only a waiting worker; its row is written before the
        # watch starts (SQLite's watcher wakes on any commit).
        with waiting_worker("w"):
            watcher = open_watcher(store, [store.queue("w").channel], queues=["w"])
            try:
                with pytest.raises(RuntimeError), transaction.atomic():
                    self.enqueue(dialect, queue="w")
                    raise RuntimeError("rollback")
                assert watcher.wait(0.3) is False
                with transaction.atomic():
                    self.enqueue(dialect, queue="w")
                    assert watcher.wait(0.3) is False
                assert watcher.wait(5.0) is True
            finally:
                watcher.close()

    def test_dead_letters__keep_the_clock_in_utc(self, dialect):
        job_id = self.enqueue(dialect)[0]
        job = dialect.claim("c", "w", 1)[0]
        dialect.bury_claimed(job_id, job.generation, "w", "x")
        died_at = DeadJob.objects.get(id=job_id).died_at
        assert abs(died_at - dialect.database_now().astimezone(UTC)) < timedelta(seconds=5)
