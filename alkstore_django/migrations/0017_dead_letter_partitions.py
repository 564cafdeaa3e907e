"""PostgreSQL: the dead letters in one partition per UTC day, so old days are dropped whole.

The table is converted with its rows in the migration's transaction; its
primary key becomes ``(id, died_at)`` there, while Django's state keeps ``id``
(see ``dialects/postgresql/partitions.py``). Reversible. Other engines: nothing.
"""

from django.db import migrations


def partition(apps, schema_editor):
    from alkstore_django.dialects.postgresql.partitions import partition_dead_letters

    partition_dead_letters(apps, schema_editor)


def unpartition(apps, schema_editor):
    from alkstore_django.dialects.postgresql.partitions import unpartition_dead_letters

    unpartition_dead_letters(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [
        ("alkstore_django", "0016_autovacuum"),
    ]

    operations = [migrations.RunPython(partition, unpartition)]
