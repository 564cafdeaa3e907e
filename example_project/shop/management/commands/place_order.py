"""``manage.py place_order EMAIL TOTAL_CENTS``: an order with its jobs, in one transaction."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from shop.services import place_order


class Command(BaseCommand):
    help = "Place an order; its confirmation email and webhook commit with it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("email")
        parser.add_argument("total_cents", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        order = place_order(options["email"], options["total_cents"])
        self.stdout.write(f"placed order {order.pk} for {order.customer_email}")
