"""App configuration: checks, SQLite pragmas, and handler autodiscovery at start-up."""

from __future__ import annotations

import django
from django.apps import AppConfig


class AlkstoreConfig(AppConfig):
    name = "alkstore_django"
    verbose_name = "Background work"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed
        from django.db.backends.signals import connection_created

        from . import checks, handlers
        from .store import prepare_connection, reset_on_setting_changed

        checks.register()
        connection_created.connect(prepare_connection, dispatch_uid="alkstore_prepare")
        setting_changed.connect(reset_on_setting_changed, dispatch_uid="alkstore_reset")
        handlers.autodiscover()
        if django.VERSION >= (6, 0):
            # django.tasks exists only on Django 6: the backend module is imported only there.
            from .tasks.backend import register_task_runners

            register_task_runners()
