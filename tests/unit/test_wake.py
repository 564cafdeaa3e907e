"""The worker's wake-up (``worker/wake.py``): an Event the main thread waits on beside a socket."""

from __future__ import annotations

import random
import socket
import threading
import time

import pytest

from alkstore_django.worker.wake import FIRST_CONNECT_S, Wake


class SocketWatch:
    """A watch whose wake-ups arrive on a real socket: ``look`` reads them and sets the wake."""

    def __init__(self, wake: Wake, connecting: threading.Event | None = None) -> None:
        self.wake = wake
        self.inbox, self.sender = socket.socketpair()
        self.inbox.setblocking(False)
        self.looks = 0
        self.heard = 0
        self.missed_times = 0
        self.closed = False
        # Set to let the first look (the connect) end: until then it hangs.
        self.connecting = connecting

    def fileno(self) -> int:
        return self.inbox.fileno()

    def look(self, timeout_s: float) -> None:
        self.looks += 1
        if self.connecting is not None:
            self.connecting.wait()
        try:
            got = self.inbox.recv(64)
        except BlockingIOError:
            return
        self.heard += len(got)
        self.wake.set()

    def missed(self) -> None:
        self.missed_times += 1
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.inbox.close()
        self.sender.close()


def woken(wake: Wake, timeout_s: float) -> bool:
    """Wait until ``wake`` is set: a wait may end early, unset, on a byte an earlier set left."""
    deadline = time.monotonic() + timeout_s
    while not wake.wait(max(deadline - time.monotonic(), 0)):
        if time.monotonic() >= deadline:
            return False
    return True


def closed_within(watch: SocketWatch, timeout_s: float) -> bool:
    """Wait until ``watch`` is closed (by a connecting thread, once it is done)."""
    deadline = time.monotonic() + timeout_s
    while not watch.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return watch.closed


def test_wake__set_from_another_thread_ends_a_wait_at_once():
    wake = Wake()
    wake.start()
    try:
        timer = threading.Timer(0.05, wake.set)
        began = time.monotonic()
        timer.start()
        assert wake.wait(5) is True
        assert time.monotonic() - began < 1
        timer.join()
    finally:
        wake.close()


def test_wake__a_set_while_no_wait_blocks_sends_nothing_a_later_wait_would_read():
    # A busy worker's handler threads set the wake while its main thread does
    # not block: those sets send no byte, so once cleared they do not end the
    # next wait early (each byte cost a send and two reads, a few times a batch).
    wake = Wake()
    wake.start()
    try:
        for _ in range(2):
            setter = threading.Thread(target=wake.set)
            setter.start()
            setter.join()
            wake.clear()
            began = time.monotonic()
            assert wake.wait(0.2) is False
            assert time.monotonic() - began >= 0.15
    finally:
        wake.close()


def test_wake__a_set_racing_a_wait_that_begins_is_never_missed():
    # The setter and the wait each look at what the other wrote first: a set
    # landing as the wait reads the flag or enters its poll still ends it.
    wake = Wake()
    wake.start()
    rng = random.Random(5)
    try:
        for _ in range(300):
            wake.clear()
            delay = rng.random() * 0.0005
            setter = threading.Timer(delay, wake.set)
            setter.start()
            began = time.monotonic()
            assert woken(wake, 5)
            assert time.monotonic() - began < 1
            setter.join()
    finally:
        wake.close()


@pytest.mark.parametrize("again", [False, True], ids=["first_start", "started_again_after_close"])
def test_wake__reads_its_watch_in_its_own_wait_without_a_thread_between(again):
    wake = Wake()
    if again:
        # Closed, then started again with a new watch.
        first = SocketWatch(wake)
        wake.start(first)  # type: ignore[arg-type]
        wake.close()
        assert first.closed
        wake.clear()
    watch = SocketWatch(wake)
    wake.start(watch)  # type: ignore[arg-type]
    try:
        # Connected within start: the worker's first round looks for what was sent before.
        assert wake.is_set()
        assert watch.missed_times == 1
        wake.clear()
        threading.Timer(0.05, lambda: watch.sender.send(b"n")).start()
        began = time.monotonic()
        assert woken(wake, 5)
        assert time.monotonic() - began < 1
        assert watch.heard == 1
        wake.clear()
        looks = watch.looks
        assert wake.wait(0) is False  # a busy round's look: nothing arrived, nothing read
        assert watch.looks == looks
        watch.sender.send(b"n")
        time.sleep(0.05)
        assert wake.wait(0) is True  # …and what did arrive is read without waiting
        assert watch.heard == 2
    finally:
        wake.close()
    assert watch.closed


def test_wake__a_watch_slow_to_connect_does_not_hold_the_main_thread():
    # A connect can hang until the server's timeout; the rounds go on meanwhile.
    connecting = threading.Event()
    wake = Wake()
    watch = SocketWatch(wake, connecting)
    began = time.monotonic()
    wake.start(watch)  # type: ignore[arg-type]
    try:
        assert time.monotonic() - began < FIRST_CONNECT_S + 0.5
        assert wake.wait(0.1) is False
        threading.Timer(0.05, wake.set).start()
        assert woken(wake, 5)  # a handler's set still ends the wait
        wake.clear()
        assert watch.missed_times == 0
        connecting.set()
        assert woken(wake, 5)
        assert watch.missed_times == 1
        wake.clear()
        watch.sender.send(b"n")
        assert woken(wake, 5)  # …and its socket is followed from then on
        assert watch.heard == 1
    finally:
        connecting.set()
        wake.close()
    assert watch.closed


def closed_while_connecting() -> tuple[Wake, SocketWatch, threading.Event]:
    """Return a wake closed while its watch hangs in its connect, the watch, and its release."""
    connecting = threading.Event()
    wake = Wake()
    watch = SocketWatch(wake, connecting)
    wake.start(watch)  # type: ignore[arg-type]
    wake.close()
    return wake, watch, connecting


def test_wake__closed_while_its_watch_connects__the_watch_is_closed_once_connected():
    _, watch, connecting = closed_while_connecting()
    assert not watch.closed  # the connecting thread still has it
    connecting.set()
    assert closed_within(watch, 5)


def test_wake__started_again_while_its_old_watch_connects__the_old_one_is_closed():
    wake, old, connecting = closed_while_connecting()
    new = SocketWatch(wake)
    wake.start(new)  # type: ignore[arg-type]
    try:
        connecting.set()
        assert closed_within(old, 5)
        wake.clear()
        new.sender.send(b"n")
        assert woken(wake, 5)
        assert new.heard == 1
        assert not new.closed
    finally:
        wake.close()


def test_wake__started_again_without_a_close__its_old_socket_pair_and_watch_are_closed():
    wake = Wake()
    old = SocketWatch(wake)
    wake.start(old)  # type: ignore[arg-type]
    old_ends = (wake._reader, wake._writer)
    new = SocketWatch(wake)
    wake.start(new)  # type: ignore[arg-type]
    try:
        assert [end.fileno() for end in old_ends] == [-1, -1]
        assert old.closed
        wake.clear()  # set by the new watch's connect
        new.sender.send(b"n")
        assert woken(wake, 5)
        assert new.heard == 1
    finally:
        wake.close()


def test_wake__before_start_is_a_plain_event():
    wake = Wake()
    assert wake.wait(0.01) is False
    wake.set()
    assert wake.wait(0.01) is True
    wake.close()
