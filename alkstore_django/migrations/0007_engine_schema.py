"""Let the database's engine adjust the app's tables (MariaDB/MySQL; nothing elsewhere).

MariaDB and MySQL get a binary, no-pad collation (names compare exactly, as on
PostgreSQL and SQLite) and an ``alk_job_claim`` led by ``(queue, state)``,
since they have no partial indexes. See ``Dialect.prepare_schema``.
"""

from django.db import migrations


def prepare(apps, schema_editor):
    from alkstore_django.dialects import prepare_app_schema

    prepare_app_schema(apps, schema_editor)


class Migration(migrations.Migration):
    # MySQL cannot roll DDL back, and Django refuses DDL inside a transaction there.
    atomic = False

    dependencies = [
        ("alkstore_django", "0006_queue_overview"),
    ]

    operations = [migrations.RunPython(prepare, migrations.RunPython.noop)]
