"""The wheel, and the README's install step: the wheel in fresh venvs runs a tiny site.

``scripts/test.sh`` runs this module once per full run (not once per engine):
it builds the wheel from a copy of the tree, installs it into new venvs with
and without the ``postgres`` extra, and runs ``manage.py check``, ``migrate``
and one job on SQLite in a generated project. pip's cache and the configured
index are reused; nothing else is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

SKIP = shutil.ignore_patterns(
    ".git", ".venv*", ".test-db", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
)
INSTALL_TIMEOUT_S = 300

# The README's minimal settings, and one handler.
PROJECT = {
    "manage.py": """
        import os
        import sys

        if __name__ == "__main__":
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
            from django.core.management import execute_from_command_line

            execute_from_command_line(sys.argv)
    """,
    "settings.py": """
        import os
        from pathlib import Path

        BASE_DIR = Path(__file__).resolve().parent
        SECRET_KEY = "install-test"
        INSTALLED_APPS = ["alkstore_django", "shop"]
        DATABASES = {
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": BASE_DIR / "db.sqlite3",
                "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
            }
        }
        if os.environ.get("SHOP_DATABASE") == "postgresql":
            # Never connected to: "check" only loads the backend.
            DATABASES = {
                "default": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop"}
            }
    """,
    "shop/__init__.py": "",
    "shop/jobs.py": """
        from pathlib import Path

        from alkstore_django import handler


        @handler("greetings")
        def greet(job):
            Path(job.payload["path"]).write_text(f"hello {job.payload['name']}")
    """,
}
ENQUEUE = (
    "from alkstore_django import store; "
    "print(store.queue('greetings').enqueue({'name': 'world', 'path': 'greeting.txt'}))"
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Build from a copy so the shared tree gets no build/ or egg-info churn.
    source = tmp_path_factory.mktemp("src") / "repo"
    shutil.copytree(ROOT, source, ignore=SKIP)
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("alkstore_django-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel_names(wheel) -> set[str]:
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


# --- the install step, in fresh venvs -----------------------------------------------


class Site:
    """A fresh venv with the wheel installed, and a generated project to run in it."""

    def __init__(self, root: Path, requirement: str) -> None:
        self.venv = root / "venv"
        self.project = root / "project"
        self.python = self.venv / "bin" / "python"
        run([sys.executable, "-m", "venv", str(self.venv)], cwd=root)
        self.pip("install", "-q", "--disable-pip-version-check", requirement)
        for relative, text in PROJECT.items():
            path = self.project / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))

    def pip(self, *args: str) -> subprocess.CompletedProcess:
        return run([str(self.python), "-m", "pip", *args], cwd=self.venv)

    def manage(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess:
        return run(
            [str(self.python), "manage.py", *args], cwd=self.project, check=check, extra_env=env
        )

    def can_import(self, module: str) -> bool:
        done = run([str(self.python), "-c", f"import {module}"], cwd=self.project, check=False)
        return done.returncode == 0

    def run_one_job(self) -> str:
        """check, migrate, enqueue one job, drain it with runworker; return what it wrote."""
        assert "no issues" in self.manage("check").stdout
        self.manage("migrate", "-v", "0")
        self.manage("shell", "-c", ENQUEUE)
        worker = self.manage("runworker", "--burst")
        assert "outcome=acked" in worker.stderr, worker.stderr
        return (self.project / "greeting.txt").read_text()


def run(
    command: list[str], *, cwd: Path, check: bool = True, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH"}}
    env.update(extra_env or {})
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
    )
    if check:
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.timeout(INSTALL_TIMEOUT_S * 2)
def test_install__without_the_postgres_extra__a_sqlite_site_runs_without_psycopg(wheel, tmp_path):
    site = Site(tmp_path, str(wheel))
    assert not site.can_import("psycopg")
    assert site.run_one_job() == "hello world"

    # A site on psycopg2 is not switched to psycopg 3: the check says what to install.
    site.pip("install", "-q", "--disable-pip-version-check", "psycopg2-binary")
    checked = site.manage("check", check=False, SHOP_DATABASE="postgresql")
    assert checked.returncode == 1
    assert "(alkstore.E202)" in checked.stderr
    assert "pip install 'alkstore-django[postgres]'" in checked.stderr


@pytest.mark.timeout(INSTALL_TIMEOUT_S * 2)
def test_install__with_the_postgres_extra__brings_psycopg_3(wheel, tmp_path):
    site = Site(tmp_path, f"{wheel}[postgres]")
    assert site.can_import("psycopg")
    assert site.run_one_job() == "hello world"
    checked = site.manage("check", SHOP_DATABASE="postgresql")
    assert "no issues" in checked.stdout
