"""A private D-Bus bus with a stand-in for systemd's manager on it, for the systemd driver's tests on a
host without systemd: ``fake_systemd`` starts a ``dbus-daemon`` of the test's own (its socket in a
temporary directory), points ``DBUS_SYSTEM_BUS_ADDRESS`` at it, and answers
org.freedesktop.systemd1.Manager's calls the driver makes (Subscribe, StartTransientUnit, StopUnit,
SetUnitProperties) from a thread: each unit job ends ``job_delay`` seconds after its call with the
JobRemoved signal systemd sends, result "done". The calls are recorded (:attr:`FakeSystemd.calls`);
a unit named in :attr:`FakeSystemd.missing` is answered NoSuchUnit, as systemd answers for a unit it
does not have.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

MANAGER = ("org.freedesktop.systemd1", "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager")
START_TIMEOUT = 10.0


class FakeSystemd:
    """systemd's manager as the driver sees it, served from a thread on a private bus."""

    def __init__(self, address: str, job_delay: float) -> None:
        from jeepney import message_bus
        from jeepney.io.blocking import open_dbus_connection

        self.job_delay = job_delay
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.missing: set[str] = set()
        self._conn = open_dbus_connection(bus=address)
        reply = self._conn.send_and_get_reply(message_bus.RequestName(MANAGER[0]), timeout=START_TIMEOUT)
        assert reply.body == (1,), f"the private bus did not give us {MANAGER[0]}: {reply.body}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-systemd", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=START_TIMEOUT)
        self._conn.close()

    def _serve(self) -> None:
        from jeepney import DBusAddress, HeaderFields, MessageType, new_error, new_method_return, new_signal

        pending: list[tuple[float, tuple[Any, ...]]] = []  # when, JobRemoved's body
        emitter = DBusAddress(MANAGER[1], interface=MANAGER[2])
        jobs = 0
        while not self._stop.is_set():
            now = time.monotonic()
            for due in [p for p in pending if p[0] <= now]:
                pending.remove(due)
                self._conn.send(new_signal(emitter, "JobRemoved", "uoss", due[1]))
            try:
                msg = self._conn.receive(timeout=0.01)
            except TimeoutError:
                continue
            fields = msg.header.fields
            if msg.header.message_type is not MessageType.method_call or fields.get(HeaderFields.interface) != MANAGER[2]:
                continue
            member = fields[HeaderFields.member]
            self.calls.append((member, msg.body))
            if member in ("StartTransientUnit", "StopUnit"):
                unit = msg.body[0]
                if unit in self.missing:
                    self._conn.send(new_error(msg, "org.freedesktop.systemd1.NoSuchUnit", "s",
                                              (f"Unit {unit} not loaded.",)))
                    continue
                jobs += 1
                job = f"{MANAGER[1]}/job/{jobs}"
                self._conn.send(new_method_return(msg, "o", (job,)))
                pending.append((time.monotonic() + self.job_delay, (jobs, job, unit, "done")))
            else:
                self._conn.send(new_method_return(msg))


@pytest.fixture
def fake_systemd(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSystemd]:
    """A FakeSystemd on a private bus that is this test's system bus; both gone after the test."""
    daemon = shutil.which("dbus-daemon")
    assert daemon is not None, "the systemd driver's tests need dbus-daemon: run .ci/install --test"
    directory = tempfile.mkdtemp(prefix="fake-bus-")
    address = f"unix:path={directory}/bus"
    bus = subprocess.Popen([daemon, "--session", "--nofork", "--nopidfile", f"--address={address}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fake = None
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(f"{directory}/bus"):
            assert bus.poll() is None and time.monotonic() < deadline, "the private dbus-daemon did not start"
            time.sleep(0.01)
        fake = FakeSystemd(address, job_delay=0.5)
        monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", address)
        yield fake
    finally:
        if fake is not None:
            fake.close()
        bus.kill()
        bus.wait()
        shutil.rmtree(directory, ignore_errors=True)
