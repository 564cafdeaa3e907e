"""``manage.py runscheduler``: lead the schedules, or stand by for failover."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from alkstore_django.conf import app_settings
from alkstore_django.management.arguments import database_alias, seconds
from alkstore_django.management.service import start_service
from alkstore_django.scheduler import STANDBY_RETRY_S, serve
from alkstore_django.store import Store

MAX_STANDBY_INTERVAL_S = 3600.0


class Command(BaseCommand):
    help = (
        "Run the leader-elected schedule loop. Several may run for failover: one "
        "leads, the others stand by. SIGTERM or SIGINT releases leadership and exits 0. "
        "-v 0 logs warnings only, -v 2 and 3 add debug lines, unless LOGGING handles alkstore."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            type=database_alias,
            default=None,
            help="The DATABASES alias of the alkstore tables (default: ALKSTORE['DATABASE']).",
        )
        parser.add_argument(
            "--standby-interval",
            type=seconds(MAX_STANDBY_INTERVAL_S, zero_allowed=False),
            default=STANDBY_RETRY_S,
            help=f"Seconds between leadership attempts while standing by "
            f"(default {STANDBY_RETRY_S:g}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        stop = start_service(options["verbosity"], alias or app_settings.database)
        serve(Store(alias), stop, retry_s=options["standby_interval"])
