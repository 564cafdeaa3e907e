"""NOTIFY channel names and payload limits never break a wake-up.

PostgreSQL identifiers are at most 63 bytes and NOTIFY payloads under 8,000
bytes; every valid name maps to a short digest channel, and a refused payload
leaves the listener working. The same tests run on SQLite, where
``store.notify`` writes a message row and wake-ups come from the file watch.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from alkstore_django import store
from alkstore_django.errors import InvalidArgument
from alkstore_django.notify import MAX_NOTIFY_PAYLOAD_BYTES, open_watcher
from alkstore_django.queues import channel_for
from alkstore_django.validation import MAX_NAME_LENGTH
from tests.helpers import BOUNDED, HOSTILE_NAMES, waiting_worker

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_S = 5.0
valid_names = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
    min_size=1,
    max_size=MAX_NAME_LENGTH,
)


@BOUNDED
@given(name=valid_names, other=valid_names)
def test_channel_for__any_valid_name_is_a_short_safe_identifier(name, other):
    channel = channel_for(name)
    assert len(channel.encode()) <= 63
    assert channel.isascii() and channel.replace("_", "").isalnum()
    assert (channel == channel_for(other)) == (name == other)


def receive(listener) -> list:
    return [(n.channel, n.payload) for n in listener]


@pytest.mark.parametrize("name", [*HOSTILE_NAMES, "é" * MAX_NAME_LENGTH])
def test_notify__odd_and_long_channel_names_are_delivered(name):
    listener = store.listen([name], WAIT_S)
    store.notify(name, "hello")
    assert next(listener) .channel == name  # fmt: skip
    listener.close()


@pytest.mark.parametrize("payload", ["x" * MAX_NOTIFY_PAYLOAD_BYTES, "é" * 3999 + "a", ""])
def test_notify__payloads_up_to_the_limit_are_delivered_whole(payload):
    listener = store.listen(["limits"], WAIT_S)
    store.notify("limits", payload)
    note = next(listener)
    assert (note.channel, note.payload) == ("limits", payload)
    listener.close()


@pytest.mark.parametrize(
    "payload",
    ["x" * (MAX_NOTIFY_PAYLOAD_BYTES + 1), "é" * 4000, "nul\x00", "lone \ud800", b"bytes", None],
    ids=["8000-ascii", "8000-utf8", "nul", "surrogate", "bytes", "none"],
)
def test_notify__a_refused_payload_leaves_the_wake_up_working(payload):
    listener = store.listen(["limits"], WAIT_S)
    with pytest.raises(InvalidArgument):
        store.notify("limits", payload)
    store.notify("limits", "still works")
    note = next(listener)
    assert (note.channel, note.payload) == ("limits", "still works")
    listener.close()


@pytest.mark.parametrize("name", [HOSTILE_NAMES[0], HOSTILE_NAMES[4], "é" * MAX_NAME_LENGTH])
def test_enqueue__on_an_odd_or_long_queue_name_wakes_its_watcher(name):
    watcher = open_watcher(store, [channel_for(name)], queues=[name])
    try:
        with waiting_worker(name):  # producers wake only a waiting worker
            store.queue(name).enqueue({"odd": name})
        assert watcher.wait(WAIT_S)
    finally:
        watcher.close()
