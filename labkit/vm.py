"""A whole pure cgroup v2 node: Debian 12 with systemd as PID 1 in a qemu virtual machine.

The nspawn lab (``labkit.systemd``) inherits the host's hybrid layout; nodes today
boot cgroup v2 unified with every controller, systemd PID 1 and kubelet's systemd
cgroup driver. This lab boots exactly that (docs/background.md, the labs):

- the image is the nspawn lab's cached debootstrapped root plus Debian's
  ``linux-image-amd64`` (6.1), ``initramfs-tools`` and the grpc/protobuf packages
  ``labkit.cri_client`` needs (installed in a chroot, once, cached under
  ``/var/tmp`` by a key of the package lists), then per checkout an ext4 disk
  (``mkfs.ext4 -d``) of that root with sid's runc 1.3 and containerd 2.1 from
  ``labkit.runtimes`` (each package's unpacked tree at the same absolute path as on
  the host: the relinked runc names its glibc by that path) and runc-guard
  installed from a real .deb (``packaging/build-deb.sh``), cached by a key of its
  inputs (the root, the runtimes' Debian versions, the .deb's file contents, the
  guest files); or, with ``node=SID`` (issue 41's modern node), a root of its own
  from ``debootstrap --variant=minbase sid`` with kernel 7.x, systemd, containerd
  2.1, runc 1.3 and crun 1.28 as Debian installs them (unified layout only);
- qemu under TCG (``-accel tcg,thread=multi -cpu max``: a KVM guest hangs after
  the kernel's decompressor on these nested machines), ``-kernel/-initrd`` from
  the root, ``root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1``
  (or ``=0``: the hybrid layout of the incident), the disk ``if=virtio`` with
  ``snapshot=on`` (the cached disk is never written; every boot starts fresh),
  ``-nic none``, ``-nographic`` with the serial console in ``console.log``;
- the host talks to the guest through a virtio-serial port: ``rg-agent.service``
  runs ``labkit/vm_guest/agent.py`` (JSON lines: argv in, status and output
  back), and a virtio-9p share (``/opt/rg/share`` inside) carries the guest
  scripts, labkit.cri_client with the CRI's api.proto, and images in and bulky
  results out;
- the VM is stopped with ``systemctl poweroff`` through the agent; qemu is
  SIGKILLed by its pid if the guest does not power off in time.

TCG runs guest programs 15-25x slower than the host: this lab checks
correctness (what is left behind), and any timing it prints is TCG time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from labkit import images, runtimes
from labkit import systemd as sd
from labkit.kernel import unique

QEMU = shutil.which("qemu-system-x86_64") or "/usr/bin/qemu-system-x86_64"
MKFS = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
CACHE_ROOT = "/var/tmp/runc-guard-vm-lab"
HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)
GUEST_SRC = os.path.join(HERE, "vm_guest")
#: What the kernel root adds to the nspawn lab's root: the kernel and its initramfs, and what
#: labkit.cri_client needs in the guest (Debian 12's grpc, protobuf and grpc_tools, which compiles
#: the CRI's api.proto there: Debian 12 packages no crictl).
KERNEL_PACKAGES = (
    "linux-image-amd64", "initramfs-tools", "python3-grpcio", "python3-protobuf", "python3-grpc-tools",
)  # fmt: skip
#: Units that only slow a test boot down (apt's timers, e2scrub), and the sweep and audit timers the
#: .deb enables: the cells measure what a delete leaves with no sweep, stock beside runc-guard.
MASKED = (
    "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "e2scrub_reap.service",
    "runc-guard-sweep.timer", "runc-guard-audit.timer",
)
DISK_SIZE = "3G"
#: A second, empty ext4 disk per boot (``/dev/vdb`` inside, mounted at DATA_MOUNT):
#: the volume the slow-teardown scenarios write to under an ``io.max`` limit. On the
#: root disk a throttled writer stalls ext4's journal (data=ordered commits wait for
#: the throttled data), and with it every fsync on the node -- containerd's and the
#: shim's included -- which is not the case the lab means to measure.
DATA_DISK_SIZE = "256M"
DATA_MOUNT = "/var/lib/rgvm/data"
#: Inside the guest.
SHARE = "/opt/rg/share"
#: Inside the guest: where labkit.runtimes' binaries are (JSON, labkit/vm_guest/setup.py reads it).
RUNTIMES_MANIFEST = "/opt/rg/runtimes.json"
#: The packages the guest gets beside Debian 12's own: runc 1.3 for the ``*-13`` handlers and
#: containerd 2.1 for the in-place upgrade (labkit/vm_guest/setup.py).
GUEST_RUNC, GUEST_CONTAINERD = runtimes.RUNC_13, runtimes.CONTAINERD_21
#: :func:`guest_runtimes`: ``{"runc": {"path", "tree", "version"}, "containerd": {...}}``.
GuestRuntimes = dict[str, dict[str, str]]
AGENT_PORT = "rg.agent"
SHARE_TAG = "rgshare"
UNIFIED, HYBRID = "unified", "hybrid"
LAYOUTS = {UNIFIED: "1", HYBRID: "0"}


def missing() -> str | None:
    """Why this host cannot run a VM at all, or None: the only reasons to skip the lab."""
    if os.geteuid() != 0:
        return "the VM lab needs root (chroot, mkfs.ext4 -d of a root-owned tree)"
    for tool, pkg in ((QEMU, "qemu-system-x86"), (MKFS, "e2fsprogs"), (sd.DEBOOTSTRAP, "debootstrap")):
        if not os.access(tool, os.X_OK):
            return f"the VM lab needs {tool} (apt package {pkg}; make deps installs it)"
    return None


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _run_logged(argv: list[str], log: str, timeout: float) -> None:
    with open(log, "ab") as f:
        result = subprocess.run(
            argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False, timeout=timeout
        )
    if result.returncode != 0:
        with open(log, errors="replace") as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{' '.join(argv[:3])}... failed ({result.returncode}):\n{tail}")


# -- layer 1+2: the nspawn lab's root plus a kernel -----------------------------------


@dataclass(frozen=True)
class Root:
    path: str
    key: str
    #: Seconds this process spent building it; None when the cache was reused.
    build_s: float | None
    recorded_build_s: float


#: Install packages in a chroot of ROOT: proc/sys/dev for the maintainer scripts,
#: in a private mount namespace so nothing outlives the build. sid's Release file can be
#: past its Valid-Until as these machines see the clock (labkit.runtimes says the same).
CHROOT_INSTALL = r"""
set -eu
root=$1; shift
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --rbind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update -qq
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
chroot "$root" apt-get clean
rm -f "$root/etc/resolv.conf"
"""

#: The guest's Debian: 12 (bookworm, kernel 6.1, containerd 1.6.20, runc 1.1.5; the hybrid
#: layout too) or sid, the modern node (issue 41): kernel 7.x, systemd 26x, containerd 2.1,
#: runc 1.3 and crun 1.28 as Debian installs them, pure cgroup v2 only (systemd >= 258 has no v1).
BOOKWORM, SID = "bookworm", "sid"
NODES = (BOOKWORM, SID)
#: The sid node's packages beyond ``debootstrap --variant=minbase sid`` (Debian 12's debootstrap
#: fails with the kernel in ``--include``: they go in by apt in a chroot): the node, runc-guard's
#: .deb dependencies, and labkit.cri_client's.
SID_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "udev", "linux-image-amd64", "initramfs-tools",
    "containerd", "runc", "crun", "busybox-static",
    "python3", "python3-psutil", "python3-tenacity", "python3-structlog", "python3-click", "python3-tomlkit",
    "python3-prometheus-client", "python3-grpcio", "python3-protobuf", "python3-grpc-tools",
)  # fmt: skip


def ensure_root(cache_root: str = CACHE_ROOT, node: str = BOOKWORM) -> Root:
    """The kernel root of ``node``, built once: for bookworm the nspawn lab's cached root plus
    the kernel packages, for sid a root of its own, debootstrapped (keyed by the package list
    like the bookworm root; sid moves daily: remove the root to take today's)."""
    if node == SID:
        key = _key(SID, ",".join(SID_PACKAGES))

        def debootstrap(root: str, log: str) -> None:
            _run_logged([sd.DEBOOTSTRAP, "--variant=minbase", SID, root, sd.MIRROR], log, 1800)
            _install(root, SID_PACKAGES, log, 2400)

        return _cached_root(cache_root, f"root-{SID}-{key}", key, debootstrap,
                            {"packages": list(SID_PACKAGES), "suite": SID})  # fmt: skip
    base = sd.ensure_image()
    key = _key(sd.image_key(), ",".join(KERNEL_PACKAGES))

    def add_kernel(root: str, log: str) -> None:
        _run_logged(["cp", "-a", "--reflink=auto", base.path, root], log, 600)
        _install(root, KERNEL_PACKAGES, log, 1800)

    return _cached_root(cache_root, f"root-{key}", key, add_kernel,
                        {"packages": list(KERNEL_PACKAGES), "base": base.path})  # fmt: skip


def _install(root: str, packages: tuple[str, ...], log: str, timeout: float) -> None:
    """apt-get install ``packages`` in a chroot of ``root`` (CHROOT_INSTALL), in a private mount namespace."""
    _run_logged(
        [UNSHARE, "-m", "--propagation", "private", "sh", "-c", CHROOT_INSTALL, "install", root, *packages],
        log, timeout,
    )  # fmt: skip


def _cached_root(
    cache_root: str, name: str, key: str, build: Callable[[str, str], None], meta: dict[str, object]
) -> Root:
    """``cache_root/name/root``, made once by ``build(root, log)`` in a partial directory renamed
    into place (another session may build the same root at the same time: the first rename wins)."""
    target = os.path.join(cache_root, name)
    stamp = os.path.join(target, "built.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            return Root(os.path.join(target, "root"), key, None, float(json.load(f)["build_s"]))
    os.makedirs(cache_root, exist_ok=True)
    partial = f"{target}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    started = time.monotonic()
    try:
        build(os.path.join(partial, "root"), os.path.join(partial, "build.log"))
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    build_s = time.monotonic() - started
    with open(os.path.join(partial, "built.json"), "w") as f:
        json.dump({"build_s": round(build_s, 1), **meta}, f)
    try:
        os.rename(partial, target)
    except OSError:  # another session built it first
        shutil.rmtree(partial, ignore_errors=True)
    return Root(os.path.join(target, "root"), key, build_s, build_s)


# -- layer 3: the disk of one checkout ------------------------------------------------


def build_deb(outdir: str) -> str:
    """``packaging/build-deb.sh``: runc-guard as the .deb an operator installs."""
    python = os.path.join(CHECKOUT, ".venv", "bin", "python")
    env = dict(os.environ, PYTHON=python if os.access(python, os.X_OK) else "python3")
    out = subprocess.run(
        [os.path.join(CHECKOUT, "packaging", "build-deb.sh"), outdir],
        capture_output=True, text=True, check=False, env=env, timeout=300,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"packaging/build-deb.sh failed:\n{out.stdout}{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


def deb_key(deb: str) -> str:
    """The .deb's file names, modes and contents (not its mtimes: every build stamps new ones)."""
    digest = hashlib.sha256()
    listing = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True).stdout
    import io

    with tarfile.open(fileobj=io.BytesIO(listing)) as tar:
        for member in tar:
            digest.update(f"{member.name}:{member.mode}:{member.linkname}".encode())
            data = tar.extractfile(member) if member.isfile() else None
            if data is not None:
                digest.update(data.read())
    control = subprocess.run(["dpkg-deb", "-f", deb], capture_output=True, check=True).stdout
    digest.update(control)
    return digest.hexdigest()[:16]


def _tree_key(path: str) -> str:
    digest = hashlib.sha256()
    for dirpath, dirs, files in sorted(os.walk(path)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            with open(os.path.join(dirpath, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def guest_runtimes() -> GuestRuntimes | None:
    """What the guest gets from labkit.runtimes (binaries, their packages' trees and Debian
    versions), or None when Debian's archive cannot give it and nothing is cached."""
    found: GuestRuntimes = {}
    for name, binary in (("runc", GUEST_RUNC), ("containerd", GUEST_CONTAINERD)):
        path = runtimes.find(binary)
        if path is None:
            return None
        tree = runtimes.tree(binary.package)
        found[name] = {"path": path, "tree": tree, "version": runtimes.version(binary.package)}
    return found


def _runtimes_key(found: GuestRuntimes | None) -> str:
    """The runtimes' Debian versions: labkit.runtimes keys each tree by its version, so a new upload
    is a new tree and a new disk."""
    if found is None:
        return "none"
    return ",".join(f"{name}={r['version']}" for name, r in sorted(found.items()))


NINEP_OPTIONS = "trans=virtio,version=9p2000.L,msize=262144"
AGENT_UNIT = f"""[Unit]
Description=runc-guard VM lab: the host's command channel (virtio-serial {AGENT_PORT})
After=local-fs.target
Before=containerd.service
StartLimitIntervalSec=0

[Service]
ExecStartPre=/sbin/modprobe -a 9pnet_virtio 9p
# A restarted agent finds the share mounted already (a second mount of the tag fails
# with "no channels available"), so mount only when it is not.
ExecStartPre=/bin/sh -c 'mountpoint -q {SHARE} || exec mount -t 9p -o {NINEP_OPTIONS} {SHARE_TAG} {SHARE}'
ExecStart=/usr/bin/python3 {SHARE}/guest/agent.py
Restart=always
RestartSec=1
StandardError=journal+console

[Install]
WantedBy=multi-user.target
"""


@dataclass(frozen=True)
class Disk:
    image: str
    kernel: str
    initrd: str
    key: str
    #: Seconds spent here building the disk (mkfs included); None when it was cached.
    build_s: float | None
    recorded_build_s: float
    root: Root
    #: labkit.runtimes' binaries in the guest (:func:`guest_runtimes`), None when the disk has none.
    runtimes: GuestRuntimes | None
    #: BOOKWORM or SID.
    node: str = BOOKWORM


DISK_SCRIPT = r"""
set -eu
lower=$1 work=$2 deb=$3 img=$4 size=$5
shift 5
mkdir -p "$work/upper" "$work/work" "$work/merged"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/work" "$work/merged"
m=$work/merged
cp "$deb" "$m/tmp/runc-guard.deb"
mount -t proc proc "$m/proc"
chroot "$m" dpkg -i /tmp/runc-guard.deb
umount "$m/proc"
rm -f "$m/tmp/runc-guard.deb"
mkdir -p "$m/opt/rg/share"
# labkit.runtimes' trees at the same absolute paths (the relinked runc names its loader by path).
for tree in "$@"; do mkdir -p "$m$tree"; cp -a "$tree/." "$m$tree/"; done
cp "$work/runtimes.json" "$m$MANIFEST"
cp "$work/rg-agent.service" "$m/etc/systemd/system/rg-agent.service"
ln -sf /etc/systemd/system/rg-agent.service "$m/etc/systemd/system/multi-user.target.wants/rg-agent.service"
for unit in $MASKED; do ln -sf /dev/null "$m/etc/systemd/system/$unit"; done
echo rgvm > "$m/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 rgvm\n' > "$m/etc/hosts"
: > "$m/etc/resolv.conf"
: > "$m/etc/machine-id"
mkdir -p "$m/etc/systemd/system.conf.d"
printf '[Manager]\nDefaultTimeoutStopSec=%s\n' "$STOP" > "$m/etc/systemd/system.conf.d/rg-lab.conf"
mkfs.ext4 -q -F -L rgroot -d "$m" "$img" "$size"
"""


def ensure_disk(cache_root: str = CACHE_ROOT, node: str = BOOKWORM) -> Disk:
    """The bootable disk of ``node`` for this checkout: cached by root, runtimes, .deb and guest unit.

    sid's runc, crun and containerd are its own packages: only bookworm gets labkit.runtimes'.
    """
    root = ensure_root(cache_root, node)
    found = guest_runtimes() if node == BOOKWORM else None
    scratch = os.path.join(cache_root, f"deb-{os.getpid()}-{unique('b')}")
    os.makedirs(scratch)
    try:
        deb = build_deb(scratch)
        key = _key(
            root.key, _runtimes_key(found), deb_key(deb), AGENT_UNIT, DISK_SCRIPT, ",".join(MASKED),
            str(sd.STOP_TIMEOUT_S), DISK_SIZE,
        )  # fmt: skip
        target = os.path.join(cache_root, f"disk-{key}")
        stamp = os.path.join(target, "built.json")
        if os.path.exists(stamp):
            with open(stamp) as f:
                recorded = float(json.load(f)["build_s"])
            return _disk(target, key, None, recorded, root, found, node)
        partial = f"{target}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        started = time.monotonic()
        try:
            _build_disk(partial, root, scratch, deb, found)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        build_s = time.monotonic() - started
        with open(os.path.join(partial, "built.json"), "w") as f:
            json.dump({"build_s": round(build_s, 1), "root": root.path, "deb": os.path.basename(deb)}, f)
        try:
            os.rename(partial, target)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)
        _prune(cache_root, keep=target)
        return _disk(target, key, build_s, build_s, root, found, node)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_disk(
    partial: str, root: Root, scratch: str, deb: str, found: GuestRuntimes | None
) -> None:
    """DISK_SCRIPT into ``partial/disk.img``, and the root's kernel and initrd beside it."""
    with open(os.path.join(scratch, "rg-agent.service"), "w") as f:
        f.write(AGENT_UNIT)
    with open(os.path.join(scratch, "runtimes.json"), "w") as f:
        json.dump(found or {}, f)
    stop = f"{int(sd.STOP_TIMEOUT_S)}s"
    env = dict(os.environ, MASKED=" ".join(MASKED), STOP=stop, MANIFEST=RUNTIMES_MANIFEST)
    trees = [r["tree"] for r in (found or {}).values()]
    argv = [
        UNSHARE, "-m", "--propagation", "private", "sh", "-c", DISK_SCRIPT, "disk",
        root.path, scratch, deb, os.path.join(partial, "disk.img"), DISK_SIZE, *trees,
    ]  # fmt: skip
    log = os.path.join(partial, "build.log")
    with open(log, "ab") as f:
        result = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=900, check=False)
    if result.returncode != 0:
        with open(log, errors="replace") as f:
            raise RuntimeError(f"building the VM disk failed:\n{f.read()[-3000:]}")
    for name in ("vmlinuz", "initrd.img"):
        path = os.path.realpath(os.path.join(root.path, name))
        # The symlinks are absolute inside the root.
        shutil.copy2(path if path.startswith(root.path) else root.path + path, os.path.join(partial, name))


def _disk(
    target: str, key: str, build_s: float | None, recorded: float, root: Root, rt: GuestRuntimes | None,
    node: str,
) -> Disk:
    return Disk(
        os.path.join(target, "disk.img"), os.path.join(target, "vmlinuz"), os.path.join(target, "initrd.img"),
        key, build_s, recorded, root, rt, node,
    )  # fmt: skip


def _prune(cache_root: str, keep: str, older_than_s: float = 3600) -> None:
    """Disks of other checkouts not used for an hour: each is a few hundred MB."""
    now = time.time()
    for name in os.listdir(cache_root):
        path = os.path.join(cache_root, name)
        if not name.startswith("disk-") or path == keep or ".partial-" in name:
            continue
        with contextlib.suppress(OSError):
            if now - os.stat(os.path.join(path, "used")).st_mtime > older_than_s:
                shutil.rmtree(path, ignore_errors=True)


# -- the running VM -------------------------------------------------------------------


class AgentError(RuntimeError):
    """The guest agent did not answer (the VM is gone or hung)."""


class Agent:
    """The host end of the virtio-serial channel: one request at a time, answers matched by id."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self._buf = b""
        self._next = 0
        self._lock = threading.Lock()

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock

    def request(self, body: dict[str, object], wait: float) -> dict[str, object]:
        with self._lock:
            assert self.sock is not None
            self._next += 1
            rid = self._next
            deadline = time.monotonic() + wait
            self.sock.settimeout(wait)
            try:
                # qemu reads the socket only once the guest has opened its port: before
                # that, a request waits in the socket buffer.
                self.sock.sendall((json.dumps({**body, "id": rid}) + "\n").encode())
            except TimeoutError as exc:
                raise AgentError(f"the guest agent took no request in {wait} s") from exc
            while True:
                while b"\n" in self._buf:
                    line, self._buf = self._buf.split(b"\n", 1)
                    with contextlib.suppress(ValueError):
                        answer = json.loads(line)
                        if answer.get("id") == rid:
                            return answer  # type: ignore[no-any-return]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgentError(f"no answer from the guest agent in {wait} s")
                self.sock.settimeout(min(left, 1.0))
                try:
                    chunk = self.sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not chunk:
                    raise AgentError("the guest agent's channel closed")
                self._buf += chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


@dataclass
class VM:
    """A booted VM; use :func:`booted_vm` to get one."""

    name: str
    layout: str
    workdir: str
    disk: Disk
    proc: subprocess.Popen[bytes]
    agent: Agent
    smp: int
    boot_s: float = 0.0

    @property
    def share(self) -> str:
        """The host side of the guest's ``/opt/rg/share``."""
        return os.path.join(self.workdir, "share")

    def run(
        self,
        *argv: str,
        timeout: float = 120,
        check: bool = True,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the guest (as root, PID 1's namespaces) through the agent."""
        answer = self.agent.request(
            {"argv": list(argv), "timeout": timeout, "input": input, "env": env or {}}, timeout + 60
        )
        rc = answer.get("rc")
        status = -9 if rc is None else int(rc)  # type: ignore[call-overload]
        proc = subprocess.CompletedProcess(
            list(argv), status, str(answer.get("stdout", "")), str(answer.get("stderr", ""))
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"in VM {self.name}: {' '.join(argv)} failed ({proc.returncode}):\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return proc

    def guest(self, script: str, *args: str, timeout: float = 600) -> dict[str, object]:
        """``python3 <share>/guest/<script> ARGS`` in the guest; its last stdout line is JSON."""
        proc = self.run("python3", f"{SHARE}/guest/{script}", *args, timeout=timeout)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        if not lines:
            raise RuntimeError(f"{script} printed nothing:\n{proc.stderr[-2000:]}")
        result: dict[str, object] = json.loads(lines[-1])
        if proc.stderr.strip():
            result.setdefault("stderr", proc.stderr[-4000:])
        return result

    def alive(self) -> bool:
        return self.proc.poll() is None

    def console(self) -> str:
        with open(os.path.join(self.workdir, "console.log"), errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 90) -> float | None:
        """``systemctl poweroff`` in the guest; SIGKILL qemu (by pid) if it is still up after ``timeout``.

        Returns the seconds the guest took to power off, None when it had to be killed.
        """
        if self.proc.poll() is not None:
            return None
        started = time.monotonic()
        poweroff = {"id": -1, "argv": ["systemctl", "--no-block", "poweroff"], "timeout": 30}
        if self.agent.sock is not None:
            with contextlib.suppress(OSError):
                self.agent.sock.sendall((json.dumps(poweroff) + "\n").encode())
        try:
            self.proc.wait(timeout)
            return time.monotonic() - started
        except subprocess.TimeoutExpired:
            return None
        finally:
            # Also on KeyboardInterrupt during the wait: qemu must never outlive its test.
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)
            self.agent.close()


def default_smp() -> int:
    """Two vCPUs where the host has more than two cores; one where a second test worker needs the other."""
    return 2 if (os.cpu_count() or 1) > 2 else 1


def _qemu_argv(disk: Disk, workdir: str, layout: str, smp: int, memory_mb: int) -> list[str]:
    append = (
        # minbase has no systemd-sysv (no /sbin/init): name systemd itself.
        "root=/dev/vda rw init=/lib/systemd/systemd console=ttyS0 loglevel=4 "
        f"systemd.unified_cgroup_hierarchy={LAYOUTS[layout]} systemd.show_status=0 panic=-1"
    )
    return [
        QEMU,
        "-accel", "tcg,thread=multi",
        "-cpu", "max",
        "-smp", str(smp),
        "-m", str(memory_mb),
        "-nographic",
        "-no-reboot",
        "-nic", "none",
        "-kernel", disk.kernel,
        "-initrd", disk.initrd,
        "-append", append,
        "-drive", f"file={disk.image},if=virtio,format=raw,snapshot=on",
        "-drive", f"file={os.path.join(workdir, 'data.img')},if=virtio,format=raw",
        "-virtfs",
        f"local,path={os.path.join(workdir, 'share')},mount_tag={SHARE_TAG},security_model=none,id=rgshare",
        "-device", "virtio-serial",
        "-chardev", f"socket,id=rgagent,path={os.path.join(workdir, 'agent.sock')},server=on,wait=off",
        "-device", f"virtserialport,chardev=rgagent,name={AGENT_PORT}",
    ]  # fmt: skip


def prepare_share(workdir: str) -> str:
    """The 9p share: the guest scripts, the CRI client and its api.proto, and the CRI images
    (built here: no network in the guest)."""
    share = os.path.join(workdir, "share")
    shutil.copytree(GUEST_SRC, os.path.join(share, "guest"), ignore=shutil.ignore_patterns("__pycache__"))
    # labkit.cri_client alone (with labkit's docstring-only __init__): the guest runs it on
    # Debian 12's grpc and protobuf, with stubs it compiles itself (setup.py).
    client = os.path.join(share, "py", "labkit")
    os.makedirs(client)
    for name in ("__init__.py", "cri_client.py"):
        if os.path.exists(os.path.join(HERE, name)):
            shutil.copy2(os.path.join(HERE, name), client)
    proto = runtimes.find(runtimes.CRI_API_PROTO)
    if proto is not None:
        os.makedirs(os.path.join(share, "cri"))
        shutil.copy2(proto, os.path.join(share, "cri", "api.proto"))
    image_dir = os.path.join(share, "images")
    os.makedirs(image_dir)
    images.pause_image(image_dir)
    images.busybox_image(image_dir)
    os.makedirs(os.path.join(share, "out"))
    return share


def make_data_disk(workdir: str) -> str:
    """The per-boot data disk: a sparse ext4 image (mkfs here takes a tenth of a second, in TCG seconds)."""
    image = os.path.join(workdir, "data.img")
    argv = [MKFS, "-q", "-F", "-L", "rgdata", image, DATA_DISK_SIZE]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return image


@contextlib.contextmanager
def booted_vm(
    base_dir: str,
    layout: str = UNIFIED,
    disk: Disk | None = None,
    smp: int | None = None,
    memory_mb: int = 2048,
    boot_timeout: float = 240,
    node: str = BOOKWORM,
) -> Iterator[VM]:
    """Boot the VM, wait until its agent answers and systemd is up; always power it off."""
    if node == SID and layout != UNIFIED:
        raise ValueError("sid's systemd (>= 258) boots cgroup v2 only")
    disk = disk or ensure_disk(node=node)
    with contextlib.suppress(OSError), open(os.path.join(os.path.dirname(disk.image), "used"), "w"):
        pass
    name = unique(f"rgvm-{layout}")
    workdir = os.path.join(base_dir, name)
    os.makedirs(workdir)
    prepare_share(workdir)
    make_data_disk(workdir)
    smp = smp or default_smp()
    vm: VM | None = None
    try:
        started = time.monotonic()
        with open(os.path.join(workdir, "console.log"), "wb") as log:
            proc = subprocess.Popen(
                _qemu_argv(disk, workdir, layout, smp, memory_mb),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        vm = VM(name, layout, workdir, disk, proc, Agent(os.path.join(workdir, "agent.sock")), smp)
        # qemu binds the socket before it listens: the file can exist while a connect is refused.
        while True:
            try:
                vm.agent.connect()
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if proc.poll() is not None or time.monotonic() - started > 30:
                    console = vm.console()[-3000:]
                    raise RuntimeError(f"qemu did not start ({proc.poll()}):\n{console}") from None
                time.sleep(0.05)
        _wait_agent(vm, started + boot_timeout)
        state = ""
        while time.monotonic() < started + boot_timeout:
            state = vm.run("systemctl", "is-system-running", check=False, timeout=30).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"VM {name} did not finish booting ({state!r}):\n{vm.console()[-3000:]}")
        vm.boot_s = time.monotonic() - started
        yield vm
    finally:
        if vm is not None:
            vm.stop()
        elif "proc" in locals():
            proc.kill()
            proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_agent(vm: VM, deadline: float) -> None:
    """One request, answered once the guest's agent has opened its port (it waits in the socket)."""
    while time.monotonic() < deadline:
        if not vm.alive():
            raise RuntimeError(f"qemu exited {vm.proc.returncode} during boot:\n{vm.console()[-3000:]}")
        try:
            vm.agent.request({"argv": ["true"], "timeout": 5}, min(10.0, max(deadline - time.monotonic(), 1)))
            return
        except AgentError:
            continue
    raise RuntimeError(f"the guest agent of {vm.name} never answered:\n{vm.console()[-3000:]}")


def main() -> None:
    """``python -m labkit.vm [build] [unified|hybrid] [bookworm|sid]``: build (or find) the cached
    disk, then boot it once and print the node's kernel, cgroups and runtimes."""
    import sys
    import tempfile

    words = sys.argv[1:]
    node = next((w for w in words if w in NODES), BOOKWORM)
    layout = next((w for w in words if w in LAYOUTS), UNIFIED)
    t = time.monotonic()
    disk = ensure_disk(node=node)
    root = disk.root
    print(
        f"{node}: root {root.path} "
        f"({root.recorded_build_s:.1f} s{', cached' if root.build_s is None else ''}); "
        f"disk {disk.image} ({disk.recorded_build_s:.1f} s{', cached' if disk.build_s is None else ''}); "
        f"{time.monotonic() - t:.1f} s here"
    )
    if "build" in words:
        return
    with tempfile.TemporaryDirectory(prefix="rgvm-") as tmp, booted_vm(tmp, layout, node=node) as vm:
        print(f"booted {vm.name} in {vm.boot_s:.1f} s (smp {vm.smp})")
        probe = (
            "uname -r; stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers; "
            "systemctl --version | head -1; containerd --version; runc --version | head -1; "
            "crun --version 2>/dev/null | head -1; python3 --version"
        )
        print(vm.run("sh", "-c", probe, check=False).stdout)
        t = time.monotonic()
        vm.run("true")
        print(f"agent round trip {time.monotonic() - t:.3f} s")


if __name__ == "__main__":
    main()
