"""Named leases with fencing tokens, timed by the database's clock."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING

from .errors import InvalidArgument, LockNotAcquired
from .validation import MAX_NAME_LENGTH, is_encodable, validate_duration, validate_name

if TYPE_CHECKING:
    from .store import Store

logger = logging.getLogger(__name__)

# Room for the pid and the random part inside the 200-character owner column.
_HOST_MAX_LENGTH = 120


def default_owner() -> str:
    """Return a fresh owner token unique to this process and call: host, pid, random."""
    host = socket.gethostname()[:_HOST_MAX_LENGTH] or "localhost"
    return f"{host}:{os.getpid()}:{secrets.token_hex(8)}"


def validate_owner(owner: object) -> str:
    """Return ``owner`` when it is a non-empty string of at most 200 characters."""
    if (
        not isinstance(owner, str)
        or not owner
        or len(owner) > MAX_NAME_LENGTH
        or not is_encodable(owner)
    ):
        raise InvalidArgument(
            f"Invalid lock owner {owner!r}: expected a non-empty string of at most "
            f"{MAX_NAME_LENGTH} characters."
        )
    return owner


class LockHandle:
    """A held lease on the lock ``name``.

    ``fence`` grows every time the lock changes hands, so whatever the holder
    writes to can refuse a token older than the newest it has seen.
    ``expires_at`` is the lease's end by the database clock, as of the last
    take or renewal through this handle.
    """

    def __init__(
        self, store: Store, name: str, owner: str, fence: int, expires_at: datetime, ttl_s: float
    ) -> None:
        self.store = store
        self.name = name
        self.owner = owner
        self.fence = fence
        self.expires_at = expires_at
        self.ttl_s = ttl_s

    def __repr__(self) -> str:
        return f"<LockHandle {self.name!r} owner={self.owner!r} fence={self.fence}>"

    def renew(self, ttl_s: float | None = None) -> bool:
        """Reset the lease to end ``ttl_s`` from now (absolute, not added).

        ``ttl_s`` defaults to the TTL the lock was taken with. Returns False,
        changing nothing, once the lease is lost: expired, released, or taken
        by another owner.
        """
        self.store.check_open()
        if ttl_s is not None:
            ttl_s = validate_duration("ttl_s", ttl_s, allow_zero=False)
        ttl = self.ttl_s if ttl_s is None else ttl_s
        expires_at = self.store.dialect.renew_lock(self.name, self.owner, self.fence, ttl)
        if expires_at is None:
            return False
        self.expires_at = expires_at
        return True

    def release(self) -> bool:
        """Give the lease up now; False when it was already lost (or released)."""
        self.store.check_open()
        return self.store.dialect.release_lock(self.name, self.owner, self.fence)


def acquire(store: Store, name: str, *, ttl_s: float, owner: str) -> LockHandle | None:
    """Take the lease without validating its name: for the app's reserved locks."""
    taken = store.dialect.acquire_lock(name, owner, ttl_s)
    if taken is None:
        return None
    fence, expires_at = taken
    return LockHandle(store, name, owner, fence, expires_at, ttl_s)


def try_lock(
    store: Store, name: str, *, ttl_s: float, owner: str | None = None
) -> LockHandle | None:
    """Take the lease ``name`` for ``ttl_s`` seconds, or return None if another owner holds it.

    A free lock, or one whose lease has expired, is taken (the fence grows).
    The same owner asking again while its lease is live renews it (the fence
    stays). ``owner`` defaults to a token unique to this process and call.
    One statement; inside ``transaction.atomic()`` it joins the caller's
    transaction, so the lease is visible to others only once that commits.
    Raises ``InvalidName``/``ReservedName``/``InvalidArgument`` before any query.
    """
    store.check_open()
    validate_name("lock", name)
    ttl = validate_duration("ttl_s", ttl_s, allow_zero=False)
    owner = default_owner() if owner is None else validate_owner(owner)
    return acquire(store, name, ttl_s=ttl, owner=owner)  # type: ignore[arg-type]


@contextmanager
def lock(
    store: Store, name: str, *, ttl_s: float, owner: str | None = None
) -> Iterator[LockHandle]:
    """Hold the lease ``name`` for the block and release it on the way out.

    Raises ``LockNotAcquired`` when another owner holds it. The lease is not
    renewed for you: a block that may outlive ``ttl_s`` calls ``held.renew()``.
    """
    held = try_lock(store, name, ttl_s=ttl_s, owner=owner)
    if held is None:
        raise LockNotAcquired(
            f"Lock {name!r} is held by another owner: it is free once that lease is "
            "released or expires."
        )
    try:
        yield held
    finally:
        if not held.release():
            logger.warning("lock lost before release name=%s owner=%s", name, held.owner)
