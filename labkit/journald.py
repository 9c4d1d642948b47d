"""A private, real systemd-journald for tests and the demo.

PID 1 is not systemd here, but journald runs by hand. It is started in its own
journal *namespace* (``systemd-journald <ns>``, as ``systemd-journald@.service``
does), so its socket is ``/run/systemd/journal.<ns>/socket`` and nothing mixes
with a journal the machine may have. Stopped by the pid we started; its socket
directory and journal files are removed afterwards.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket as sock
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from labkit.kernel import unique, wait_for

JOURNALD = "/lib/systemd/systemd-journald"


@dataclass
class Journald:
    namespace: str
    socket: str
    pid: int

    def entries(self, *matches: str) -> list[dict[str, Any]]:
        """Entries matching ``FIELD=value`` terms, as ``journalctl -o json`` gives them."""
        out = subprocess.run(
            ["journalctl", f"--namespace={self.namespace}", "--no-pager", "-o", "json", *matches],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def wait_entries(self, *matches: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Entries, waiting until at least one matches (journald writes asynchronously)."""
        found: list[dict[str, Any]] = []

        def check() -> bool:
            found[:] = self.entries(*matches)
            return bool(found)

        wait_for(check, timeout, 0.1)
        return found


def available() -> bool:
    return os.access(JOURNALD, os.X_OK) and shutil.which("journalctl") is not None


def _stay_connected(namespace: str) -> sock.socket | None:
    """A stdout stream into the namespace's journald, held open for the lab's lifetime.

    A namespace instance of journald exits after about a minute without clients
    (seen here: alive at 40 s, gone at 70 s); a session-long lab would then find
    its journal refusing entries. An open stdout stream counts as a client.
    """
    stream = sock.socket(sock.AF_UNIX, sock.SOCK_STREAM)
    try:
        stream.connect(f"/run/systemd/journal.{namespace}/stdout")
        # identifier, unit id, priority, level prefix, forward to syslog, kmsg, console
        stream.sendall(b"rg-lab-keepalive\n\n6\n0\n0\n0\n0\n")
    except OSError:
        stream.close()
        return None
    return stream


@contextlib.contextmanager
def private_journald(prefix: str = "rgtest") -> Iterator[Journald]:
    """Start journald in a fresh namespace; always stop it and remove its files."""
    namespace = unique(prefix)
    proc = subprocess.Popen(
        [JOURNALD, namespace],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    socket = f"/run/systemd/journal.{namespace}/socket"
    keepalive = None
    try:
        if not wait_for(lambda: os.path.exists(socket), 10):
            raise RuntimeError(f"journald (pid {proc.pid}) did not create {socket}")
        keepalive = _stay_connected(namespace)
        yield Journald(namespace, socket, proc.pid)
    finally:
        if keepalive is not None:
            keepalive.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(f"/run/systemd/journal.{namespace}", ignore_errors=True)
        for path in glob.glob(f"/var/log/journal/*.{namespace}") + glob.glob(
            f"/run/log/journal/*.{namespace}"
        ):
            shutil.rmtree(path, ignore_errors=True)
