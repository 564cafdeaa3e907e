"""``manage.py shop_report``: what the background work did."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from shop.models import Order, Report


class Command(BaseCommand):
    help = "Show each order's confirmation and webhook, and the scheduled reports."

    def handle(self, *args: Any, **options: Any) -> None:
        for order in Order.objects.order_by("pk"):
            self.stdout.write(
                f"order {order.pk} {order.customer_email}: "
                f"emailed={'yes' if order.confirmed_at else 'no'} "
                f"webhook={'yes' if order.published_at else 'no'}"
            )
        self.stdout.write(f"scheduled stock reports run: {Report.objects.count()}")
