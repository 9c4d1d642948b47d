"""journald's native protocol, against a real AF_UNIX datagram socket."""

from __future__ import annotations

import array
import os
import socket
import struct
import time

from runc_guard import journal


def test_encode_simple_and_binary_safe() -> None:
    """KEY=value lines; values with newlines use the length-prefixed form."""
    data = journal.encode({"message": "hi", "container_id": "c1", "multi": "a\nb"})
    assert data == b"MESSAGE=hi\nCONTAINER_ID=c1\nMULTI\n" + struct.pack("<Q", 3) + b"a\nb\n"


def test_field_names_are_normalised() -> None:
    """Keys become valid journal field names (upper case, no leading underscore)."""
    assert journal.encode({"_hidden-key": 1}) == b"HIDDEN_KEY=1\n"


def test_send_delivers_one_datagram(journald) -> None:  # type: ignore[no-untyped-def]
    """A normal entry arrives as exactly one datagram."""
    path, sock = journald
    assert journal.send({"MESSAGE": "x", "CONTAINER_ID": "c1"}, path)
    assert sock.recv(65536) == b"MESSAGE=x\nCONTAINER_ID=c1\n"


def test_oversized_entry_goes_by_memfd(journald) -> None:  # type: ignore[no-untyped-def]
    """An entry too large for a datagram is passed as a sealed memfd, like libsystemd does."""
    path, sock = journald
    big = "x" * (4 << 20)
    assert journal.send({"MESSAGE": big}, path)
    fds = array.array("i")
    _msg, ancdata, _flags, _addr = sock.recvmsg(16, socket.CMSG_LEN(fds.itemsize))
    fds.frombytes(ancdata[0][2])
    fd = fds[0]
    try:
        assert os.pread(fd, 16, 0) == b"MESSAGE=xxxxxxxx"
        assert os.fstat(fd).st_size == len(big) + len("MESSAGE=\n")
    finally:
        os.close(fd)


def test_absent_journald_returns_false_fast(tmp_path: os.PathLike[str]) -> None:
    """No socket: False at once, no exception."""
    start = time.monotonic()
    assert journal.send({"MESSAGE": "x"}, os.path.join(tmp_path, "absent")) is False
    assert time.monotonic() - start < 1.0


def test_full_journald_never_blocks(journald) -> None:  # type: ignore[no-untyped-def]
    """A receiver that never reads: sends fail (non-blocking) instead of hanging."""
    path, _sock = journald
    results = [journal.send({"MESSAGE": "y" * 1000}, path) for _ in range(2000)]
    assert results[0] is True and results[-1] is False


def test_the_reporter_waits_for_a_full_journald(journald) -> None:  # type: ignore[no-untyped-def]
    """With ``wait`` (the reporter, off containerd's path) a full journald that catches up takes
    the entry instead of losing it to the fallback file."""
    import threading

    path, sock = journald
    while journal.send({"MESSAGE": "y" * 1000}, path):  # fill the queue (non-blocking sends)
        pass
    reader = threading.Timer(0.2, lambda: [sock.recv(1 << 16) for _ in range(10)])
    reader.start()
    try:
        assert journal.send({"MESSAGE": "after"}, path, wait=10.0) is True
    finally:
        reader.join()
