"""``manage.py runscheduler``: lead the schedules, or stand by for failover."""

from __future__ import annotations

import math
import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from alkstore_django.scheduler import STANDBY_RETRY_S, serve
from alkstore_django.store import Store


class Command(BaseCommand):
    help = (
        "Run the leader-elected schedule loop. Several may run for failover: one "
        "leads, the others stand by. SIGTERM or SIGINT releases leadership and exits 0."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=None,
            help="The DATABASES alias of the alkstore tables (default: ALKSTORE['DATABASE']).",
        )
        parser.add_argument(
            "--standby-interval",
            type=float,
            default=STANDBY_RETRY_S,
            help=f"Seconds between leadership attempts while standing by "
            f"(default {STANDBY_RETRY_S:g}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if alias is not None and alias not in settings.DATABASES:
            raise CommandError(
                f"Unknown database {alias!r}: expected one of {', '.join(settings.DATABASES)}."
            )
        interval = options["standby_interval"]
        if not math.isfinite(interval) or not 0 < interval <= 3600:
            raise CommandError(
                f"Invalid --standby-interval {interval!r}: expected seconds from above 0 to 3600."
            )
        stop = threading.Event()

        def request_stop(signum: int, frame: Any) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)
        serve(Store(alias), stop, retry_s=interval)
