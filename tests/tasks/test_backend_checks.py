"""The backend's check() and construction: no database access, clear messages."""

from __future__ import annotations

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from django.test import override_settings

from alkstore_django.tasks import AlkstoreBackend


def backend(**params):
    return AlkstoreBackend("t", params)


def ids(messages):
    return [m.id for m in messages]


def test_check__a_good_backend_is_clean():
    assert backend(QUEUES=["default"], OPTIONS={"max_attempts": 3}).check() == []
    assert backend(OPTIONS={"result_retention_s": None}).check() == []


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"max_attempt": 3}, "alkstore.E102"),
        ({"max_attempts": 0}, "alkstore.E103"),
        ({"max_attempts": "3"}, "alkstore.E103"),
        ({"result_retention_s": -1}, "alkstore.E103"),
    ],
)
def test_check__names_the_bad_option(options, expected):
    messages = backend(OPTIONS=options).check()
    assert ids(messages) == [expected]
    assert "TASKS['t']" in messages[0].msg


def test_check__reserved_queue_names_are_refused():
    assert ids(backend(QUEUES=["__alkstore_x"]).check()) == ["alkstore.E104"]


def test_check__needs_the_app_installed():
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes"]):
        assert ids(backend().check()) == ["alkstore.E101"]


def test_construction_and_validation_touch_no_database():
    """No ``django_db`` mark: any query here would raise."""
    from tests.testapp import tasks

    b = backend(QUEUES=["default"])
    b.validate_task(tasks.add)
    b.validate_task(tasks.async_add)
    assert b.check() == []


@pytest.mark.parametrize("attempts", [0, -1, 1.5, True])
def test_validate_task__refuses_a_bad_per_task_max_attempts(attempts):
    from django.tasks import task
    from django.tasks.exceptions import InvalidTask

    from tests.testapp import tasks

    with pytest.raises(InvalidTask, match="Invalid max_attempts"):
        task(max_attempts=attempts)(tasks.add.func)
