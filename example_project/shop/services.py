"""Placing an order: the business write and its background work commit together."""

from __future__ import annotations

from django.db import transaction

from alkstore_django import store

from .models import Order


def place_order(customer_email: str, total_cents: int) -> Order:
    """Create an order, queue its confirmation email and publish its webhook.

    All three commit or roll back as one: a crash before the commit leaves no
    order and no job; after it, the email and the webhook are durable.
    """
    with transaction.atomic():
        order = Order.objects.create(customer_email=customer_email, total_cents=total_cents)
        store.queue("emails").enqueue({"order_id": order.pk})
        store.outbox("webhooks").enqueue({"event": "order.placed", "order_id": order.pk})
    return order
