"""The shop's handlers, found by autodiscovery when the worker starts."""

from __future__ import annotations

import logging

from django.utils import timezone

from alkstore_django import Fail, handler

from .models import Order, Report

logger = logging.getLogger(__name__)


@handler("emails")
def send_confirmation(job):
    """Send the order confirmation (here: log it and stamp the order)."""
    order = Order.objects.filter(pk=job.payload["order_id"]).first()
    if order is None:
        raise Fail(f"order {job.payload['order_id']} does not exist")
    logger.info("emailing %s about order %s", order.customer_email, order.pk)
    Order.objects.filter(pk=order.pk).update(confirmed_at=timezone.now())


@handler.outbox("webhooks")
def publish(job):
    """Deliver the event to subscribers (here: stamp the order as published)."""
    Order.objects.filter(pk=job.payload["order_id"]).update(published_at=timezone.now())


@handler("reports")
def stock_report(job):
    """The scheduled report: count the orders so far."""
    Report.objects.create(kind=job.payload["kind"], orders_seen=Order.objects.count())
