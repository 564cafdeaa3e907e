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


class ChaosRun(models.Model):
    """One handler run in the chaos suite, keyed by (job id, attempt).

    The key makes the fencing check exact: a second run of the same attempt
    would be a broken claim, so the handler counts it in ``duplicates``
    instead of hiding it behind an integrity error.
    """

    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    queue = models.CharField(max_length=200)
    worker_id = models.CharField(max_length=200, blank=True, default="")
    pid = models.IntegerField(default=0)
    duplicates = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job_id", "attempt"], name="chaosrun_job_attempt")
        ]

    def __str__(self) -> str:
        return f"chaos run of job {self.job_id} attempt {self.attempt}"
