"""The models and the migrations agree: ``makemigrations --check`` finds nothing to write."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_makemigrations__finds_no_changes_to_write():
    out = io.StringIO()
    try:
        call_command("makemigrations", check=True, dry_run=True, stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits 1 when a migration is missing
        pytest.fail(f"missing migrations:\n{out.getvalue()}")
        raise AssertionError from exc
    assert "No changes detected" in out.getvalue()
