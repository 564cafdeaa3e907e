"""The models and the migrations agree: ``makemigrations --check`` finds nothing to write."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from tests.helpers import run_python


# The shard too: the router lets alkstore migrate there (tests/settings.py).
@pytest.mark.django_db(databases=["default", "shard"])
def test_makemigrations__finds_no_changes_to_write():
    out = io.StringIO()
    try:
        call_command("makemigrations", check=True, dry_run=True, stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits 1 when a migration is missing
        pytest.fail(f"missing migrations:\n{out.getvalue()}")
        raise AssertionError from exc
    assert "No changes detected" in out.getvalue()


ROUND_TRIP = """
import django
django.setup()
from django.core.management import call_command
from alkstore_django import store

call_command("migrate", verbosity=0)
call_command("migrate", "alkstore_django", "0009", verbosity=0)
call_command("migrate", "alkstore_django", verbosity=0)
q = store.queue("m")
plain = [q.enqueue(1), q.enqueue(2)]
keyed = q.enqueue(3, unique_key="k")
print(len(set(plain)), q.enqueue(4, unique_key="k") == keyed)
"""


def test_unique_jobs_migration__reverses_and_reapplies_cleanly(
    python, subprocess_env, empty_database_url
):
    # On MariaDB/MySQL dropping unique_key alone would leave alk_job_unique as
    # a unique index on queue (one job per queue): the reverse step drops it.
    done = run_python(python, {**subprocess_env, "DATABASE_URL": empty_database_url}, ROUND_TRIP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "True"]
