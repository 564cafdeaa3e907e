"""Test settings: ``DATABASE_URL`` selects the engine; SQLite is a real file."""

from __future__ import annotations

import os
from pathlib import Path

import django
import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SQLITE_PATH = Path(
    os.environ.get("ALKSTORE_TEST_SQLITE", BASE_DIR / ".test-db" / "alkstore.sqlite3")
)
SQLITE_PATH.parent.mkdir(parents=True, exist_ok=True)

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{SQLITE_PATH}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not :memory:, so threads, processes and worker subprocesses share it.
    DATABASES["default"]["TEST"] = {"NAME": str(DATABASES["default"]["NAME"])}
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}
elif DATABASES["default"]["ENGINE"].endswith("mysql"):
    # What docs/deployment.md asks of a MariaDB/MySQL site: utf8mb4 throughout.
    DATABASES["default"]["OPTIONS"] = {"charset": "utf8mb4"}
    DATABASES["default"]["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_nopad_bin"}

# An engine alkstore has no dialect for (never connected to): for the checks' E006
# and dialect_for's refusal.
DATABASES["legacy"] = {"ENGINE": "django.db.backends.dummy"}


if os.environ.get("DIRECT_DATABASE_URL"):
    # Behind a transaction-mode pooler (scripts/test.sh's pgbouncer run), as
    # docs/deployment.md advises: no server-side cursors or named prepared
    # statements through the pooler, and LISTEN over a direct connection.
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["direct"] = env.db("DIRECT_DATABASE_URL")
    DATABASES["direct"]["TEST"] = {"MIRROR": "default"}


def beside(suffix: str) -> dict[str, object]:
    """Return a database like ``default``'s, on the same server, named with ``suffix``.

    Behind the pooler it is a direct connection: its test database is created
    and dropped there, which PgBouncer's held server sessions would refuse.
    """
    like = DATABASES.get("direct", DATABASES["default"])
    other = {**like, "NAME": f"{like['NAME']}_{suffix}"}
    if other["ENGINE"].endswith("sqlite3"):
        name = str(like["NAME"]).removesuffix(".sqlite3") + f"_{suffix}.sqlite3"
        other.update(NAME=name, TEST={"NAME": name})
    else:
        kept = ("CHARSET", "COLLATION")
        other["TEST"] = {k: v for k, v in other.get("TEST", {}).items() if k in kept}
    return other


# ALKSTORE_TEST_QUEUE_DATABASE=1 (scripts/test.sh's "queue database" run): alkstore's
# tables on a database of their own beside the site's, through the router (docs/scale.md).
QUEUE_DATABASE = os.environ.get("ALKSTORE_TEST_QUEUE_DATABASE") == "1"
# A shard, for tests/integration/test_databases.py (which routes the queue "sharded"
# there). Not in a test's child process (conftest's subprocess_env), whose system
# checks would connect to it (MySQL asks each alias's server about JSON), unless
# routed to: a child that needs it adds it, DATABASES["shard"] = beside("shard").
if os.environ.get("ALKSTORE_TEST_CHILD") != "1" or QUEUE_DATABASE:
    DATABASES["shard"] = beside("shard")
if QUEUE_DATABASE:
    DATABASES["queues"] = beside("queues")
    DATABASE_ROUTERS = ["alkstore_django.routers.AlkstoreRouter"]

SECRET_KEY = "alkstore-tests-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "alkstore_django",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ALKSTORE: dict[str, object] = {"POLL_INTERVAL_S": 1.0}
if QUEUE_DATABASE:
    # Routed here too, so that the router migrates alkstore's tables on the shard.
    ALKSTORE.update(DATABASE="queues", QUEUES={"sharded": {"database": "shard"}})
if "direct" in DATABASES:
    ALKSTORE["LISTEN_DATABASE"] = "direct"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"alkstore_django": {"handlers": ["console"], "level": "INFO"}},
}

if django.VERSION >= (6, 0):
    # Django's Tasks framework on alkstore (tests/tasks). "retry" turns retries on.
    TASKS = {
        "default": {
            "BACKEND": "alkstore_django.tasks.AlkstoreBackend",
            "QUEUES": ["default", "tasks-retry", "tasks-kill"],
        },
        "retry": {
            "BACKEND": "alkstore_django.tasks.AlkstoreBackend",
            "QUEUES": ["tasks-retry"],
            "OPTIONS": {"max_attempts": 3},
        },
    }
