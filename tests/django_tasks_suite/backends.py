"""AlkstoreBackend with the introspection Django's tests expect from its own backends.

Django's tests/tasks read ``backend.results`` and call ``backend.clear()`` (the
DummyBackend's API), and expect the ImmediateBackend to have run a task by the
time ``enqueue`` returns. These subclasses add exactly that on top of the real
backend; enqueue, results and the worker path are alkstore's own.
"""

from __future__ import annotations

from typing import Any

from alkstore_django.models import DeadJob, Job
from alkstore_django.models import TaskResult as TaskResultRow
from alkstore_django.tasks import AlkstoreBackend, TaskCall
from alkstore_django.testing import run_ready_tasks


class SuiteBackend(AlkstoreBackend):
    """AlkstoreBackend plus DummyBackend's ``results`` and ``clear()``."""

    def _ids(self) -> list[int]:
        using = self.store.using
        ids = set()
        for model in (Job, DeadJob):
            for job_id, payload in model.objects.using(using).values_list("id", "payload"):
                call = TaskCall.from_payload(payload)
                if call is not None and call.backend == self.alias:
                    ids.add(job_id)
        rows = TaskResultRow.objects.using(using).filter(backend=self.alias)
        ids.update(rows.values_list("id", flat=True))
        return sorted(ids)

    @property
    def results(self) -> list[Any]:
        return [self.get_result(str(job_id)) for job_id in self._ids()]

    def clear(self) -> None:
        ids = self._ids()
        using = self.store.using
        for model in (Job, DeadJob, TaskResultRow):
            model.objects.using(using).filter(id__in=ids).delete()


class SuiteImmediateBackend(SuiteBackend):
    """Run each task through ``run_ready_tasks`` (the worker's path) before returning."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        result = super().enqueue(task, args, kwargs)
        run_ready_tasks(self.store.using, backend=self.alias, queues=[task.queue_name])
        return self.get_result(result.id)
