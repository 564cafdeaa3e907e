"""The worker's wake-up (``worker/wake.py``): an Event the main thread waits on beside a socket."""

from __future__ import annotations

import socket
import threading
import time

from alkstore_django.worker.wake import Wake


class SocketWatch:
    """A watch whose wake-ups arrive on a real socket: ``look`` reads them and sets the wake."""

    def __init__(self, wake: Wake) -> None:
        self.wake = wake
        self.inbox, self.sender = socket.socketpair()
        self.inbox.setblocking(False)
        self.looks = 0
        self.heard = 0

    def fileno(self) -> int:
        return self.inbox.fileno()

    def look(self, timeout_s: float) -> None:
        self.looks += 1
        try:
            got = self.inbox.recv(64)
        except BlockingIOError:
            return
        self.heard += len(got)
        self.wake.set()

    def missed(self) -> None:
        self.wake.set()

    def close(self) -> None:
        self.inbox.close()
        self.sender.close()


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


def test_wake__a_set_already_cleared_does_not_count_as_a_wake_up():
    # The byte a set leaves behind may outlive the flag: the next wait ends
    # early, unset, and the one after waits its time out.
    wake = Wake()
    wake.start()
    try:
        setter = threading.Thread(target=wake.set)
        setter.start()
        setter.join()
        wake.clear()
        assert wake.wait(0.2) is False
        began = time.monotonic()
        assert wake.wait(0.2) is False
        assert time.monotonic() - began >= 0.15
    finally:
        wake.close()


def test_wake__reads_its_watch_in_its_own_wait_without_a_thread_between():
    wake = Wake()
    watch = SocketWatch(wake)
    wake.start(watch)  # type: ignore[arg-type]
    try:
        threading.Timer(0.05, lambda: watch.sender.send(b"n")).start()
        began = time.monotonic()
        assert wake.wait(5) is True
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


def test_wake__before_start_is_a_plain_event():
    wake = Wake()
    assert wake.wait(0.01) is False
    wake.set()
    assert wake.wait(0.01) is True
    wake.close()
