"""Autovacuum: per-table storage parameters on the hot tables, on PostgreSQL only.

The values and why are in ``dialects/postgresql/autovacuum.py`` and
docs/scale.md#autovacuum. Through the dialect hook, as every engine-specific
step of this app's migrations is: other engines do nothing. Reversing the
migration ``RESET``s every parameter it set, back to the server's settings.
"""

from django.db import migrations


def tune(apps, schema_editor):
    from alkstore_django.dialects import tune_app_storage

    tune_app_storage(apps, schema_editor)


def untune(apps, schema_editor):
    from alkstore_django.dialects import untune_app_storage

    untune_app_storage(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("alkstore_django", "0015_tracing"),
    ]

    operations = [migrations.RunPython(tune, untune, elidable=False)]
