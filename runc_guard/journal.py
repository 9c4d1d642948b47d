"""Send structured entries to journald over its native protocol, never blocking.

The native protocol (systemd.journal-fields(7), sd_journal_sendv) is one
datagram per entry on ``/run/systemd/journal/socket``: ``KEY=value\\n`` lines,
or ``KEY\\n`` + little-endian u64 length + bytes + ``\\n`` for values that
contain a newline. Entries too large for a datagram go as a sealed memfd
passed with SCM_RIGHTS, as libsystemd does. Sending is non-blocking: a full or
absent journald makes ``send`` return False, and the caller falls back to the
JSON-lines file. Logging must never delay or fail a delete.

It talks to ``_socket``, the C module under ``socket``: ``socket``'s own import
(enum, selectors) cost ~8 ms of CPU, a third of the reporter's, for a datagram.
"""

from __future__ import annotations

import _socket
import errno
import os
import struct
from collections.abc import Mapping

DEFAULT_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "runc-guard"


def _field_name(key: str) -> str:
    """Journal field names: upper case ASCII letters, digits and ``_``, not starting with ``_``."""
    name = "".join(c if c.isascii() and c.isalnum() else "_" for c in key.upper())
    return name.lstrip("_") or "FIELD"


def encode(fields: dict[str, object]) -> bytes:
    """Serialize ``fields`` in journald's native format; keys are normalised, values stringified."""
    out = bytearray()
    for key, value in fields.items():
        name = _field_name(key).encode()
        data = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")
        if b"\n" in data:
            out += name + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name + b"=" + data + b"\n"
    return bytes(out)


def _send_memfd(sock: _socket.socket, socket_path: str, payload: bytes, flags: int) -> None:
    fd = os.memfd_create("runc-guard-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, payload)
        import fcntl

        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        # sendmsg with the address: socket.send_fds() drops it on 3.11.
        rights = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("i", fd))]
        sock.sendmsg([b""], rights, flags, socket_path)
    finally:
        os.close(fd)


def send(fields: dict[str, object], socket_path: str = DEFAULT_SOCKET, wait: float = 0.0) -> bool:
    """Send one entry; True if journald took it, False if it is absent, refusing or full.

    ``wait``: how long a full journald may keep us (0: never; the shim's own calls).
    The reporter, off containerd's path, waits: it sends a storm's entries back to
    back, and a journald that is briefly behind must not push them to the file.
    """
    payload = encode(fields)
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM | _socket.SOCK_CLOEXEC)
    except OSError:
        return False
    try:
        flags = 0 if wait > 0 else _socket.MSG_DONTWAIT
        if wait > 0:
            sock.settimeout(wait)
        try:
            sock.sendto(payload, flags, socket_path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):
                return False
            _send_memfd(sock, socket_path, payload, flags)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def send_minimal(environ: Mapping[str, str], event: str, message: str, priority: int) -> bool:
    """An entry from a path that has no settings object (stdlib only). Never raises:
    it reports failures that must reach the caller whatever the journal does."""
    path = environ.get("RUNC_GUARD_JOURNAL_SOCKET") or DEFAULT_SOCKET
    fields: dict[str, object] = {
        "MESSAGE": f"{event}: {message}",
        "PRIORITY": priority,
        "SYSLOG_IDENTIFIER": IDENTIFIER,
        "EVENT": event,
        "RUNC_GUARD_PID": os.getpid(),
    }
    try:
        return send(fields, path)
    except Exception:  # noqa: BLE001 - logging must never change the outcome
        return False
