"""The handler registry: one handler per queue, conflicts recorded for the check, never raised."""

from __future__ import annotations

import threading

import pytest

from alkstore_django.errors import InvalidArgument
from alkstore_django.handlers import HandlerRegistry
from alkstore_django.worker import Worker


def first(job):
    return None


def second(job):
    return None


class Runner:
    """A callable object, like the Tasks backend's runner: its repr is its path."""

    def __call__(self, job):
        return None

    def __repr__(self) -> str:
        return "shop.runners.runner"


def test_register__a_second_handler_is_recorded_not_raised():
    registry = HandlerRegistry()
    registry.register("q", first)
    registry.register("q", second)  # at app loading: must not raise
    assert registry.conflicts() == {
        "q": f"Queue 'q' has 2 handlers ({__name__}.first, {__name__}.second): "
        "expected one handler per queue."
    }
    assert registry.queues() == ["q"]


def test_register__the_same_function_again_is_no_conflict():
    registry = HandlerRegistry()
    registry.register("q", first)
    registry.register("q", first)
    assert registry.conflicts() == {}
    assert registry.get("q") is first


def test_get__refuses_a_queue_with_two_handlers_with_the_check_message():
    registry = HandlerRegistry()
    registry.register("q", first)
    registry.register("q", second)
    registry.register("other", first)
    with pytest.raises(InvalidArgument) as caught:
        registry.get("q")
    assert str(caught.value) == registry.conflicts()["q"]
    assert registry.get("other") is first


def test_conflict_message__names_a_callable_object_by_its_repr_once():
    registry = HandlerRegistry()
    registry.register("q", first)
    registry.register("q", Runner())
    message = registry.conflicts()["q"]
    assert "(tests.unit.test_handlers.first, shop.runners.runner)" in message
    assert "test_handlers.shop" not in message


@pytest.mark.django_db
def test_worker__refuses_to_start_on_a_queue_with_two_handlers():
    registry = HandlerRegistry()
    registry.register("q", first)
    registry.register("q", second)
    with pytest.raises(InvalidArgument, match=r"Queue 'q' has 2 handlers"):
        Worker(["q"], handlers=registry, burst=True).run(threading.Event())
