"""The runtime matrix beyond Debian's own: containerd 2.2.2, runc 1.3.4 / 1.5.1, crictl.

One setting finds them: ``RUNC_GUARD_TEST_RUNTIMES``, either a directory that
already holds ``bin/<binary>`` (``.ci/run`` unpacks and verifies the tarball
there) or a directory holding ``runtimes-linux-amd64.tar.xz`` plus nothing
else, which is unpacked once into ``UNPACK_ROOT`` and checked against its
``SHA256SUMS``. Without the setting, ``../shared/runtimes`` beside the
checkout is tried. Tests that need a binary call :func:`require`, which stops
the test with a message naming the setting when it is absent: a failure under
``CI=true``, a skip elsewhere (``labkit.prereq``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from functools import cache

ENV = "RUNC_GUARD_TEST_RUNTIMES"
TARBALL = "runtimes-linux-amd64.tar.xz"
#: Where a tarball is unpacked (keyed by its sha256, so a new tarball never reuses an old tree).
UNPACK_ROOT = "/var/tmp/runc-guard-test-runtimes"
_HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.normpath(os.path.join(_HERE, "..", "..", "shared", "runtimes"))

CONTAINERD_2 = "containerd"
SHIM_2 = "containerd-shim-runc-v2"
CTR_2 = "ctr"
#: containerd 2.3.4 (today's stable) beside 2.2.2: its own directory, put first on PATH for its shim.
CONTAINERD_23 = "containerd-2.3.4/containerd"
SHIM_23 = "containerd-2.3.4/containerd-shim-runc-v2"
CTR_23 = "containerd-2.3.4/ctr"
CRICTL = "crictl"
RUNC_134 = "runc-1.3.4"
RUNC_151 = "runc-1.5.1"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(directory: str) -> None:
    """Check every file named in ``directory/SHA256SUMS``; raise RuntimeError on a mismatch."""
    result = subprocess.run(
        ["sha256sum", "--quiet", "-c", "SHA256SUMS"],
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{directory}: checksum mismatch:\n{result.stdout}{result.stderr}")


def unpack(tarball: str, root: str = UNPACK_ROOT) -> str:
    """Unpack ``tarball`` once into ``root/<sha256>`` and verify it; return that directory."""
    target = os.path.join(root, _sha256(tarball)[:16])
    if os.path.exists(os.path.join(target, ".verified")):
        return target
    partial = target + f".partial-{os.getpid()}"
    os.makedirs(partial, exist_ok=True)
    subprocess.run(["tar", "-xJf", tarball, "-C", partial], check=True)
    verify(partial)
    with open(os.path.join(partial, ".verified"), "w"):
        pass
    try:
        os.rename(partial, target)
    except OSError:  # another process won the race: its copy is as good as ours
        subprocess.run(["rm", "-rf", partial], check=False)
    return target


@cache
def runtimes_dir() -> str | None:
    """The directory holding ``bin/``, unpacking a tarball if that is what the setting names."""
    configured = os.environ.get(ENV)
    candidate = configured or DEFAULT_DIR
    if os.path.isdir(os.path.join(candidate, "bin")):
        return candidate
    tarball = os.path.join(candidate, TARBALL)
    if os.path.isfile(tarball):
        return unpack(tarball)
    return None


def skip_reason(binary: str) -> str:
    where = os.environ.get(ENV) or f"{DEFAULT_DIR} (the default)"
    return f"{binary} not found: set {ENV} to the runtimes directory (tried {where})"


def find(binary: str) -> str | None:
    """Absolute path of ``bin/<binary>`` from the runtimes directory, or None."""
    directory = runtimes_dir()
    if directory is None:
        return None
    path = os.path.join(directory, "bin", binary)
    return path if os.access(path, os.X_OK) else None


def require(binary: str) -> str:
    """The binary's path; when it is not there, stop the test naming the setting (labkit.prereq)."""
    from labkit import prereq

    path = find(binary)
    if path is None:
        prereq.missing(skip_reason(binary))
    return path


def bin_dir() -> str | None:
    """``<runtimes>/bin``, to put first on PATH for containerd 2.2 (it starts its own shim)."""
    directory = runtimes_dir()
    return None if directory is None else os.path.join(directory, "bin")
