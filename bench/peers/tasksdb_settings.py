"""Settings for the django-tasks-db peer: Django's defaults, its database backend."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ["BENCH_DATABASE_URL"])
SECRET_KEY = "alkstore-bench-not-secret"
USE_TZ = True
INSTALLED_APPS = ["django_tasks_db"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}
TASKS = {
    "default": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        "QUEUES": ["default", "latency"],
    }
}
