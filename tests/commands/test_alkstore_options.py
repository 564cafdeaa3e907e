"""``manage.py alkstore``: Django's common options after the subcommand, an unmigrated database."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from alkstore_django import store
from tests.helpers import manage

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "-v", "0"],
        ["stats", "--json", "--verbosity", "2", "--traceback", "--no-color"],
        ["dead", "list", "-v", "0"],
        ["-v", "0", "schedules", "--skip-checks"],
    ],
    ids=["stats-v0", "stats-many", "dead-list-v0", "before-and-after"],
)
def test_common_options_after_the_subcommand__are_accepted(args):
    store.queue("opt.a").enqueue(1)
    out = StringIO()
    call_command("alkstore", *args, stdout=out)  # before the fix: "unrecognized arguments"
    assert out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_settings_after_the_subcommand__runs_as_a_process(subprocess_env):
    store.queue("opt.proc").enqueue(1)
    env = {k: v for k, v in subprocess_env.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = manage(env, "alkstore", "stats", "--settings", "tests.settings", "-v", "0")
    assert done.returncode == 0, done.stderr
    assert "opt.proc" in done.stdout


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("command", [["stats"], ["dead", "list"], ["schedules"]])
def test_unmigrated_database__is_a_command_error_saying_run_migrate(
    command, subprocess_env, empty_database_url
):
    env = {**subprocess_env, "DATABASE_URL": empty_database_url}
    done = manage(env, "alkstore", *command)  # before the fix: a "no such table" traceback
    assert done.returncode == 1, done.stderr
    assert "run `manage.py migrate` first" in done.stderr
    assert "Traceback" not in done.stderr
