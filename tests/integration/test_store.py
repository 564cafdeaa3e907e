"""The Store facade: aliases, close(), and the settings checks."""

from __future__ import annotations

import importlib

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from alkstore_django import Store, store
from alkstore_django.errors import StoreClosed
from tests.helpers import ALKSTORE_DB, ROUTING, dead_count, live_count

# The module, which the package's ``store`` (the default store) hides.
store_module = importlib.import_module("alkstore_django.store")

# Every alias: the system checks Django runs here ask each SQLite database about JSON.
pytestmark = pytest.mark.django_db(databases=["default", "shard"])


def test_store__using_an_alias_reads_and_writes_that_database():
    mine = Store(using=ALKSTORE_DB)
    job_id = mine.queue("aliased").enqueue({"a": 1})
    assert mine.using == ALKSTORE_DB
    assert store.get_job(job_id).payload == {"a": 1}
    assert mine.queue("aliased").claim_one("w").job.id == job_id


@override_settings(ALKSTORE={**ROUTING, "DATABASE": "default"})
def test_store__default_proxy_follows_the_database_setting():
    assert store.using == "default"


def test_store__close_refuses_every_later_operation():
    closing = Store(using=ALKSTORE_DB)
    q = closing.queue("closing")
    q.enqueue_many([1, 2, 3])
    handles = q.claim_batch("w", 3)
    closing.close()
    operations = {
        "queue": lambda: closing.queue("other"),
        "get_job": lambda: closing.get_job(handles[0].job.id),
        "notify": lambda: closing.notify("chan", "x"),
        "listen": lambda: closing.listen(["chan"], 0.01),
        "enqueue": lambda: q.enqueue({}),
        "enqueue_many": lambda: q.enqueue_many([{}]),
        "claim_one": lambda: q.claim_one("w"),
        "claim_batch": lambda: q.claim_batch("w", 1),
        "ack_batch": lambda: q.ack_batch([handles[0].job.id]),
        "cancel": lambda: q.cancel(handles[0].job.id),
        "sweep_expired": lambda: q.sweep_expired(),
        "stats": lambda: q.stats(),
        "ack": lambda: handles[0].ack(),
        "retry": lambda: handles[0].retry(),
        "fail": lambda: handles[0].fail(),
        "heartbeat": lambda: handles[0].heartbeat(60),
        "release": lambda: handles[0].release(),
    }
    for name, operation in operations.items():
        with pytest.raises(StoreClosed, match="closed"):
            operation()
        assert live_count("closing") == 3, name
    assert dead_count() == 0
    assert all(store.get_job(h.job.id).state == "processing" for h in handles)


def test_store__close_leaves_the_shared_default_store_open():
    Store(using=ALKSTORE_DB).close()
    assert store.queue("still").enqueue({}) > 0


def messages(**alkstore):
    with override_settings(ALKSTORE={**ROUTING, **alkstore}):
        return [m for m in checks.run_checks() if m.id and m.id.startswith("alkstore.")]


def test_store__keeps_a_queue_handle_until_the_settings_change(settings):
    mine = Store(using=ALKSTORE_DB)
    kept, dialect = mine.queue("kept"), mine.dialect
    assert mine.queue("kept") is kept
    assert mine.queue("kept", priority=5).options.priority == 5
    assert mine.queue("kept") is kept
    settings.ALKSTORE = {**ROUTING, "QUEUES": {"kept": {"priority": 7}}}
    assert mine.queue("kept").options.priority == 7
    assert mine.dialect is not dialect
    assert mine.queue("kept").enqueue({}) > 0


def test_store__keeps_a_bounded_number_of_queue_handles(monkeypatch):
    monkeypatch.setattr(store_module, "MAX_KEPT_QUEUES", 2)
    mine = Store(using=ALKSTORE_DB)
    first = mine.queue("a")
    assert mine.queue("a") is first
    mine.queue("b")
    third = mine.queue("c")
    assert mine.queue("c") is third
    assert mine.queue("a") is not first


def test_checks__pass_for_a_good_configuration():
    assert (
        messages(
            QUEUES={"emails": {"visibility_timeout_s": 30, "max_attempts": 5}},
            POLL_INTERVAL_S=2.5,
            MAX_PAYLOAD_BYTES=1024,
        )
        == []
    )


