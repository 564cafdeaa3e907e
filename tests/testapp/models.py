"""Rows the test handlers write, so a test can check exactly what ran."""

from django.db import models


class Run(models.Model):
    """One handler run of one job attempt."""

    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    queue = models.CharField(max_length=200)
    worker_id = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"run of job {self.job_id} attempt {self.attempt}"


class Order(models.Model):
    """A business row written in the same transaction as an enqueue."""

    reference = models.CharField(max_length=64)

    def __str__(self) -> str:
        return self.reference
