"""alkstore on databases of its own: the router, ``--database``, queues routed to a shard.

Each test routes the queue ``sharded`` to the ``shard`` alias (a second
database on the server under test, or a second SQLite file, from
tests/settings.py). scripts/test.sh also runs the whole integration tier with
every alkstore table on a ``queues`` alias beside the site's ``default``,
through ``AlkstoreRouter`` (``ALKSTORE_TEST_QUEUE_DATABASE=1``).
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.core.checks import Warning as CheckWarning
from django.db.models.functions import Now
from django.test import override_settings

from alkstore_django import store
from alkstore_django.checks import check_settings
from alkstore_django.conf import app_settings
from alkstore_django.handlers import HandlerRegistry, registry
from alkstore_django.models import Job, QueueControl, Schedule
from alkstore_django.overview import every_queue_overview
from alkstore_django.routers import AlkstoreRouter
from alkstore_django.scheduler import tick
from alkstore_django.scheduler.fire import _fire_elsewhere
from alkstore_django.store import get_store
from alkstore_django.testing import run_ready_jobs
from alkstore_django.worker import Worker
from alkstore_django.worker.crew import run_together, workers_for
from tests.helpers import manage, runworker
from tests.testapp.jobs import record
from tests.testapp.models import Run

SHARDED = "sharded"
ALIASES = [*dict.fromkeys([app_settings.database, "default", "shard"])]
pytestmark = pytest.mark.django_db(transaction=True, databases=ALIASES)

# A child's settings have no shard unless they add it (tests/settings.py).
WITH_SHARD = 'DATABASES["shard"] = beside("shard")\n'
ROUTED_VARIANT = (
    WITH_SHARD
    + """
