"""The backend's check() and construction: no database access, clear messages."""

from __future__ import annotations

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from django.test import override_settings

from alkstore_django.tasks import AlkstoreBackend
from tests.helpers import check_ids


def backend(**params):
    return AlkstoreBackend("t", params)


def test_check__a_good_backend_is_clean():
    assert backend(QUEUES=["default"], OPTIONS={"max_attempts": 3}).check() == []
    assert backend(OPTIONS={"result_retention_s": None}).check() == []


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"max_attempt": 3}, "alkstore.E102"),
        ({"max_attempts": 0}, "alkstore.E103"),
        ({"max_attempts": "3"}, "alkstore.E103"),
        ({"result_retention_s": -1}, "alkstore.E105"),
        ({"timeout_s": 0}, "alkstore.E106"),
        ({"timeout_s": "30"}, "alkstore.E106"),
    ],
)
def test_check__names_the_bad_option(options, expected):
    messages = backend(OPTIONS=options).check()
    assert check_ids(messages) == [expected]
    assert "TASKS['t']" in messages[0].msg


def test_check__reserved_queue_names_are_refused():
    assert check_ids(backend(QUEUES=["__alkstore_x"]).check()) == ["alkstore.E104"]


def test_check__needs_the_app_installed():
    with override_settings(INSTALLED_APPS=["django.contrib.contenttypes"]):
        assert check_ids(backend().check()) == ["alkstore.E101"]


def test_construction_and_validation_touch_no_database():
    """No ``django_db`` mark: any query here would raise."""
    from tests.testapp import tasks

    b = backend(QUEUES=["default"])
    b.validate_task(tasks.add)
    b.validate_task(tasks.async_add)
    assert b.check() == []


@pytest.mark.parametrize("attempts", [0, -1, 1.5, True])
def test_validate_task__refuses_a_bad_per_task_max_attempts(attempts):
    from django.tasks.exceptions import InvalidTask

    from alkstore_django.tasks import task
    from tests.testapp import tasks

    with pytest.raises(InvalidTask, match="Invalid max_attempts"):
        task(max_attempts=attempts)(tasks.add.func)


def test_alkstore_task__takes_max_attempts_on_every_django_6():
    from alkstore_django.tasks import AlkstoreTask, task
    from tests.testapp import tasks

    built = task(max_attempts=4, priority=7, queue_name="tasks-retry")(tasks.add.func)
    assert isinstance(built, AlkstoreTask)
    assert (built.max_attempts, built.priority, built.queue_name) == (4, 7, "tasks-retry")
    assert task(tasks.add.func).max_attempts is None  # bare @task: the backend's default


def test_django_task__takes_max_attempts_from_django_6_1_only():
    """What docs/django-tasks.md says: Django 6.0's own @task refuses unknown options."""
    import django
    from django.tasks import task

    from tests.testapp import tasks

    if django.VERSION >= (6, 1):
        assert task(max_attempts=4)(tasks.add.func).max_attempts == 4
    else:
        with pytest.raises(TypeError, match="max_attempts"):
            task(max_attempts=4)(tasks.add.func)


def test_alkstore_task__max_attempts_on_another_backend_is_refused_naming_it(settings):
    from django.tasks.exceptions import InvalidTask

    from alkstore_django.tasks import task
    from tests.testapp import tasks

    settings.TASKS = {
        **settings.TASKS,
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
    }
    with pytest.raises(InvalidTask, match=r"TASKS\['immediate'\] is ImmediateBackend"):
        task(backend="immediate", max_attempts=2)(tasks.add.func)
