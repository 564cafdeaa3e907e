"""``AlkstoreRouter``: alkstore's tables on their own database, for ``DATABASE_ROUTERS``.

With ``ALKSTORE["DATABASE"]`` naming an alias other than ``default``, a site
adds this router so that ``migrate`` creates alkstore's tables only where
they are used (``migrate --database <alias>``; a plain ``migrate`` of
``default`` leaves them out) and so that the models, read through the ORM
without ``.using()`` (a site's own queries, a custom admin), go to that alias.
alkstore's own code always names its alias; the router is for everything else.

The aliases are read from the settings on every call, never kept, so
``override_settings`` works and a queue routed to a shard by ``QUEUES[name]
["database"]`` gets the tables there too. A site with routers of its own lists
this one first: Django asks routers in order and takes the first answer.
"""

from __future__ import annotations

from typing import Any

from .conf import app_settings

APP_LABEL = "alkstore_django"


class AlkstoreRouter:
    """Send alkstore's models to ``ALKSTORE["DATABASE"]`` and migrate them only on its aliases."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return app_settings.database if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return app_settings.database if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        both = obj1._meta.app_label == APP_LABEL and obj2._meta.app_label == APP_LABEL
        return True if both else None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        """Migrate alkstore on ``DATABASE`` and every queue's ``database``, nowhere else."""
        if app_label != APP_LABEL:
            return None
        return db in app_settings.aliases
