"""runc_guard.libc against the real kernel: statfs magics, errno, and prctl in a forked child."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from runc_guard import libc
from runc_guard.delete.cgroupfs import CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC


def _magic_by_ctypes(path: str) -> int:
    """The same statfs through the full ctypes, as the yardstick."""

    class Statfs(ctypes.Structure):
        _fields_ = (("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 112))

    buf = Statfs()
    assert ctypes.CDLL(None, use_errno=True).statfs(os.fsencode(path), ctypes.byref(buf)) == 0
    return int(buf.f_type) & 0xFFFFFFFF


@pytest.mark.parametrize("path", ["/", "/proc", "/sys", "/dev", "/tmp"])
def test_statfs_type_matches_ctypes(path: str) -> None:
    assert libc.statfs_type(path) == _magic_by_ctypes(path)


def test_statfs_type_of_the_cgroup_mounts() -> None:
    """Every cgroup mount of this machine reports its kernel magic (v1 and cgroup2)."""
    seen = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2"):
                magic = libc.statfs_type(fields[4])
                assert magic == (CGROUP_SUPER_MAGIC if fstype == "cgroup" else CGROUP2_SUPER_MAGIC), line
                seen.add(fstype)
    assert seen, "no cgroup filesystem mounted here"


def test_statfs_type_raises_the_kernels_errno(tmp_path: os.PathLike[str]) -> None:
    missing = os.path.join(tmp_path, "gone")
    with pytest.raises(FileNotFoundError) as info:
        libc.statfs_type(missing)
    assert info.value.filename == missing


def test_prctl_sets_the_parent_death_signal_in_a_child() -> None:
    """PR_GET_PDEATHSIG (2) in a fresh interpreter reads back what PR_SET_PDEATHSIG set."""
    program = (
        "import ctypes, sys; from runc_guard import libc;"
        "assert libc.prctl()(libc.PR_SET_PDEATHSIG, 9, 0, 0, 0) == 0;"
        "got = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(got), 0, 0, 0);"
        "print(got.value)"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "9"


def test_the_delete_path_does_not_load_ctypes() -> None:
    """The point of the module: ctypes' ~6 ms import stays off every delete."""
    program = (
        "import sys; import runc_guard.delete.run, runc_guard.delete.runtime_child;"
        "from runc_guard import libc; libc.statfs_type('/'); libc.prctl();"
        "print(sorted(m for m in sys.modules if m == 'ctypes' or m.startswith('ctypes.')))"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
