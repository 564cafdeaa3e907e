"""Signals for ``@handler`` jobs, matching what Django's Tasks framework sends for tasks.

A site hooks OpenTelemetry, Sentry or its own metrics here::

    from alkstore_django.signals import job_finished

    @receiver(job_finished)
    def on_finished(sender, job, outcome, result, **kwargs): ...

The sender is the queue's name, so ``@receiver(job_finished, sender="emails")``
listens to one queue.

- ``job_enqueued(sender, job_ids)`` — sent by ``enqueue`` and ``enqueue_many``
  once the rows are written (inside the caller's transaction, if any, as
  Django's ``task_enqueued`` is). A receiver's exception reaches the caller, as
  with any ``Signal.send``.
- ``job_started(sender, job)`` — sent in the process that runs the handler (a
  child process in the process pool), right before it.
- ``job_finished(sender, job, outcome, result)`` — sent once the outcome is
  durable, by whatever applied it (the worker, its sentinel, ``run_once``, the
  test helpers): ``result`` is ``acked``, ``retried``, ``dead``, ``cancelled`` or ``lost``;
  ``outcome`` (an ``executor.Outcome``) carries the error text, the exception's
  class path and traceback, and the exception itself when the handler ran in
  this process.

Receivers of ``job_started`` and ``job_finished`` run on the worker's threads;
their exceptions are logged and never stop the worker or change an outcome.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger(__name__)

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()


def send_robust(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal``; a receiver's error is logged, never raised.

    A receiver must not undo an outcome's transaction or stop a worker. With
    no receiver connected (the usual case) it returns at once: it runs twice
    per job on the worker's hot path.
    """
    if not signal.receivers:
        return
    for receiver, response in signal.send_robust(sender, **kwargs):
        if isinstance(response, Exception):
            logger.error("signal receiver %r raised", receiver, exc_info=response)
