"""Workflows: a graph of steps, each an ordinary job, released as the steps before it succeed.

- ``graph``: the ``Workflow`` builder and its checks (no database);
- ``progress``: the steps' moves (release, finish, cancel, resume), each in
  the transaction of the job's outcome, the workflow's row locked first;
- ``service``: what ``Store`` offers (enqueue, read, list, cancel).

Only the builder is imported here: the package root exports it, and it
imports no models.
"""

from __future__ import annotations

from .graph import Workflow

__all__ = ["Workflow"]
