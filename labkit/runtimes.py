"""Test runtimes beyond Debian 12's own, fetched from Debian's archive (every suite).

The matrix needs what nodes run today and Debian 12 lacks: containerd 1.7
(trixie) and 2.1 (sid), runc 1.3 and crun 1.28 (sid), and the CRI's
``api.proto`` (sid's ``golang-k8s-cri-api-dev``). Each comes from Debian's
archive by package name through apt itself, with a private sources list, lists
and cache directory (``-o Dir::...``): the machine's apt configuration is never
touched, and apt checks every package against the archive's signed lists.

A package is unpacked once into ``CACHE_ROOT/<suite>/<package>_<version>``
(keyed by the Debian version apt resolved, so a new upload never reuses an old
tree), together with the libraries it needs from the same suite. Debian 12's
glibc is 2.36; sid's runc and crun want >= 2.38, so their binaries get that
suite's dynamic loader and an rpath into the unpacked libraries (``patchelf``)
and run on this host as they are. Every binary is then run with ``--version``,
which must name the expected upstream series, before the tree is marked ready.

A test asks :func:`require` for a binary by its :class:`Binary` constant; when
the archive cannot be reached and nothing is cached, the test stops naming the
package: a failure under ``CI=true``, a skip elsewhere (``labkit.prereq``).
``python -m labkit.runtimes`` fetches the whole set once (``make test`` runs it
before pytest, so no test spends its time on a download) and prints the table.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

#: Outside the checkout: kept across clones and runs of the same machine.
CACHE_ROOT = "/var/tmp/runc-guard-runtimes"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
MIRROR = "http://deb.debian.org/debian"
SUITES = ("trixie", "sid")
#: Lists older than this are fetched again (a run reuses them; a new day sees new uploads).
LISTS_MAX_AGE_S = 6 * 3600
PATCHELF = shutil.which("patchelf") or "/usr/bin/patchelf"
LIB_DIR = "usr/lib/x86_64-linux-gnu"
LOADER = f"{LIB_DIR}/ld-linux-x86-64.so.2"


@dataclass(frozen=True)
class Package:
    """A Debian package of one suite whose upstream version must start with ``series``."""

    name: str
    suite: str
    series: str
    #: Libraries unpacked beside it (same suite) for a host whose glibc is older.
    libs: tuple[str, ...] = ()
    #: Files below the unpacked tree that get the suite's loader and rpath (ELF programs).
    relink: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name} {self.series} ({self.suite})"


@dataclass(frozen=True)
class Binary:
    """One file of a package (path inside the .deb) and how to ask it its version."""

    package: Package
    path: str
    version_args: tuple[str, ...] = ("--version",)

    @property
    def label(self) -> str:
        return f"{os.path.basename(self.path)} of {self.package.label}"


_RUNC_LIBS = ("libc6", "libseccomp2")
CONTAINERD_17_PKG = Package("containerd", "trixie", "1.7")
CONTAINERD_21_PKG = Package("containerd", "sid", "2.1")
RUNC_13_PKG = Package("runc", "sid", "1.3", _RUNC_LIBS, ("usr/sbin/runc",))
CRUN_128_PKG = Package(
    "crun", "sid", "1.28",
    (*_RUNC_LIBS, "libblake3-0", "libjson-c5", "libcap2", "libsystemd0"),
    ("usr/bin/crun",),
)  # fmt: skip
CRI_API_PKG = Package("golang-k8s-cri-api-dev", "sid", "0.")

CONTAINERD_17 = Binary(CONTAINERD_17_PKG, "usr/bin/containerd")
SHIM_17 = Binary(CONTAINERD_17_PKG, "usr/bin/containerd-shim-runc-v2", ("-v",))
CTR_17 = Binary(CONTAINERD_17_PKG, "usr/bin/ctr")
CONTAINERD_21 = Binary(CONTAINERD_21_PKG, "usr/bin/containerd")
SHIM_21 = Binary(CONTAINERD_21_PKG, "usr/bin/containerd-shim-runc-v2", ("-v",))
CTR_21 = Binary(CONTAINERD_21_PKG, "usr/bin/ctr")
RUNC_13 = Binary(RUNC_13_PKG, "usr/sbin/runc")
CRUN_128 = Binary(CRUN_128_PKG, "usr/bin/crun")
#: The CRI's API, one file with no imports: compiled into a Python client (labkit.cri_client).
CRI_API_PROTO = Binary(CRI_API_PKG, "usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto", ())
ALL = (CONTAINERD_17, SHIM_17, CTR_17, CONTAINERD_21, SHIM_21, CTR_21, RUNC_13, CRUN_128, CRI_API_PROTO)


class Unavailable(RuntimeError):
    """A package could not be fetched, unpacked or checked; the message names it."""


def _apt_dir() -> str:
    return os.path.join(CACHE_ROOT, "apt")


def _apt_options() -> list[str]:
    apt = _apt_dir()
    return [
        "-o", f"Dir::Etc::sourcelist={os.path.join(apt, 'sources.list')}",
        "-o", "Dir::Etc::sourceparts=/dev/null",
        "-o", f"Dir::State::Lists={os.path.join(apt, 'lists')}",
        "-o", f"Dir::State::status={os.path.join(apt, 'status')}",
        "-o", f"Dir::Cache={os.path.join(apt, 'cache')}",
        # sid's Release file can be past its Valid-Until as these machines see the clock.
        "-o", "Acquire::Check-Valid-Until=false",
        "-o", "Debug::NoLocking=1",
        "-o", "APT::Architecture=amd64",
        "-q",
    ]  # fmt: skip


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One fetcher at a time per machine (two pytest workers ask at once)."""
    os.makedirs(CACHE_ROOT, exist_ok=True)
    with open(os.path.join(CACHE_ROOT, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(argv: list[str], what: str, cwd: str | None = None, timeout: float = 600) -> str:
    """stdout and stderr of ``argv``; Unavailable naming ``what`` when it cannot run or fails."""
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{what}: {e}") from e
    if proc.returncode != 0:
        raise Unavailable(
            f"{what}: {' '.join(argv[:2])} exited {proc.returncode}: {proc.stderr.strip()[-600:]}"
        )
    return proc.stdout + proc.stderr


#: A failed update, kept for the process: apt retries for seconds, and every package would ask again.
_update_failed: list[Unavailable] = []


def _update_lists() -> None:
    """Fetch the suites' package lists into the private apt directory, at most every LISTS_MAX_AGE_S."""
    if _update_failed:
        raise _update_failed[0]
    try:
        _fetch_lists()
    except Unavailable as e:
        _update_failed.append(e)
        raise


def _fetch_lists() -> None:
    apt = _apt_dir()
    stamp = os.path.join(apt, "updated")
    with contextlib.suppress(OSError):
        if time.time() - os.stat(stamp).st_mtime < LISTS_MAX_AGE_S:
            return
    for sub in ("lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(apt, sub), exist_ok=True)
    with open(os.path.join(apt, "sources.list"), "w") as f:
        for suite in SUITES:
            f.write(f"deb [signed-by={KEYRING}] {MIRROR} {suite} main\n")
    open(os.path.join(apt, "status"), "a").close()
    out = _run(["apt-get", *_apt_options(), "update"], "Debian's package lists (apt-get update)")
    # apt-get update exits 0 when a mirror cannot be reached (it only warns): the lists decide.
    lists = os.listdir(os.path.join(apt, "lists"))
    for suite in SUITES:
        if not any(f"_dists_{suite}_main_binary-amd64_Packages" in name for name in lists):
            raise Unavailable(f"Debian's package lists (apt-get update): no {suite} list from {MIRROR}: "
                              f"{out.strip()[-400:]}")  # fmt: skip
    with open(stamp, "w"):
        pass


def _candidate(name: str, suite: str) -> str:
    """The version of ``name`` that ``suite`` holds today, from the private lists."""
    out = _run(["apt-cache", *_apt_options(), "madison", name], f"apt-cache madison {name}")
    for line in out.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 3 and fields[0] == name and f" {suite}/" in f" {fields[2]}":
            return fields[1]
    raise Unavailable(f"{name}: not in Debian {suite} (apt-cache madison found none)")


def _download(name: str, version: str, into: str) -> str:
    """``apt-get download name=version`` into ``into``; the .deb's path (apt checks it against the lists)."""
    _run(
        ["apt-get", *_apt_options(), "download", f"{name}={version}"],
        f"apt-get download {name}={version}",
        cwd=into,
    )
    found = glob.glob(os.path.join(into, f"{name}_*.deb"))
    if len(found) != 1:
        raise Unavailable(f"{name}={version}: apt-get download left {found}")
    return found[0]


def upstream(version: str) -> str:
    """Debian's version without epoch and Debian revision: ``1:2.1.9+ds1-5`` -> ``2.1.9``."""
    version = version.split(":", 1)[-1]
    return re.split(r"[~+-]", version, maxsplit=1)[0]


def _relink(tree: str, relative: str) -> None:
    """Point an ELF program at the suite's own loader and libraries unpacked in ``tree``."""
    if not os.access(PATCHELF, os.X_OK):
        raise Unavailable(f"{PATCHELF} is missing (apt package patchelf; make deps installs it)")
    target = os.path.join(tree, relative)
    _run(
        [
            PATCHELF,
            "--set-interpreter",
            os.path.join(tree, LOADER),
            "--set-rpath",
            os.path.join(tree, LIB_DIR),
            target,
        ],
        f"patchelf {relative}",
    )


def _check(tree: str, binary: Binary, version: str) -> None:
    """``binary --version`` must run and name the upstream version apt resolved."""
    if not binary.version_args:
        if not os.path.isfile(os.path.join(tree, binary.path)):
            raise Unavailable(f"{binary.label}: {binary.path} is not in the package")
        return
    out = _run(
        [os.path.join(tree, binary.path), *binary.version_args], f"{binary.label} --version", timeout=30
    )
    want = upstream(version)
    if want not in out or not want.startswith(binary.package.series):
        raise Unavailable(f"{binary.label}: --version says {out.strip()[:200]!r}, expected {want}")


def _fetch(package: Package) -> str:
    """Download, unpack, relink and check ``package``; the ready tree's path."""
    _update_lists()
    version = _candidate(package.name, package.suite)
    if not upstream(version).startswith(package.series):
        raise Unavailable(f"{package.label}: Debian {package.suite} holds {version}")
    tree = os.path.join(CACHE_ROOT, package.suite, f"{package.name}_{version.replace(':', '%3a')}")
    if os.path.exists(os.path.join(tree, ".ready")):
        return tree
    partial = f"{tree}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    debs = os.path.join(partial, ".debs")
    os.makedirs(debs)
    try:
        for name in (package.name, *package.libs):
            deb = _download(name, version if name == package.name else _candidate(name, package.suite), debs)
            _run(["dpkg-deb", "-x", deb, partial], f"dpkg-deb -x {os.path.basename(deb)}")
        shutil.rmtree(debs)
        # The relinked programs name the tree by its final path: rename first, then relink.
        shutil.rmtree(tree, ignore_errors=True)
        os.rename(partial, tree)
        for relative in package.relink:
            _relink(tree, relative)
        for binary in ALL:
            if binary.package == package:
                _check(tree, binary, version)
        with open(os.path.join(tree, "VERSION"), "w") as f:
            f.write(version + "\n")
        with open(os.path.join(tree, ".ready"), "w"):
            pass
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(tree, ignore_errors=True)
        raise
    return tree


def _cached(package: Package) -> str | None:
    """The newest ready tree of ``package``'s series when the archive cannot be asked."""
    pattern = os.path.join(CACHE_ROOT, package.suite, f"{package.name}_*")
    ready = [t for t in glob.glob(pattern) if os.path.exists(os.path.join(t, ".ready"))]
    ready = [t for t in ready if upstream(_version_of(t)).startswith(package.series)]
    return max(ready, key=os.path.getmtime) if ready else None


def _version_of(tree: str) -> str:
    with open(os.path.join(tree, "VERSION")) as f:
        return f.read().strip()


@cache
def tree(package: Package) -> str:
    """The ready, unpacked tree of ``package`` (fetched once); Unavailable names what failed."""
    with _locked():
        try:
            return _fetch(package)
        except Unavailable:
            found = _cached(package)
            if found is None:
                raise
            return found


def version(package: Package) -> str:
    """The Debian version of ``package`` the tests run (fetching it if need be)."""
    return _version_of(tree(package))


def find(binary: Binary) -> str | None:
    """Absolute path of ``binary``, fetching its package on first use; None when it cannot be had."""
    try:
        return os.path.join(tree(binary.package), binary.path)
    except Unavailable:
        return None


def why_missing(binary: Binary) -> str:
    try:
        tree(binary.package)
    except Unavailable as e:
        return f"{binary.label} from Debian's archive: {e}"
    return f"{binary.label}: present"


def require(binary: Binary) -> str:
    """``binary``'s path; when it cannot be had, stop the test naming the package (labkit.prereq)."""
    from labkit import prereq

    path = find(binary)
    if path is None:
        prereq.missing(why_missing(binary))
    return path


def bin_dir(binary: Binary) -> str:
    """The directory holding ``binary`` (containerd 2.x finds its own shim first on PATH)."""
    return os.path.dirname(require(binary))


def main() -> int:
    """Fetch every package once and print what the tests will run; exit 1 if any failed under CI."""
    from labkit import prereq

    failed = 0
    print(f"{'package':<26} {'suite':<7} {'version':<22} tree")
    for package in dict.fromkeys(b.package for b in ALL):
        try:
            path = tree(package)
            print(f"{package.name:<26} {package.suite:<7} {_version_of(path):<22} {path}")
        except Unavailable as e:
            failed += 1
            print(f"{package.name:<26} {package.suite:<7} {'-':<22} unavailable: {e}")
    return 1 if failed and prereq.in_ci() else 0


if __name__ == "__main__":
    sys.exit(main())
