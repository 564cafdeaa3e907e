"""Bench settings: a plain site with Django's defaults (CONN_MAX_AGE=0, no pooling).

``BENCH_DATABASE_URL`` selects the engine: ``postgres://user@host:port/name`` or
``sqlite:////absolute/path.sqlite3``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

SECRET_KEY = "alkstore-bench-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["alkstore_django", "bench.app"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def database_from_url(url: str) -> dict[str, object]:
    """Return a DATABASES entry for a postgres://, mysql:// or sqlite:/// URL."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": unquote(parts.path),
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    if parts.scheme == "mysql":
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": parts.path.lstrip("/"),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": {"charset": "utf8mb4"},
        }
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


# The bench's PostgreSQL database when ``BENCH_DATABASE_URL`` names none.
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/alk_perf_bench"
DATABASES = {"default": database_from_url(os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))}

# The queue-control rows of the drain (bench/run.py): the same no-op handler
# under a max_running and under a rate, next to the plain bench.noop. An
# earlier checkout run by --baseline has no queue controls (its checks would
# refuse the options), so they are set only where the package has them.
_package = importlib.util.find_spec("alkstore_django")
_has_controls = (
    _package is not None
    and _package.origin is not None
    and (Path(_package.origin).parent / "dialects" / "controls.py").exists()
)
ALKSTORE: dict[str, Any] = {
    "QUEUES": {
        "bench.limited": {"max_running": 16},
        "bench.rated": {"rate": "3000/s"},
    }
    if _has_controls
    else {}
}
# The keyed drain (bench/steering.py): the no-op handler under a limit per
# concurrency key, set by ``drain-keyed``'s PER_KEY for its workers too. Only
# where the package has the keyed claim: an earlier checkout would refuse it.
_has_keys = (
    _package is not None
    and _package.origin is not None
    and (Path(_package.origin).parent / "dialects" / "keys.py").exists()
)
if _has_keys:
    ALKSTORE["QUEUES"]["bench.keyed"] = {
        "max_running_per_key": int(os.environ.get("BENCH_MAX_RUNNING_PER_KEY", "4"))
    }

# The producers rows of the floors (bench/floors.py): alkstore with every
# commit notifying (0), beside its default coalesced wake-ups. Set only when
# asked, so every other bench runs on the default.
if "BENCH_NOTIFY_COALESCE_S" in os.environ:
    ALKSTORE["NOTIFY_COALESCE_S"] = float(os.environ["BENCH_NOTIFY_COALESCE_S"])
