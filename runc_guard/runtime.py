"""Find the real runtime and hand control to it.

Hot path: stdlib builtins only. ``exec_runtime`` is the one place that replaces
this process with the runtime (``delete.runtime_child`` is the one place that runs
it as a child, for the interposed delete).
"""

from __future__ import annotations

import os

from runc_guard.errors import RuntimeNotFound

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import NoReturn

#: PATH used when the environment has none (containerd's shim always sets one).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _usable(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_mode & 0o170000) == 0o100000 and os.access(path, os.X_OK)


def installed_shim() -> str:
    """The runc-guard installed beside the running tool (runc-guardctl), else on PATH.

    What containerd runs, so loop detection and the configured BinaryName match it.
    """
    import sys

    sibling = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "runc-guard")
    if os.path.exists(sibling):
        return sibling
    import shutil

    return shutil.which("runc-guard") or "/usr/bin/runc-guard"


def resolve_runtime(name: str, self_path: str, environ: Mapping[str, str]) -> str:
    """Absolute path of runtime ``name``; never runc-guard itself.

    A name without ``/`` is looked up on PATH like Go's ``exec.LookPath`` (containerd's
    own lookup), skipping any entry that is runc-guard itself (an install that shadows
    ``runc`` on PATH must still reach the real one). A match through an empty or
    relative entry resolves against the caller's working directory (the bundle):
    refused, as Go refuses it since 1.19 (``ErrDot``). An explicit path that is
    runc-guard is a loop: refused.
    """
    me = _identity(self_path)
    if "/" in name:
        if not _usable(name):
            raise RuntimeNotFound(f"runtime {name!r} is missing or not an executable file")
        if me is not None and _identity(name) == me:
            raise RuntimeNotFound(f"runtime {name!r} is runc-guard itself: refusing to loop")
        return name
    looped = False
    for directory in (environ.get("PATH") or DEFAULT_PATH).split(":"):
        candidate = os.path.join(directory or ".", name)
        if not _usable(candidate):
            continue
        if not os.path.isabs(candidate):
            raise RuntimeNotFound(
                f"runtime {name!r} would be {candidate!r}, through a relative PATH entry: "
                "refused (Go's ErrDot)"
            )
        if me is not None and _identity(candidate) == me:
            looped = True
            continue
        return candidate
    if looped:
        raise RuntimeNotFound(f"the only {name!r} on PATH is runc-guard itself: refusing to loop")
    raise RuntimeNotFound(f"runtime {name!r} not found on PATH")


def restore_inherited_signals() -> None:
    """Undo CPython's start-up ``SIG_IGN`` of SIGPIPE and SIGXFSZ.

    Ignored dispositions survive ``execve``; the runtime must start with the
    defaults it would have had when exec'd by the Go shim (which ignores neither).
    ``_signal`` is used because ``signal`` imports ``enum`` (~2 ms).
    """
    import _signal  # type: ignore[import-not-found]

    _signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
    _signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)


def inherited_environment() -> dict[bytes, bytes]:
    """The environment this process was started with, byte for byte.

    ``os.environ`` is not it: with no LANG/LC_* set, CPython's C-locale coercion
    (PEP 538) adds ``LC_CTYPE=C.UTF-8`` at start-up, even under ``-I``, and the
    runtime would inherit it. The kernel's copy in /proc/self/environ is what the
    caller passed to execve; without the launcher's RUNC_GUARD_HANDOVER, which it
    puts first (shim.entry.handed_over) and which was never the caller's.
    """
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:  # no /proc: the best we have, without the launcher's hand-over
        return {k: v for k, v in os.environb.items() if k != b"RUNC_GUARD_HANDOVER"}
    items = raw.split(b"\0")
    if items[0].startswith(b"RUNC_GUARD_HANDOVER="):
        del items[0]
    env: dict[bytes, bytes] = {}
    for item in items:
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key] = value
    return env


def exec_runtime(path: str, args: Sequence[str]) -> NoReturn:
    """Replace this process with the runtime: same pid, fds, environment and argv[1:].

    Returning from here is itself an error: execve only returns on failure, and
    the OSError propagates to the shim's error boundary.
    """
    restore_inherited_signals()
    os.execve(path, [path, *args], inherited_environment())
