"""Settings for Django's own tests/tasks run against AlkstoreBackend (see run.py).

The project's test settings, on a database of its own so the run can sit next to
a pytest session on the same server, with ``TASKS`` pointing at alkstore.
"""

from __future__ import annotations

from pathlib import Path

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

SUITE_BACKEND = "tests.django_tasks_suite.backends.SuiteBackend"
SUITE_IMMEDIATE_BACKEND = "tests.django_tasks_suite.backends.SuiteImmediateBackend"

_db = DATABASES["default"]
if _db["ENGINE"].endswith("sqlite3"):
    _path = Path(_db["NAME"])
    _db["NAME"] = str(_path.with_name(f"{_path.stem}_djsuite{_path.suffix}"))
    _db["TEST"] = {"NAME": _db["NAME"]}
else:
    _db["TEST"] = {"NAME": f"test_{_db['NAME']}_djsuite"}

TASKS = {"default": {"BACKEND": SUITE_BACKEND, "QUEUES": []}}
