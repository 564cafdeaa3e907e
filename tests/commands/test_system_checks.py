"""``manage.py`` on misconfigured sites: a system check error, never a traceback at import."""

from __future__ import annotations

import pytest

from tests.helpers import manage, needs_django_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

# A second app whose jobs.py claims the test app's queue "t.record".
CONFLICTING_APP = {
    "alk_conflict/__init__.py": "",
    "alk_conflict/jobs.py": """
        from alkstore_django import handler


        @handler("t.record")
        def record_again(job):
            return None
    """,
}
WITH_CONFLICTING_APP = 'INSTALLED_APPS = [*INSTALLED_APPS, "alk_conflict"]\n'
CONFLICT = (
    "Queue 't.record' has 2 handlers (tests.testapp.jobs.record_run, "
    "alk_conflict.jobs.record_again): expected one handler per queue."
)


def test_two_handlers_for_one_queue__check_names_them_and_apps_still_load(settings_variant):
    env = settings_variant(WITH_CONFLICTING_APP, CONFLICTING_APP)
    checked = manage(env, "check")
    assert checked.returncode == 1, checked.stderr
    assert f"alkstore.E201) {CONFLICT}" in checked.stderr
    assert "Traceback" not in checked.stderr
    migrated = manage(env, "migrate")  # the check error, not an exception at app loading
    assert migrated.returncode == 1
    assert "alkstore.E201" in migrated.stderr and "Traceback" not in migrated.stderr
    # A command that runs no checks works: the apps loaded.
    shell = manage(env, "shell", "-c", "print('apps loaded')")
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.strip().endswith("apps loaded")


def test_two_handlers_for_one_queue__the_worker_refuses_that_queue_only(settings_variant):
    env = settings_variant(WITH_CONFLICTING_APP, CONFLICTING_APP)
    for queues in (["--queue", "t.record"], []):
        refused = manage(env, "runworker", "--skip-checks", "--burst", *queues)
        assert refused.returncode == 1
        assert f"CommandError: {CONFLICT}" in refused.stderr
    served = manage(env, "runworker", "--skip-checks", "--burst", "--queue", "t.noop")
    assert served.returncode == 0, served.stderr


@needs_django_tasks()
def test_tasks_queue_that_a_handler_also_claims__is_a_check_error_naming_the_runner_once(
    settings_variant,
):
    env = settings_variant(
        """
        TASKS = {
            "default": {
                "BACKEND": "alkstore_django.tasks.AlkstoreBackend",
                "QUEUES": ["default", "t.record"],
            }
        }
        """
    )
    checked = manage(env, "check")
    assert checked.returncode == 1
    assert (
        "Queue 't.record' has 2 handlers (tests.testapp.jobs.record_run, "
        "alkstore_django.tasks.runner.task_runner): expected one handler per queue."
    ) in checked.stderr
    assert "InvalidArgument" not in checked.stderr


def test_use_tz_false__check_refuses_the_site_saying_why(settings_variant):
    checked = manage(settings_variant("USE_TZ = False\n"), "check")
    assert checked.returncode == 1
    assert "(alkstore.E203) alkstore_django needs USE_TZ = True." in checked.stderr
