"""A wheel built from the repository ships the migrations, the templates and ``py.typed``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT

SKIP = shutil.ignore_patterns(
    ".git", ".venv*", ".test-db", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
)


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory):
    # Build from a copy so the shared tree gets no build/ or egg-info churn.
    source = tmp_path_factory.mktemp("src") / "repo"
    shutil.copytree(ROOT, source, ignore=SKIP)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = out.glob("alkstore_django-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_wheel__contains_the_initial_migration(wheel_names):
    assert "alkstore_django/migrations/0001_initial.py" in wheel_names
    assert "alkstore_django/migrations/__init__.py" in wheel_names


def test_wheel__contains_the_typing_marker(wheel_names):
    assert "alkstore_django/py.typed" in wheel_names


def test_wheel__contains_every_template(wheel_names):
    templates = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "alkstore_django" / "templates").rglob("*")
        if path.is_file()
    )
    assert templates, "no templates in the source tree"
    assert set(templates) <= wheel_names


def test_wheel__leaves_the_tests_out(wheel_names):
    assert not any(name.startswith("tests/") for name in wheel_names)
