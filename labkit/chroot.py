"""A throwaway Debian 12 root to install the .deb into, so no test reads or changes the host's packages.

The root is the nspawn lab's cached bookworm (``labkit.systemd.ensure_image``:
``debootstrap --variant=minbase`` from Debian's archive plus systemd, runc, containerd,
python3 and runc-guard's Debian dependencies; built once per machine under ``/var/tmp``,
keyed by its suite and package list), never written: it is the lower layer of an overlay
whose upper layer lives in the caller's work directory, so every root starts clean and
what a test did stays in its own directory.

Each command runs in a private mount namespace (``unshare -m``) that mounts the
overlay, ``/proc``, the host's ``/sys`` (its cgroup mounts below it) and ``/dev``, binds
each shared directory at its own path, then chroots. The mounts belong to that
namespace alone: when the command's last process (a detached reporter included) ends,
they go with it, however the test ended. The work directory is removed on exit.

The same shape as the other labs: build once and cache (the image), start (a namespace
per command), run (:meth:`DebianRoot.run`, or :meth:`DebianRoot.wrapper` for a program a
scenario runs itself), collect, always clean up.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from labkit import systemd as sd

UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"
#: PATH inside the root (and for the mount commands before the chroot: they are on every Debian host).
ROOT_PATH = sd.MACHINE_PATH

#: Runs "$@" chrooted into the overlay of ``lower`` with ``work`` as its upper layer, in the
#: mount namespace unshare made; ``shared`` is a colon-separated list of host directories.
ENTER = r"""
set -eu
lower=$1 work=$2 shared=$3
shift 3
m=$work/merged
mkdir -p "$work/upper" "$work/ovl" "$m"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/ovl" "$m"
mount -t proc proc "$m/proc"
mount --rbind /sys "$m/sys"
mount --rbind /dev "$m/dev"
IFS=:
for dir in $shared; do
    mkdir -p "$m$dir"
    mount --bind "$dir" "$m$dir"
done
unset IFS
exec chroot "$m" "$@"
"""


def missing() -> str | None:
    """Why this host cannot make a root, or None (labkit.prereq: a skip, or under CI a failure)."""
    if os.geteuid() != 0:
        return "a Debian root for the .deb needs root (mounts, chroot)"
    for tool in (UNSHARE, CHROOT):
        if not os.access(tool, os.X_OK):
            return f"a Debian root for the .deb needs {tool} (util-linux, coreutils)"
    built = os.path.exists(os.path.join(sd.CACHE_ROOT, sd.image_key(), ".rg-built.json"))
    if not built and not os.access(sd.DEBOOTSTRAP, os.X_OK):
        return f"no cached Debian root yet, and no {sd.DEBOOTSTRAP} to build it (apt package debootstrap)"
    return None


@dataclass(frozen=True)
class DebianRoot:
    """One throwaway root: the cached image below, ``work`` above; ``shared`` host directories inside."""

    lower: str
    work: str
    shared: tuple[str, ...] = ()
    #: Seconds the image's debootstrap took in this process (None: cached), and when it was built.
    build_s: float | None = None
    recorded_build_s: float = 0.0

    def argv(self, command: Sequence[str]) -> list[str]:
        """The host command line that runs ``command`` inside the root."""
        return [UNSHARE, "-m", "--propagation", "private", "/bin/sh", "-c", ENTER, "enter",
                self.lower, self.work, ":".join(self.shared), *command]  # fmt: skip

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A plain environment for the root (its own PATH, no locale), plus ``extra``."""
        return {"PATH": ROOT_PATH, "HOME": "/root", "DEBIAN_FRONTEND": "noninteractive", **(extra or {})}

    def run(
        self, command: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 300,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """``command`` inside the root (``env``: the whole environment; default :meth:`env`)."""
        environ = dict(env) if env is not None else self.env()
        done = subprocess.run(self.argv(command), capture_output=True, text=True, timeout=timeout,
                              env=environ, check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{shlex.join(command)} in the Debian root exited {done.returncode}:\n"
                                 f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")  # fmt: skip
        return done

    def wrapper(self, path: str, program: str) -> str:
        """An executable at ``path`` on the host that runs ``program`` inside the root with its own
        arguments and environment (for a scenario that runs its binary itself); returns ``path``."""
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\nexec {shlex.join(self.argv([program]))} \"$@\"\n")
        os.chmod(path, 0o755)
        return path



@contextlib.contextmanager
def debian_root(work: str, shared: Sequence[str] = ()) -> Iterator[DebianRoot]:
    """A fresh root over the cached image (built first if this machine has none); ``work`` removed after."""
    image = sd.ensure_image()
    os.makedirs(work, exist_ok=True)
    try:
        dirs = tuple(os.path.abspath(d) for d in shared)
        yield DebianRoot(image.path, os.path.abspath(work), dirs, image.build_s, image.recorded_build_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