@pytest.mark.parametrize(
    ("alkstore", "shown", "check_id"),
    [
        ({"QUEUS": {}}, "'QUEUS'", "alkstore.E001"),
        ({"DATABASE": "nope"}, "ALKSTORE['DATABASE'] is 'nope'", "alkstore.E002"),
        ({"QUEUES": []}, "ALKSTORE['QUEUES']", "alkstore.E003"),
        ({"QUEUES": {"q": {"max_attempts": 0}}}, "ALKSTORE['QUEUES']['q']", "alkstore.E003"),
        ({"QUEUES": {"q": {"colour": "red"}}}, "'colour'", "alkstore.E003"),
        ({"QUEUES": {"__alkstore_x": {}}}, "'__alkstore_x'", "alkstore.E003"),
        ({"QUEUES": {"q": 5}}, "ALKSTORE['QUEUES']['q']", "alkstore.E003"),
        ({"POLL_INTERVAL_S": -1}, "ALKSTORE['POLL_INTERVAL_S']", "alkstore.E004"),
        ({"POLL_INTERVAL_S": True}, "ALKSTORE['POLL_INTERVAL_S']", "alkstore.E004"),
        ({"MAX_PAYLOAD_BYTES": "1MB"}, "ALKSTORE['MAX_PAYLOAD_BYTES']", "alkstore.E005"),
        ({"NOTIFY_COALESCE_S": -0.001}, "ALKSTORE['NOTIFY_COALESCE_S']", "alkstore.E015"),
        ({"NOTIFY_COALESCE_S": 2}, "ALKSTORE['NOTIFY_COALESCE_S'] is 2", "alkstore.E015"),
        ({"NOTIFY_COALESCE_S": False}, "ALKSTORE['NOTIFY_COALESCE_S']", "alkstore.E015"),
        (
            {"QUEUES": {"q": {"max_running": 0}}},
            "['max_running']: Invalid max_running 0",
            "alkstore.E011",
        ),
        ({"QUEUES": {"q": {"max_running": 2.5}}}, "Invalid max_running 2.5", "alkstore.E011"),
        ({"QUEUES": {"q": {"rate": "100/d"}}}, "['rate']: Invalid rate '100/d'", "alkstore.E012"),
        ({"QUEUES": {"q": {"rate": "1 00/m"}}}, "Invalid rate '1 00/m'", "alkstore.E012"),
    ],
)
def test_checks__name_the_bad_key(alkstore, shown, check_id):
    found = messages(**alkstore)
    assert [m.id for m in found] == [check_id]
    assert shown in found[0].msg


def test_checks__report_a_bad_max_running_and_rate_each_on_its_own():
    found = messages(QUEUES={"q": {"max_running": -1, "rate": "fast", "max_attempts": 2}})
    assert [m.id for m in found] == ["alkstore.E011", "alkstore.E012"]


@pytest.mark.parametrize("seconds", [0, 0.0, 0.005, 1])
def test_checks__accept_a_notify_window_from_0_to_a_second(seconds):
    assert messages(NOTIFY_COALESCE_S=seconds) == []


def test_checks__accept_good_limits():
    assert messages(QUEUES={"q": {"max_running": 3, "rate": "100/m", "max_attempts": 2}}) == []


def test_check_command__fails_naming_the_bad_key():
    with (
        override_settings(ALKSTORE={**ROUTING, "MAX_PAYLOAD_BYTES": -1}),
        pytest.raises(SystemCheckError, match="MAX_PAYLOAD_BYTES"),
    ):
        call_command("check")


@pytest.fixture
def legacy_database():
    """The test settings' alias on an engine alkstore has no dialect for (Django's dummy)."""
    return "legacy"


def test_checks__refuse_an_engine_without_a_dialect_naming_its_vendor(legacy_database):
    found = messages(DATABASE=legacy_database)
    assert [m.id for m in found] == ["alkstore.E006"]
    assert "vendor 'unknown'" in found[0].msg
    assert "MariaDB 10.6+" in found[0].hint


def test_dialect_for__raises_naming_the_vendor_it_does_not_support(legacy_database):
    from alkstore_django.dialects import dialect_for
    from alkstore_django.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="Unsupported database vendor 'unknown'"):
        dialect_for(legacy_database)


def test_database_check__passes_for_this_server():
    found = checks.run_checks(databases=["default"], tags=[checks.Tags.database])
    assert [m for m in found if m.id and m.id.startswith("alkstore.")] == []
