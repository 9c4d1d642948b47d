"""A private, real containerd 1.6 for the end-to-end suite and ``make demo``.

Isolation (never the machine's containerd, docs/background.md, the labs): containerd gets its own
``root``, ``state`` and gRPC/ttrpc sockets in a temp dir, and runs in a private
mount namespace whose ``/run`` is a fresh tmpfs. The namespace is needed because
containerd 1.6 hard-codes two host paths: shims put their sockets in
``/run/containerd/s`` and ``ctr`` its fifos in ``/run/containerd/fifo``. Only
``/run/systemd`` is bound back in, so a journald socket stays reachable. ``ctr``
runs inside the same namespace (``nsenter -m``), and the shim, runc-guard and
runc inherit it. The namespace can also get another cgroup layout (see
``HYBRID``, ``LEGACY``, ``UNIFIED``); the host sees the same cgroups.

containerd is started and stopped by its pid; shims it leaves behind are found
as the processes in that private mount namespace, which only this lab created.
Every task gets its own containerd namespace, so its cgroups live under
``/<namespace>/<id>`` in every hierarchy and are removed with the namespace.

Other containerd and runc versions (Debian's archive, labkit.runtimes)
----------------------------------------------------------------------
The same lab runs trixie's containerd 1.7 and sid's containerd 2.1 with sid's
runc 1.3, each fetched from Debian's archive by ``labkit.runtimes``. Pick a
build and a runc by name::

    build = cl.require_build(cl.CONTAINERD_21)      # cannot be had: fails under CI, else skips
    runc = cl.require_runc(cl.RUNC_1_3)             # RUNC_1_1 (Debian 12's 1.1.5) or RUNC_1_3
    with cl.guarded_containerd_in(factory, "name", build=build, runc=runc) as lab:
        task = cl.run_task(lab.containerd, ns, cl.guard_binary())   # runc-guard -> runc 1.3
        crash = cl.path_b_crash(lab.containerd, ns, runc, delay=1.5)  # stock runc 1.3

- ``build`` (a :class:`Build`; default ``None`` = Debian 12's containerd 1.6.20)
  chooses the ``containerd`` and ``ctr`` binaries, the config layout
  (``version = 2`` up to 1.7, ``version = 3`` for 2.x) and the PATH: the build's
  own directory comes first, so containerd starts its own ``containerd-shim-runc-v2``.
  ``Containerd.ctr`` always runs the build's own ``ctr``. Every version's shim keeps
  runc state under ``/run/containerd/runc/<ns>/<id>``: inside the lab's private
  ``/run`` (``Containerd.runc_state(ns, id)`` gives the host-visible path).
- ``runc`` (a path) is the runtime runc-guard fronts: ``RUNC_GUARD_RUNTIME`` of the
  lab's settings, which ``running_containerd`` writes into the settings file with the
  others (``settings_into_file``): the launcher routes and admits by the file, as on a node. The same
  path given to ``run_task``/``path_b_crash``/``path_a`` as ``binary`` is the stock
  control (``ctr run --runc-binary``).
- ``running_containerd(..., build=..., config=...)`` also takes a ready-made
  config file (the CRI lab writes its own); without it the lab writes one.
- Helpers for tests on any build: ``missing_prerequisites(build)`` (why the lab
  cannot run here, for ``labkit.prereq``), ``guard_events(settings, "delete")`` (runc-guard's
  event lines, with the runtime it ran and the outcome), ``Containerd.runc_state``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from labkit import runtimes
from labkit.kernel import (
    BUSYBOX,
    CGROUP_ROOT,
    FREEZER,
    FreezerHold,
    cgroup_mount_points,
    dirs_named,
    procs,
    remove_tree,
    shim_of,
    unique,
    wait_for,
    wait_reported,
)
from runc_guard.node.containerd_config import CRI_PLUGIN

CONTAINERD = shutil.which("containerd") or "/usr/bin/containerd"
CTR = shutil.which("ctr") or "/usr/bin/ctr"
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
STOCK_RUNC = shutil.which("runc") or "/usr/sbin/runc"
CRUN = shutil.which("crun") or "/usr/bin/crun"
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The shim's runc root for a containerd namespace (containerd 1.6's default).
RUNC_ROOT = "/run/containerd/runc"
#: cgroup layouts containerd's namespace can have: the host's v1 + v2 mix, v1 only
#: (crun 1.8 refuses a hybrid host whose v2 tree has a controller, e.g. hugetlb),
#: and pure v2 (docs/background.md, the labs; its tree is the host's /sys/fs/cgroup/unified).
HYBRID, LEGACY, UNIFIED = "hybrid", "legacy", "unified"
# Plugins that would need the network, CNI or block devices: off, they only add noise.
DISABLED_PLUGINS = [
    "io.containerd.grpc.v1.cri",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.internal.v1.tracing",
    "io.containerd.tracing.processor.v1.otlp",
]


#: containerd builds the lab can run (see :func:`find_build`): Debian 12's, trixie's, sid's.
CONTAINERD_16, CONTAINERD_17, CONTAINERD_21 = "1.6", "1.7", "2.1"
#: runc versions by series (see :func:`runc_binary`): Debian 12's 1.1.5, sid's 1.3.
RUNC_1_1, RUNC_1_3 = "1.1", "1.3"
# containerd 2.x splits the CRI into several plugins; every one needs CNI or images.
DISABLED_PLUGINS_V3 = [
    *DISABLED_PLUGINS,
    "io.containerd.cri.v1.runtime",
    "io.containerd.cri.v1.images",
    "io.containerd.podsandbox.controller.v1.podsandbox",
    "io.containerd.sandbox.controller.v1.shim",
    "io.containerd.nri.v1.nri",
    "io.containerd.snapshotter.v1.erofs",
    "io.containerd.transfer.v1.local",
]


@dataclass(frozen=True)
class Build:
    """A containerd build: its binaries, config layout and the runc it ships with."""

    name: str
    containerd: str
    ctr: str
    config_version: int
    #: Directory put first on PATH (containerd 2.2 finds its own shim there), or None.
    bin_dir: str | None
    #: The runc this containerd is paired with (Debian 12's 1.1.5; sid's 1.3 for 1.7 and 2.1).
    runc: str


#: Debian's containerd 1.6.20 with its runc 1.1.5: the lab's default.
DEBIAN_BUILD = Build(CONTAINERD_16, CONTAINERD, CTR, 2, None, STOCK_RUNC)


def cri_runc_handler(version: int, systemd_cgroup: bool) -> str:
    """The CRI's ``runc`` handler as a TOML fragment in config ``version``'s layout.

    A node's driver choice (kubeadm's ``SystemdCgroup = true``) sits in a different
    table on 1.6 and 2.x: one writer for both keeps a lab's two configs the same node.
    """
    table = f'plugins."{CRI_PLUGIN[version]}".containerd.runtimes.runc'
    return (
        f"[{table}]\n"
        '  runtime_type = "io.containerd.runc.v2"\n'
        f"  [{table}.options]\n"
        f"    SystemdCgroup = {'true' if systemd_cgroup else 'false'}\n"
    )


#: The builds fetched from Debian's archive: (containerd, ctr, shim) and the config layout.
_BUILDS = {
    CONTAINERD_17: ((runtimes.CONTAINERD_17, runtimes.CTR_17, runtimes.SHIM_17), 2),
    CONTAINERD_21: ((runtimes.CONTAINERD_21, runtimes.CTR_21, runtimes.SHIM_21), 3),
}


def find_build(name: str = CONTAINERD_16) -> Build | None:
    """The containerd build ``name`` (CONTAINERD_16, _17 or _21), None when it cannot be had.

    The archive's builds are paired with sid's runc 1.3, as a node that installs
    containerd 1.7 or 2.x from its distribution gets a runc >= 1.2.
    """
    if name == CONTAINERD_16:
        return DEBIAN_BUILD
    if name not in _BUILDS:
        raise ValueError(f"unknown containerd build {name!r}")
    files, config_version = _BUILDS[name]
    binary, ctr, shim, runc = (runtimes.find(b) for b in (*files, runtimes.RUNC_13))
    if binary is None or ctr is None or shim is None or runc is None:
        return None
    return Build(name, binary, ctr, config_version, os.path.dirname(shim), runc)


def require_build(name: str) -> Build:
    """:func:`find_build`; when it cannot be had, stops the test naming the package (labkit.prereq)."""
    found = find_build(name)
    if found is None:
        for binary in (*_BUILDS[name][0], runtimes.RUNC_13):
            runtimes.require(binary)
        raise RuntimeError(f"containerd build {name} is incomplete")
    return found


def runc_binary(version: str) -> str | None:
    """Path of runc ``version`` (RUNC_1_1 is Debian 12's 1.1.5), None when it cannot be had."""
    if version == RUNC_1_1:
        return STOCK_RUNC if os.access(STOCK_RUNC, os.X_OK) else None
    if version != RUNC_1_3:
        raise ValueError(f"unknown runc version {version!r}")
    return runtimes.find(runtimes.RUNC_13)


def require_runc(version: str) -> str:
    """:func:`runc_binary`; when it cannot be had, stops the test naming the package (labkit.prereq)."""
    found = runc_binary(version)
    if found is None:
        return runtimes.require(runtimes.RUNC_13)
    return found


def guard_binary() -> str:
    """The runc-guard under test: the one installed next to this interpreter."""
    return os.path.join(os.path.dirname(sys.executable), "runc-guard")


def missing_prerequisites(build: Build | None = None) -> str | None:
    """Why this lab cannot run here (root, tools, freezer, runc-guard installed), or None."""
    build = build or DEBIAN_BUILD
    if os.geteuid() != 0:
        return "the containerd lab needs root"
    for tool in (build.containerd, build.ctr, build.runc, NSENTER, UNSHARE):
        if not os.access(tool, os.X_OK):
            return f"the containerd lab needs {tool} (make deps installs it)"
    if not os.path.isdir(FREEZER):
        return f"the containerd lab needs the cgroup v1 freezer at {FREEZER}"
    if not os.path.exists(guard_binary()):
        return f"{guard_binary()} is missing: install the package (make venv)"
    return None


def guard_settings(workdir: str, **overrides: str) -> dict[str, str]:
    """RUNC_GUARD_* variables pointing every runc-guard path into ``workdir``."""
    settings = {
        "RUNC_GUARD_CONFIG": os.path.join(workdir, "runc-guard.toml"),
        "RUNC_GUARD_CACHE_DIR": os.path.join(workdir, "rg-cache"),
        "RUNC_GUARD_PENDING_DIR": os.path.join(workdir, "rg-pending"),
        "RUNC_GUARD_LOG_FILE": os.path.join(workdir, "rg-events.jsonl"),
        "RUNC_GUARD_STATS_FILE": os.path.join(workdir, "rg-deletes.jsonl"),
        "RUNC_GUARD_JOURNAL_SOCKET": os.path.join(workdir, "no-journald.socket"),
        "RUNC_GUARD_REPORTER_LINGER": "0",
        # On by default (60 s); off in a lab unless its test is about the finisher (a
        # detached finisher would outlive the lab); the storm bench runs the shipped default.
        "RUNC_GUARD_FINISH_WINDOW": "0",
    }
    settings.update(overrides)
    return settings


#: Where the settings file's values come from on a node; only these stay in containerd's environment.
_ENV_ONLY = ("RUNC_GUARD_CONFIG", "RUNC_GUARD_CACHE_DIR", "RUNC_GUARD_STATE_DIR", "RUNC_GUARD_RUNTIMES")


_LAB_BEGIN = "# the lab's settings (labkit.containerd.settings_into_file)\n"
_LAB_END = "# end of the lab's settings\n"


def settings_into_file(settings: dict[str, str]) -> dict[str, str]:
    """Put the lab's RUNC_GUARD_* settings into its settings file, as a node has them; what stays
    in containerd's environment.

    On a node the settings are /etc/runc-guard/config.toml, and the launcher routes and
    admits a delete by the file alone (a RUNC_GUARD_* variable that routes or that the
    admission reads sends the call to the Python entry). So a lab runs the front door a
    node runs: each valid value goes to the top of the file (before any table the lab or
    ``runc-guardctl configure`` wrote), typed as settings.py reads it. A value settings.py
    refuses stays a variable, so that a test of that refusal still sees it.
    """
    from runc_guard.settings import _validated

    config = settings.get("RUNC_GUARD_CONFIG")
    if not config:
        return dict(settings)
    movable = {k: v for k, v in settings.items() if k.startswith("RUNC_GUARD_") and k not in _ENV_ONLY}
    values, problems = _validated({}, movable, config)
    refused = {f"RUNC_GUARD_{key.upper()}" for key, _message in problems}
    lines = []
    for key, value in values.items():
        if f"RUNC_GUARD_{key.upper()}" in refused:
            continue
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {float(value)!r}")
        elif isinstance(value, str):
            lines.append(f"{key} = {json.dumps(value)}")
        elif isinstance(value, tuple):
            lines.append(f"{key} = {json.dumps(list(value))}")
        else:
            refused.add(f"RUNC_GUARD_{key.upper()}")
    try:
        with open(config) as f:
            rest = f.read()
    except FileNotFoundError:
        rest = ""
    if rest.startswith(_LAB_BEGIN):  # a restart of the same lab: replace the block, never repeat a key
        rest = rest.partition(_LAB_END)[2]
    with open(config + ".tmp", "w") as f:
        f.write(_LAB_BEGIN + "".join(line + "\n" for line in lines) + _LAB_END + rest)
    os.replace(config + ".tmp", config)
    moved = {f"RUNC_GUARD_{key.upper()}" for key in values} - refused
    return {k: v for k, v in settings.items() if k not in moved}


def make_rootfs(directory: str) -> str:
    """A static-busybox root filesystem for ``ctr run --rootfs``."""
    rootfs = os.path.join(directory, "rootfs")
    os.makedirs(os.path.join(rootfs, "bin"), exist_ok=True)
    shutil.copy2(BUSYBOX, os.path.join(rootfs, "bin", "busybox"))
    for applet in ("sh", "sleep", "cat", "echo", "true", "false", "ps"):
        with contextlib.suppress(FileExistsError):
            os.symlink("busybox", os.path.join(rootfs, "bin", applet))
    for d in ("proc", "dev", "sys", "tmp", "etc"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    return rootfs


def _config(workdir: str, version: int = 2) -> str:
    disabled = DISABLED_PLUGINS_V3 if version >= 3 else DISABLED_PLUGINS
    quoted = ", ".join(json.dumps(p) for p in disabled)
    path = os.path.join(workdir, "containerd.toml")
    with open(path, "w") as f:
        f.write(
            f"version = {version}\n"
            f"root = {json.dumps(os.path.join(workdir, 'root'))}\n"
            f"state = {json.dumps(os.path.join(workdir, 'state'))}\n"
            f"disabled_plugins = [{quoted}]\n"
            "[grpc]\n"
            f"  address = {json.dumps(os.path.join(workdir, 'containerd.sock'))}\n"
            "[ttrpc]\n"
            f"  address = {json.dumps(os.path.join(workdir, 'containerd.sock.ttrpc'))}\n"
            "[debug]\n"
            '  address = ""\n'
            '  level = "info"\n'
        )
        # The opt plugin would create /opt/containerd on the host (1.6 and 2.x alike).
        f.write('[plugins."io.containerd.internal.v1.opt"]\n'
                f"  path = {json.dumps(os.path.join(workdir, 'opt'))}\n")
    return path


def _namespace_script(
    workdir: str, config: str, layout: str, containerd: str = CONTAINERD
) -> str:
    """Shell run by ``unshare -m``: private /run (keeping /run/systemd), then exec containerd."""
    keep = os.path.join(workdir, "host-run-systemd")
    os.makedirs(keep, exist_ok=True)
    steps = [
        "set -e",
        f"mount --rbind /run/systemd {keep}" if os.path.isdir("/run/systemd") else "true",
        "mount -t tmpfs -o mode=0755 rgctd-run /run",
        "mkdir -p /run/systemd",
        f"mount --rbind {keep} /run/systemd" if os.path.isdir("/run/systemd") else "true",
    ]
    if layout == LEGACY and os.path.ismount(f"{CGROUP_ROOT}/unified"):
        steps.append(f"umount {CGROUP_ROOT}/unified")
    if layout == UNIFIED:
        steps += [
            "umount -l /sys/fs/cgroup",
            "mount -t cgroup2 none /sys/fs/cgroup",
        ]
    steps.append(f"exec {containerd} --config {config}")
    return "; ".join(steps)


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _pids_in_mount_ns(ns: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _mount_ns(int(name)) == ns and int(name) != os.getpid():
            found.append(int(name))
    return found


@dataclass
class Containerd:
    """A running private containerd; use :func:`running_containerd` to get one."""

    workdir: str
    pid: int
    mount_ns: str
    layout: str
    env: dict[str, str]
    rootfs: str
    log_path: str
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    #: Which containerd this is (default: Debian's 1.6.20).
    build: Build = DEBIAN_BUILD

    @property
    def address(self) -> str:
        return os.path.join(self.workdir, "containerd.sock")

    @property
    def state_dir(self) -> str:
        return os.path.join(self.workdir, "state")

    def bundle(self, namespace: str, task_id: str) -> str:
        return os.path.join(self.state_dir, "io.containerd.runtime.v2.task", namespace, task_id)

    def runc_state(self, namespace: str, task_id: str) -> str:
        """The shim's runc state dir of a task, host view (both versions use this root)."""
        return self.inside(os.path.join(RUNC_ROOT, namespace, task_id))

    def inside(self, path: str) -> str:
        """``path`` as containerd's mount namespace sees it (e.g. /run/containerd/...)."""
        return f"/proc/{self.pid}/root{path}"

    def ctr(
        self, namespace: str, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this containerd, inside its mount namespace."""
        argv = [NSENTER, "-t", str(self.pid), "-m", "--", self.build.ctr, "-a", self.address,
                "-n", namespace, *args]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def log_lines_for(self, task_id: str) -> list[str]:
        """containerd's log lines that name ``task_id`` (``id=`` or in a path)."""
        return [line for line in self.log().splitlines() if task_id in line]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM by pid, then SIGKILL; then every process left in its mount namespace."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Shims outlive containerd by design (they are re-parented); they are ours.
        for pid in _pids_in_mount_ns(self.mount_ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _pids_in_mount_ns(self.mount_ns), 10)


@contextlib.contextmanager
def running_containerd(
    workdir: str, settings: dict[str, str], layout: str = HYBRID,
    build: Build | None = None, config: str | None = None,
) -> Iterator[Containerd]:
    """Start a private containerd with ``settings`` in its environment; always stop it.

    ``build`` picks the containerd (default Debian's 1.6.20); ``config`` is a ready
    config file (its sockets must be ``<workdir>/containerd.sock[.ttrpc]``), else
    the lab writes one in the build's layout.
    """
    build = build or DEBIAN_BUILD
    os.makedirs(workdir, exist_ok=True)
    config = config or _config(workdir, build.config_version)
    env = dict(os.environ)
    # containerd 2.x looks its shim up on PATH: the build's own shim must win.
    env["PATH"] = f"{build.bin_dir}:{SBIN_PATH}" if build.bin_dir else SBIN_PATH
    env.update(settings_into_file(settings))
    log_path = os.path.join(workdir, "containerd.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [UNSHARE, "-m", "--propagation", "private", "sh", "-c",
             _namespace_script(workdir, config, layout, build.containerd)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
        )
    lab = Containerd(
        workdir, proc.pid, "", layout, env, make_rootfs(workdir), log_path, proc, build
    )
    try:
        ready = wait_for(
            lambda: proc.poll() is not None
            or (os.path.exists(lab.address) and lab.ctr("default", "version", check=False)
                .returncode == 0),
            20, 0.05,
        )
        if proc.poll() is not None or not ready:
            raise RuntimeError(f"containerd did not start:\n{lab.log()[-3000:]}")
        lab.mount_ns = _mount_ns(proc.pid) or ""
        if lab.mount_ns == _mount_ns(os.getpid()):
            raise RuntimeError("containerd is not in a private mount namespace")
        yield lab
    finally:
        if not lab.mount_ns:
            lab.mount_ns = _mount_ns(proc.pid) or "unknown"
        lab.stop()


def sleepers_command(children: int) -> list[str]:
    """Init forks ``children`` sleepers and waits: several processes per task."""
    return ["/bin/sh", "-c", " ".join(["sleep 1000 &"] * children) + " wait"]


@dataclass
class Task:
    """A host-PID task started with ``ctr run -d --rootfs --runc-binary``."""

    lab: Containerd
    namespace: str
    id: str
    binary: str

    @property
    def cgroup_relative(self) -> str:
        # ctr's default spec puts a task at cgroupsPath /<namespace>/<id>.
        return f"/{self.namespace}/{self.id}"

    @property
    def bundle(self) -> str:
        return self.lab.bundle(self.namespace, self.id)

    def cgroup_dirs(self) -> list[str]:
        """Every directory of this task's cgroup (and below) in every hierarchy, host view."""
        return dirs_named(self.cgroup_relative)

    def main_cgroup(self) -> str:
        """A hierarchy that holds every process of the task (memory, or the v2 tree)."""
        roots = (f"{CGROUP_ROOT}/unified",) if self.lab.layout == UNIFIED else (
            f"{CGROUP_ROOT}/memory", f"{CGROUP_ROOT}/unified")
        for root in roots:
            path = root + self.cgroup_relative
            if os.path.isdir(path):
                return path
        raise FileNotFoundError(self.cgroup_relative)

    def pids(self) -> list[int]:
        try:
            return procs(self.main_cgroup())
        except FileNotFoundError:
            return []

    def init_pid(self) -> int:
        for line in self.lab.ctr(self.namespace, "task", "ls").stdout.splitlines()[1:]:
            cols = line.split()
            if cols and cols[0] == self.id:
                return int(cols[1])
        raise LookupError(f"task {self.id} is not listed")

    def status(self) -> str | None:
        for line in self.lab.ctr(self.namespace, "task", "ls").stdout.splitlines()[1:]:
            cols = line.split()
            if cols and cols[0] == self.id:
                return cols[2]
        return None

    def shim_pid(self, init: int | None = None) -> int:
        """The task's shim: init's parent (the shim is its subreaper), checked by cmdline."""
        return shim_of(init if init is not None else self.init_pid(), self.id)

    def children(self) -> list[int]:
        init = self.init_pid()
        return [p for p in self.pids() if p != init]

    def gone(self) -> bool:
        """containerd is done with the task: its bundle is deleted."""
        return not os.path.exists(self.bundle)


def run_task(
    lab: Containerd, namespace: str, binary: str, children: int = 3, prefix: str = "rgctd",
    host_pid: bool = True,
) -> Task:
    """Start a detached task through ``binary``; wait for all its processes.

    Host-PID by default (the incident's pod); ``host_pid=False`` keeps ctr's own
    PID namespace (kubelet's default pod), where killing init makes the kernel
    kill the rest and init waits in do_exit until they are gone.
    """
    task = Task(lab, namespace, unique(prefix), binary)
    # ctr asks for cpu shares 1024 by default; the v2 tree of a hybrid host has no
    # cpu controller (it is bound to v1), so under UNIFIED ask for none.
    shares = ["--cpu-shares", "0"] if lab.layout == UNIFIED else []
    pid_ns = ["--with-ns", f"pid:/proc/{lab.pid}/ns/pid"] if host_pid else []
    lab.ctr(
        namespace, "run", "-d", "--null-io", *shares, "--rootfs", "--runc-binary", binary,
        *pid_ns, lab.rootfs, task.id, *sleepers_command(children),
    )
    if not wait_for(lambda: len(task.pids()) >= children + 1, 10):
        raise RuntimeError(f"task {task.id} did not start {children} children: {task.pids()}")
    return task


def kill_cgroup_procs(relative: str) -> None:
    """SIGKILL every process in ``/<relative>`` (and below) in every hierarchy.

    A process of ours may still sit in a frozen freezer hold that a failed test
    did not destroy; moving it to the (thawed) freezer root thaws only it, so its
    SIGKILL can land.
    """
    for d in dirs_named(relative):
        for pid in procs(d):
            if os.path.isdir(FREEZER):
                with contextlib.suppress(OSError), \
                        open(os.path.join(FREEZER, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def remove_namespace(lab: Containerd, namespace: str) -> None:
    """Remove every task, container and cgroup of a containerd namespace, whatever state."""
    kill_cgroup_procs(namespace)
    if lab.alive():
        for _ in range(3):
            ids = [
                line.split()[0]
                for line in lab.ctr(namespace, "task", "ls", check=False).stdout.splitlines()[1:]
                if line.strip()
            ]
            for tid in ids:
                lab.ctr(namespace, "task", "kill", "-a", "-s", "KILL", tid, check=False)
                lab.ctr(namespace, "task", "delete", "-f", tid, check=False)
            containers = lab.ctr(namespace, "container", "ls", "-q", check=False).stdout.split()
            for cid in containers:
                lab.ctr(namespace, "container", "rm", cid, check=False)
            if not ids and not containers:
                break
        lab.ctr("default", "namespace", "rm", namespace, check=False)
    kill_cgroup_procs(namespace)
    wait_for(lambda: not any(procs(d) for d in dirs_named(namespace)), 10)
    for mount in cgroup_mount_points():
        remove_tree(os.path.join(mount, namespace))


@contextlib.contextmanager
def namespace(lab: Containerd, prefix: str = "rgctd") -> Iterator[str]:
    """A unique containerd namespace, removed with all it holds even on failure."""
    ns = unique(prefix)
    try:
        yield ns
    finally:
        remove_namespace(lab, ns)


@dataclass
class CrashResult:
    """What one Path B crash left behind."""

    task_id: str
    delay: float
    left: list[str]
    cleanup_s: float
    bundle_gone: bool


def path_b_crash(
    lab: Containerd, ns: str, binary: str, delay: float, children: int = 3, held: int = 2,
    settle: float = 15.0, nested: bool = False,
) -> CrashResult:
    """The incident's path: children frozen, init and shim SIGKILLed, released after ``delay``.

    containerd notices the dead shim and runs ``<binary> delete --force`` through
    ``containerd-shim-runc-v2 delete``; the held children die ``delay`` seconds
    after the shim. Waits until containerd deleted the bundle, then reports the
    cgroup directories left. The task's container record is removed; leftover
    cgroups are left for the caller to count and remove. ``nested`` first makes a
    child cgroup inside the task's cgroup in every hierarchy (as systemd in a
    container would).
    """
    task = run_task(lab, ns, binary, children)
    if nested:
        for d in task.cgroup_dirs():
            os.mkdir(os.path.join(d, "nested"))
    hold = FreezerHold.create()
    try:
        hold.hold(task.children()[:held])
        init = task.init_pid()
        shim = task.shim_pid(init)
        os.kill(init, signal.SIGKILL)
        wait_for(lambda: init not in task.pids(), 5)
        os.kill(shim, signal.SIGKILL)
        killed = time.monotonic()
        time.sleep(max(0.0, killed + delay - time.monotonic()))
        hold.release()
        wait_for(task.gone, settle, 0.02)
        cleanup_s = time.monotonic() - killed
        # Processes gone: the kernel finished the teardown, so what is left stays.
        if not wait_for(lambda: not task.pids(), 5):
            # Nothing killed them (the delete never ran the runtime): the test's own
            # processes, stopped by pid so that its leftovers can be counted and removed.
            for pid in task.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not task.pids(), 5)
        left = task.cgroup_dirs()
        bundle_gone = task.gone()
    finally:
        hold.destroy()
    lab.ctr(ns, "container", "rm", task.id, check=False)
    return CrashResult(task.id, delay, left, cleanup_s, bundle_gone)


def remove_dirs(paths: list[str]) -> None:
    """rmdir leaf-first; a busy one raises naming who keeps it busy, in every hierarchy.

    Issue 21's case 13 (a containerd 1.6 + runc 1.1.5 cell once found one process
    keeping the blkio cgroup busy while memory read empty) was never caught with
    enough facts: the error now carries each path's pids and, per pid, its
    /proc cgroup membership, state and command line.
    """
    for path in sorted(paths, key=lambda p: -p.count("/")):
        try:
            os.rmdir(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            report = busy_report(paths)
            if not _thaw_and_kill(paths):
                raise OSError(exc.errno, f"{exc.strerror}: {path}\n{report}") from exc
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError as again:
                raise OSError(again.errno, f"{again.strerror}: {path}\n{report}") from again


def _thaw_and_kill(paths: list[str]) -> bool:
    """A leftover the test's own container keeps busy because a runtime stopped mid-destroy left its
    v1 freezer FROZEN (issue 21, case 13: stock runc 1.1 killed at containerd's 5 s does it too):
    thaw it, SIGKILL what is inside by pid, wait. True when the paths are empty afterwards."""
    frozen = False
    for path in paths:
        state = os.path.join(path, "freezer.state")
        with contextlib.suppress(OSError), open(state) as f:
            if f.read().strip() in ("FROZEN", "FREEZING"):
                frozen = True
                with open(state, "w") as out:
                    out.write("THAWED")
    if not frozen:
        return False
    for path in paths:
        for pid in procs(path) if os.path.isdir(path) else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return wait_for(lambda: not any(procs(p) for p in paths if os.path.isdir(p)), 10)


def busy_report(paths: list[str]) -> str:
    """Who is in ``paths`` (cgroup.procs per path), and each pid's own view of its cgroups."""
    lines = []
    seen: set[int] = set()
    for path in sorted(paths):
        pids = procs(path) if os.path.isdir(path) else []
        lines.append(f"  {path}: {pids}")
        seen.update(pids)
    for pid in sorted(seen):
        facts = []
        for name in ("cgroup", "cmdline", "status"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    raw = f.read(4096).replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError as err:
                raw = f"({err.strerror})"
            if name == "status":
                raw = " ".join(x for x in raw.splitlines() if x.startswith(("State:", "PPid:", "NSpid:")))
            facts.append(f"{name}: {raw.strip()}")
        lines.append(f"  pid {pid}: " + " | ".join(facts))
    return "\n".join(lines)


def guard_events(settings: dict[str, str], event: str | None = None) -> list[dict[str, Any]]:
    """runc-guard's ``--log``-independent event lines (delete, state_unreadable ...)."""
    path = settings["RUNC_GUARD_LOG_FILE"]
    # The reporter runs at nice 19 in its own autogroup: on two cores busy with both test
    # workers it can wait many seconds for a CPU (a storm's last entry came after 10 s once).
    wait_reported(settings["RUNC_GUARD_CACHE_DIR"], timeout=30)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return [e for e in lines if event is None or e.get("event") == event]


def pending_records(settings: dict[str, str]) -> list[str]:
    directory = settings["RUNC_GUARD_PENDING_DIR"]
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def read_stats(path: str, container_ids: Collection[str]) -> list[dict[str, object]]:
    """The stats lines of ``path`` that name one of ``container_ids``, in file order.

    A lab is shared by tests running at once, so a test picks its own lines by id:
    the last line, or the lines since a count, may be another test's.
    """
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return [s for s in lines if s.get("container_id") in container_ids]


def delete_stats(settings: dict[str, str], container_ids: Collection[str]) -> list[dict[str, object]]:
    """runc-guard's per-delete stats lines (outcome, waited_ms, removed ...) of these containers."""
    return read_stats(settings["RUNC_GUARD_STATS_FILE"], container_ids)


#: Names runc-guard is invoked as (symlinks) to front another runtime via [runtimes].
WRAPPER_ALIAS = "rgctd-nvidia-guard"
CRUN_ALIAS = "rgctd-crun-guard"


def write_wrapper(directory: str, runtime: str = STOCK_RUNC) -> str:
    """A stand-in for nvidia-container-runtime: note the call, then exec the runtime.

    nvidia-container-runtime adds its hooks to ``create`` and then ``execve``s
    runc with the same argv; for what runc-guard sees that is all it does. The
    call log proves the wrapper was really in the chain.
    """
    path = os.path.join(directory, "stand-in-wrapper")
    calls = os.path.join(directory, "wrapper-calls.log")
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\necho "$*" >> {calls}\nexec {runtime} "$@"\n')
    os.chmod(path, 0o755)
    return path


def wrapper_calls(directory: str) -> list[str]:
    path = os.path.join(directory, "wrapper-calls.log")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


@dataclass
class GuardedLab:
    """A private containerd set up for runc-guard: settings, aliases and a stand-in wrapper."""

    containerd: Containerd
    settings: dict[str, str]
    workdir: str

    def alias(self, name: str) -> str:
        return os.path.join(self.workdir, "bin", name)


@contextlib.contextmanager
def guarded_containerd(
    workdir: str, layout: str = HYBRID, journal_socket: str | None = None,
    build: Build | None = None, runc: str | None = None, crun: str = CRUN, **overrides: str
) -> Iterator[GuardedLab]:
    """containerd whose environment carries runc-guard's settings (the shim inherits them).

    The settings file maps the aliases in ``<workdir>/bin`` to the stand-in
    wrapper and to ``crun`` (default Debian 12's), so one containerd serves every
    front-end combination. ``runc`` (a path) becomes ``RUNC_GUARD_RUNTIME``: the
    runtime runc-guard fronts (the stand-in wrapper then execs it too); ``build``
    picks the containerd.
    """
    os.makedirs(os.path.join(workdir, "bin"), exist_ok=True)
    extra = dict(overrides)
    if journal_socket is not None:
        extra["RUNC_GUARD_JOURNAL_SOCKET"] = journal_socket
    if runc is not None:
        extra.setdefault("RUNC_GUARD_RUNTIME", runc)
    settings = guard_settings(workdir, **extra)
    wrapper = write_wrapper(workdir, runc or STOCK_RUNC)
    with open(settings["RUNC_GUARD_CONFIG"], "w") as f:
        f.write(f"[runtimes]\n{WRAPPER_ALIAS} = {json.dumps(wrapper)}\n"
                f"{CRUN_ALIAS} = {json.dumps(crun)}\n")
    for alias in (WRAPPER_ALIAS, CRUN_ALIAS):
        with contextlib.suppress(FileExistsError):
            os.symlink(guard_binary(), os.path.join(workdir, "bin", alias))
    with running_containerd(workdir, settings, layout, build) as lab:
        yield GuardedLab(lab, settings, workdir)


@contextlib.contextmanager
def guarded_containerd_in(
    factory: Any, name: str, layout: str = HYBRID, journal_socket: str | None = None,
    build: Build | None = None, runc: str | None = None, crun: str = CRUN, **overrides: str
) -> Iterator[GuardedLab]:
    """guarded_containerd in a fresh temp dir from pytest's ``tmp_path_factory``, removed afterwards."""
    workdir = str(factory.mktemp(name))
    try:
        with guarded_containerd(workdir, layout, journal_socket, build, runc, crun, **overrides) as lab:
            yield lab
    finally:
        wait_reported(os.path.join(workdir, "rg-cache"))
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class PathAResult:
    task: Task
    delete: subprocess.CompletedProcess[str]
    hold: FreezerHold


@contextlib.contextmanager
def path_a(
    lab: Containerd, ns: str, binary: str, release_after: float | None, children: int = 3,
    held: int = 2,
) -> Iterator[PathAResult]:
    """The normal path: ``ctr task kill -s KILL``, then ``ctr task delete`` while children hang.

    The held children are released ``release_after`` seconds after the delete
    began (never, if None: the caller decides). The hold is destroyed on exit.
    """
    import threading

    task = run_task(lab, ns, binary, children)
    hold = FreezerHold.create()
    timer: threading.Timer | None = None
    try:
        hold.hold(task.children()[:held])
        lab.ctr(ns, "task", "kill", "-s", "KILL", task.id)
        if not wait_for(lambda: task.status() == "STOPPED", 10, 0.05):
            raise RuntimeError(f"task {task.id} did not stop: {task.status()}")
        if release_after is not None:
            timer = threading.Timer(release_after, hold.release)
            timer.start()
        delete = lab.ctr(ns, "task", "delete", task.id, check=False)
        if timer is not None:
            timer.join()
        yield PathAResult(task, delete, hold)
    finally:
        if timer is not None:
            timer.cancel()
        hold.destroy()


def in_namespace(lab: Containerd, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in containerd's mount namespace, with containerd's environment."""
    return subprocess.run(
        [NSENTER, "-t", str(lab.pid), "-m", "--", *argv], capture_output=True, text=True,
        timeout=timeout, check=False, stdin=subprocess.DEVNULL, env=lab.env,
    )


@dataclass
class StormResult:
    """Totals of a crash storm through one runtime."""

    runtime: str
    cycles: int = 0
    leaked_dirs: int = 0
    leaking_containers: int = 0
    waited_ms: list[int] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    leaking_ids: list[str] = field(default_factory=list)


def crash_storm(
    lab: Containerd, ns: str, binary: str, label: str, delays: list[float],
    progress: Callable[[str, int, int, CrashResult], None] | None = None,
) -> StormResult:
    """One Path B crash per delay through ``binary``; leftovers are counted, then removed."""
    result = StormResult(label)
    for i, delay in enumerate(delays, 1):
        crash = path_b_crash(lab, ns, binary, delay)
        result.cycles += 1
        result.leaked_dirs += len(crash.left)
        result.leaking_containers += bool(crash.left)
        result.task_ids.append(crash.task_id)
        if crash.left:
            result.leaking_ids.append(crash.task_id)
        remove_dirs(crash.left)
        if progress is not None:
            progress(label, i, len(delays), crash)
    return result
