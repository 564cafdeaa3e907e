"""Django's own tests/tasks, fetched from the sdist and pointed at AlkstoreBackend.

See tests/django_tasks_suite/run.py for what is adapted and why some tests do
not apply; the run uses a database of its own next to this session's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("django.tasks", reason="Django's Tasks framework needs Django 6.0+")

from tests.helpers import ROOT, unpooled

RUNNER = ROOT / "tests" / "django_tasks_suite" / "run.py"
EXIT_UNAVAILABLE = 77


@unpooled("Django's runner drops its database while PgBouncer still holds server connections")
@pytest.mark.timeout(600)
def test_djangos_tasks_suite_passes_against_alkstore(tmp_path):
    report = tmp_path / "counts.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, str(RUNNER), "--json", str(report)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
        check=False,
    )
    if done.returncode == EXIT_UNAVAILABLE:
        pytest.skip(f"Django's test suite could not be fetched: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-10000:]
    counts = json.loads(report.read_text())
    assert counts["failed"] == []
    assert counts["adapted"]["passed"] >= 50, counts["adapted"]
    assert counts["unchanged"]["passed"] == counts["unchanged"]["total"], counts["unchanged"]
