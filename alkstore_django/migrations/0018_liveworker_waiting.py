"""The live worker's ``waiting`` flag: producers wake only the workers that wait.

The column defaults to true in the database, so a row written by a worker
that predates it is always woken.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("alkstore_django", "0017_dead_letter_partitions"),
    ]

    operations = [
        migrations.AddField(
            model_name="liveworker",
            name="waiting",
            field=models.BooleanField(db_default=True, default=True),
        ),
    ]
