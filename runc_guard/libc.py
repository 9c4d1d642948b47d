"""The libc calls Python's os lacks (statfs, prctl, renameat2), through ``_ctypes`` alone.

``import ctypes`` costs ~6 ms of CPU on every delete (its ``__init__`` builds
dozens of types and loads ``struct``; 23 against 16 ms for a bare ``python
-IS``, 40 paired runs), a quarter of what runc-guard adds to a clean delete.
The C extension ``_ctypes`` under it costs ~1 ms: this module defines the two
types it needs (a C ``int`` result, a byte buffer) and looks the functions up
in the libc already mapped into the process (``dlopen(NULL)``), as
``ctypes.CDLL(None)`` would. Stdlib only.
"""

from __future__ import annotations

import _ctypes
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # generic only in the stubs; at run time the plain C types
    _IntData = _ctypes._SimpleCData[int]
    _BytesData = _ctypes._SimpleCData[bytes]
else:
    _IntData = _BytesData = _ctypes._SimpleCData

#: statfs(2)'s buffer: struct statfs is 120 bytes on 64-bit Linux (a few bytes spare).
STATFS_SIZE = 128


class _Int(_IntData):
    _type_ = "i"


class _Long(_IntData):
    _type_ = "l"


class _Char(_BytesData):
    _type_ = "c"


class _StatfsBuffer(_ctypes.Array):  # type: ignore[type-arg]  # not generic at run time
    _type_ = _Char
    _length_ = STATFS_SIZE


class _Function(_ctypes.CFuncPtr):
    """A libc function returning int; errno saved for :func:`_ctypes.get_errno`."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


class _Libc:
    """What ``CFuncPtr((name, library))`` reads: the library's dlopen handle."""

    def __init__(self) -> None:
        self._handle = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]  # NULL: this process

    def function(self, name: str) -> _Function:
        return _Function((name, self))  # type: ignore[arg-type]  # duck-typed: reads ._handle


_functions: dict[str, _Function] = {}


def _function(name: str) -> _Function:
    """libc's ``name``, looked up once per process (statfs runs for every path a delete checks)."""
    if name not in _functions:
        _functions[name] = _Libc().function(name)
    return _functions[name]


def statfs_type(path: str) -> int:
    """statfs(2)'s ``f_type`` of ``path`` (the filesystem's magic), as an unsigned 32-bit value.

    struct statfs on 64-bit Linux begins with ``__fsword_t f_type`` (a long).
    """
    buf = _StatfsBuffer()
    if _function("statfs")(os.fsencode(path), buf) != 0:
        err = _ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    size = _ctypes.sizeof(_Long)
    return int.from_bytes(bytes(memoryview(buf)[:size]), sys.byteorder) & 0xFFFFFFFF


#: prctl(2) option: the signal this process gets when its parent thread dies.
PR_SET_PDEATHSIG = 1


def prctl() -> _Function:
    """prctl(2), looked up ahead of a fork so that the child only calls it."""
    return _function("prctl")


#: renameat2(2): paths relative to the cwd; swap the two names' files in one step.
AT_FDCWD = -100
RENAME_EXCHANGE = 2


def exchange(a: str, b: str) -> None:
    """renameat2(RENAME_EXCHANGE): ``a`` and ``b`` swap files atomically; OSError (ENOENT) when
    either name is gone, so nothing removed meanwhile comes back."""
    if _function("renameat2")(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        err = _ctypes.get_errno()
        raise OSError(err, os.strerror(err), b)