INSTALLED_APPS = [*INSTALLED_APPS, "alk_shard"]
ALKSTORE = {**ALKSTORE, "QUEUES": {"sharded": {"database": "shard"}}}
"""
)
SHARD_APP = {
    "alk_shard/__init__.py": "",
    "alk_shard/jobs.py": """
        from alkstore_django import handler
        from tests.testapp.jobs import record

        @handler("sharded")
        def sharded(job):
            record(job)
    """,
}


def live_on(alias: str, queue: str) -> int:
    return Job.objects.using(alias).filter(queue=queue).count()


@pytest.fixture(autouse=True)
def routed(settings):
    """Route the queue ``sharded`` to the ``shard`` alias, as the queue-database run does."""
    settings.ALKSTORE = {**settings.ALKSTORE, "QUEUES": {SHARDED: {"database": "shard"}}}


@pytest.fixture
def sharded_handler(monkeypatch):
    monkeypatch.setitem(registry._handlers, SHARDED, record)


def test_router__sends_the_models_to_the_database_and_migrates_them_only_on_its_aliases():
    router = AlkstoreRouter()
    assert router.db_for_write(Job) == router.db_for_read(Job) == app_settings.database
    assert router.db_for_write(Run) is None
    assert router.allow_migrate(app_settings.database, "alkstore_django")
    assert router.allow_migrate("shard", "alkstore_django")  # a queue is routed there
    assert not router.allow_migrate("legacy", "alkstore_django")
    assert router.allow_migrate("legacy", "testapp") is None  # the site's models: not ours


def test_store_queue__enqueues_a_routed_queue_on_its_alias_and_claims_and_acks_it_there():
    queue = store.queue(SHARDED)
    assert queue.store.using == "shard"
    job_id = queue.enqueue({"n": 1})
    assert live_on("shard", SHARDED) == 1
    assert live_on(app_settings.database, SHARDED) == 0
    handle = queue.claim_one("w1")
    assert handle is not None and handle.job.id == job_id
    assert handle.ack()
    assert live_on("shard", SHARDED) == 0
    assert get_store("shard").get_job(job_id) is None


def test_run_ready_jobs__settles_a_routed_queue_on_its_own_alias(sharded_handler):
    job_id = store.queue(SHARDED).enqueue("p")
    runs = run_ready_jobs([SHARDED])
    assert [(r.job_id, r.outcome) for r in runs] == [(job_id, "acked")]
    assert Run.objects.filter(job_id=job_id, queue=SHARDED).count() == 1
    assert live_on("shard", SHARDED) == 0


def test_workers_for__one_loop_per_alias_and_they_drain_both_in_one_process():
    handlers = HandlerRegistry()
    handlers.register("t.record", record)
    handlers.register(SHARDED, record)
    main_ids = store.queue("t.record").enqueue_many(list(range(20)))
    shard_ids = store.queue(SHARDED).enqueue_many(list(range(30)))
    workers = workers_for(None, handlers=handlers, burst=True, concurrency=2)
    assert sorted(w.store.using for w in workers) == sorted({app_settings.database, "shard"})
    assert len({w.worker_id for w in workers}) == 1
    run_together(workers, threading.Event())
    assert sorted(Run.objects.filter(queue="t.record").values_list("job_id", flat=True)) == main_ids
    assert sorted(Run.objects.filter(queue=SHARDED).values_list("job_id", flat=True)) == shard_ids
    assert live_on("shard", SHARDED) == 0


def test_worker__refuses_a_queue_routed_to_another_alias():
    handlers = HandlerRegistry()
    handlers.register(SHARDED, record)
    worker = Worker([SHARDED], store=get_store(app_settings.database), handlers=handlers)
    with pytest.raises(Exception, match=r"Queue 'sharded' lives on database 'shard'"):
        worker.build_queues()


def test_runworker__drains_queues_on_two_aliases_in_one_process(settings_variant):
    env = settings_variant(ROUTED_VARIANT, files=SHARD_APP)
    main_ids = store.queue("t.record").enqueue_many(list(range(40)))
    shard_ids = store.queue(SHARDED).enqueue_many(list(range(40)))
    code, out = runworker(env, "--queue", "t.record", "--queue", SHARDED, "--burst")
    assert code == 0, out
    assert sorted(Run.objects.filter(queue="t.record").values_list("job_id", flat=True)) == main_ids
    assert sorted(Run.objects.filter(queue=SHARDED).values_list("job_id", flat=True)) == shard_ids
    assert out.count("sentinel started") == 1  # one sentinel for both loops
    assert out.count("worker started") == 2


def test_runworker_database__serves_the_unrouted_queues_of_that_alias(settings_variant):
    job_id = get_store("shard").queue("t.record").enqueue("p")
    env = settings_variant(WITH_SHARD)
    code, out = runworker(env, "--queue", "t.record", "--database", "shard", "--burst")
    assert code == 0, out
    assert Run.objects.filter(job_id=job_id, queue="t.record").exists()
    assert live_on("shard", "t.record") == 0


def test_runworker_database__refuses_an_unknown_alias(subprocess_env):
    code, out = runworker(subprocess_env, "--queue", "t.record", "--database", "nowhere")
    assert code != 0
    assert "Unknown database 'nowhere'" in out


def test_check__warns_without_the_router_when_alkstore_is_off_default():
    raw = {"DATABASE": "shard"}
    with override_settings(ALKSTORE=raw, DATABASE_ROUTERS=[]):
        warnings = [m for m in check_settings() if m.id == "alkstore.W006"]
    assert len(warnings) == 1 and isinstance(warnings[0], CheckWarning)
    assert "'shard'" in warnings[0].msg and "AlkstoreRouter" in warnings[0].hint
    with override_settings(
        ALKSTORE=raw, DATABASE_ROUTERS=["alkstore_django.routers.AlkstoreRouter"]
    ):
        assert not [m for m in check_settings() if m.id == "alkstore.W006"]


def test_check__names_a_queue_database_that_is_not_an_alias():
    with override_settings(ALKSTORE={"QUEUES": {"eu": {"database": "queues_eu"}}}):
        errors = [m for m in check_settings() if m.id == "alkstore.E002"]
    assert len(errors) == 1
    assert "ALKSTORE['QUEUES']['eu']['database'] is 'queues_eu'" in errors[0].msg


def test_migrate__creates_alkstore_tables_only_on_its_alias(settings_variant, empty_database_url):
    second = f"{empty_database_url}_q" if "sqlite" not in empty_database_url else None
    if second is None:
        second = empty_database_url.replace("empty.sqlite3", "empty_q.sqlite3")
    env = settings_variant(
        f"""
        import environ
        DATABASES = {{
            "default": environ.Env.db_url_config({empty_database_url!r}),
            "queues": environ.Env.db_url_config({second!r}),
        }}
        ALKSTORE = {{"DATABASE": "queues"}}
        DATABASE_ROUTERS = ["alkstore_django.routers.AlkstoreRouter"]
        """
    )
    created = _create_database(second)
    try:
        for args in (("migrate",), ("migrate", "--database", "queues")):
            result = manage(env, *args, "-v", "0")
            assert result.returncode == 0, result.stdout + result.stderr
        result = manage(env, "shell", "-c", LIST_TABLES)
        assert result.returncode == 0, result.stderr
        on_default, on_queues = result.stdout.strip().splitlines()[-2:]
        assert "alkstore_django_job" not in on_default and "auth_user" in on_default
        assert "alkstore_django_job" in on_queues
    finally:
        created()


LIST_TABLES = (
    "from django.db import connections\n"
    "for alias in ('default', 'queues'):\n"
    "    with connections[alias].cursor() as c:\n"
    "        print(','.join(sorted(connections[alias].introspection.table_names(c))))\n"
)


def _create_database(url: str):
    """Create the second empty database of ``url`` (a server's); return its dropper."""
    from django.db import connection

    if url.startswith("sqlite"):
        return lambda: None
    name = url.rsplit("/", 1)[1]
    quoted = connection.ops.quote_name(name)
    drop = f"DROP DATABASE IF EXISTS {quoted}" + (
        " WITH (FORCE)" if connection.vendor == "postgresql" else ""
    )
    with connection._nodb_cursor() as cursor:
        cursor.execute(drop)
        cursor.execute(f"CREATE DATABASE {quoted}")

    def dropper() -> None:
        with connection._nodb_cursor() as cursor:
            cursor.execute(drop)

    return dropper


def test_tick__fires_a_routed_queue_on_its_database_and_a_repeated_fire_writes_no_second_job():
    store.schedule("shard-beat", "@every 1h", SHARDED, {"n": 1})
    Schedule.objects.filter(name="shard-beat").update(next_run_at=Now() - timedelta(seconds=1))
    assert tick(get_store()) == 1
    (job,) = Job.objects.using("shard").filter(queue=SHARDED)
    fire = get_store("shard").fired_for(job.id)
    assert fire is not None and fire.schedule == "shard-beat"
    # A tick that rolled back after the shard's commit fires the boundary again:
    # the boundary's key hands back the job already written.
    row = Schedule.objects.get(name="shard-beat")
    again = _fire_elsewhere(store.queue(SHARDED), row, {"n": 1}, [fire.boundary])
    assert again == [job.id]
    assert live_on("shard", SHARDED) == 1


def test_overview_and_metrics__count_the_queues_of_every_alias(admin_client):
    store.queue("t.record").enqueue_many([1, 2])
    store.queue(SHARDED).enqueue_many([1, 2, 3])
    rows = {s.queue: s for s in every_queue_overview()}
    assert (rows["t.record"].pending, rows["t.record"].database) == (2, app_settings.database)
    assert (rows[SHARDED].pending, rows[SHARDED].database) == (3, "shard")
    page = admin_client.get("/admin/alkstore_django/deadjob/overview/").content.decode()
    assert '<td class="alk-database">shard</td>' in page
    text = admin_client.get("/alkstore/metrics").content.decode()
    assert 'alkstore_queue_jobs{queue="sharded",state="pending"} 3.0' in text


def test_admin_pause__pauses_a_routed_queue_on_its_own_database(admin_client):
    response = admin_client.post(
        "/admin/alkstore_django/deadjob/overview/control/", {"queue": SHARDED, "action": "pause"}
    )
    assert response.status_code == 302
    assert QueueControl.objects.using("shard").get(queue=SHARDED).paused


def test_workflow__refuses_a_step_on_a_queue_of_another_database_and_writes_nothing():
    from alkstore_django import Workflow
    from alkstore_django.errors import InvalidWorkflow
    from alkstore_django.models import Workflow as WorkflowRow

    flow = Workflow("split").add("a", queue="t.record").add("b", queue=SHARDED, after=["a"])
    with pytest.raises(InvalidWorkflow, match=r"queue 'sharded' lives on database 'shard'"):
        store.enqueue_workflow(flow)
    assert not WorkflowRow.objects.exists()
    assert live_on(app_settings.database, "t.record") == 0
