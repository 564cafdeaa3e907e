"""The shop's business rows; the jobs write what they did back here."""

from django.db import models


class Order(models.Model):
    """An order; its confirmation email and webhook are background work."""

    customer_email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"order {self.pk} for {self.customer_email}"


class Report(models.Model):
    """One run of the scheduled stock report."""

    kind = models.CharField(max_length=32)
    orders_seen = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.kind} report at {self.created_at:%H:%M:%S}"
