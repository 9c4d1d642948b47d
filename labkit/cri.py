"""A private containerd with its CRI plugin, driven the way kubelet drives it.

Built on ``labkit.containerd`` (own root, state, sockets and a fresh
``/run`` under ``unshare -m``), for containerd 1.6.20 (Debian 12, config v2),
1.7.24 (trixie, config v2) and 2.1.9 (sid, config v3), the last two from
``labkit.runtimes``:

- the config starts as that containerd's own ``containerd config default``; the
  test support points root/state/sockets/CNI/opt into the lab's directory, turns
  on ``restrict_oom_score_adj`` (root here lacks CAP_SYS_RESOURCE, and the CRI
  would otherwise give pause oom_score_adj -998), sets the sandbox image to the
  locally built pause image and adds the control handler ``stock`` (a copy of
  the ``runc`` handler whose BinaryName is stock runc of the same version: a TOML
  edit, because ``runc-guardctl configure containerd`` only ever points handlers
  *at* runc-guard). Then ``runc-guardctl configure containerd --runtime
  runc-guard`` adds the handler ``runc-guard`` (BinaryName = the runc-guard under
  test); containerd's environment carries ``RUNC_GUARD_RUNTIME`` = the same
  stock runc, so both handlers end in the same runc.
- pods are host-network (no CNI), cgroupfs driver (``SystemdCgroup = false``),
  cgroup parent ``/<lab prefix>/pod<uid>`` (unique per lab and pod), so every
  container's cgroup is ``/<prefix>/pod<uid>/<container id>`` in every hierarchy.
- images (pause, busybox) come from ``labkit.images``: no network.

``CriLab.client`` is a ``labkit.cri_client.Cri`` on the private socket (stubs
compiled from Debian's ``api.proto``, see :func:`require_stubs`);
``CriLab.cri("rm", "-f", id)`` runs that module's crictl-compatible verbs in this
process. Objects are named uniquely, so labs and tests run in parallel (xdist).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import tomlkit

from labkit import containerd as cl
from labkit import cri_client, images
from labkit.kernel import (
    CGROUP_ROOT,
    FreezerHold,
    cgroup_mount_points,
    dirs_named,
    procs,
    remove_tree,
    unique,
    wait_for,
    wait_reported,
)

K8S_NS = "k8s.io"
GUARD_HANDLER = "runc-guard"
#: How long after containerd's dead-shim cleanup a pod's dead container may take to go: runc-guard
#: deletes it after the sandbox's reply (node.finisher), as soon as that cleanup's shim has exited.
SIBLING_SETTLE = 10.0
STOCK_HANDLER = "stock"
#: CRI NamespaceMode values (runtime/v1 api.proto): what kubelet sends per PID mode.
POD, CONTAINER, NODE = 0, 1, 2
PID_MODES = {"container": CONTAINER, "pod": POD, "node": NODE}
#: Plugins the CRI suite never needs; the CRI plugin itself stays on.
DISABLED = [
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.snapshotter.v1.erofs",
    "io.containerd.internal.v1.tracing",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.nri.v1.nri",
]


def guardctl_binary() -> str:
    """runc-guardctl installed next to this interpreter (as runc-guard is)."""
    return os.path.join(os.path.dirname(sys.executable), "runc-guardctl")


def _table(doc: Any, *keys: str) -> Any:
    node = doc
    for key in keys:
        if key not in node:
            node[key] = tomlkit.table()
        node = node[key]
    return node


def cri_config(workdir: str, build: cl.Build, stock_runc: str) -> str:
    """The lab's edits on ``containerd config default`` (before runc-guardctl runs)."""
    text = subprocess.run(
        [build.containerd, "config", "default"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    doc = tomlkit.parse(text)
    doc["root"] = os.path.join(workdir, "root")
    doc["state"] = os.path.join(workdir, "state")
    doc["imports"] = []
    doc["disabled_plugins"] = DISABLED
    _table(doc, "grpc")["address"] = os.path.join(workdir, "containerd.sock")
    _table(doc, "ttrpc")["address"] = os.path.join(workdir, "containerd.sock.ttrpc")
    _table(doc, "debug")["level"] = "info"
    _table(doc, "plugins", "io.containerd.internal.v1.opt")["path"] = os.path.join(workdir, "opt")
    cni_conf, cni_bin = os.path.join(workdir, "cni-conf"), os.path.join(workdir, "cni-bin")
    os.makedirs(cni_conf, exist_ok=True)
    os.makedirs(cni_bin, exist_ok=True)
    if build.config_version >= 3:
        runtime = _table(doc, "plugins", "io.containerd.cri.v1.runtime")
        runtime["enable_cdi"] = False
        runtime["cni"]["bin_dirs"] = [cni_bin]
        _table(doc, "plugins", "io.containerd.cri.v1.images", "pinned_images")["sandbox"] = images.PAUSE_IMAGE
    else:
        runtime = _table(doc, "plugins", "io.containerd.grpc.v1.cri")
        runtime["sandbox_image"] = images.PAUSE_IMAGE
        runtime["cni"]["bin_dir"] = cni_bin
    runtime["restrict_oom_score_adj"] = True
    runtime["disable_apparmor"] = True
    runtime["cni"]["conf_dir"] = cni_conf
    handlers = runtime["containerd"]["runtimes"]
    stock = copy.deepcopy(handlers["runc"])
    stock["options"]["BinaryName"] = stock_runc
    stock["options"]["SystemdCgroup"] = False
    handlers[STOCK_HANDLER] = stock
    path = os.path.join(workdir, "containerd.toml")
    with open(path, "w") as f:
        f.write(tomlkit.dumps(doc))
    return path


def configure(config: str, settings_path: str, version: int) -> str:
    """``runc-guardctl configure containerd --runtime runc-guard`` on the lab's config."""
    result = subprocess.run(
        [
            guardctl_binary(),
            "configure",
            "containerd",
            "--config",
            config,
            "--runtime",
            GUARD_HANDLER,
            "--binary",
            cl.guard_binary(),
            "--settings",
            settings_path,
            "--config-version",
            str(version),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"runc-guardctl configure failed:\n{result.stdout}{result.stderr}")
    return result.stdout


@dataclass
class Pod:
    """A CRI pod sandbox: its id, handler, PID mode and cgroup parent."""

    id: str
    name: str
    uid: str
    handler: str
    pid_mode: int
    cgroup_parent: str
    config_path: str


@dataclass
class Container:
    """A CRI container in a :class:`Pod`."""

    id: str
    pod: Pod
    config_path: str

    @property
    def cgroup_relative(self) -> str:
        # cgroupfs driver: containerd's CRI puts a container at <cgroup_parent>/<id>.
        return f"{self.pod.cgroup_parent}/{self.id}"

    def cgroup_dirs(self) -> list[str]:
        return dirs_named(self.cgroup_relative)

    def pids(self) -> list[int]:
        for root in (f"{CGROUP_ROOT}/memory", f"{CGROUP_ROOT}/unified"):
            path = root + self.cgroup_relative
            if os.path.isdir(path):
                return procs(path)
        return []


@dataclass
class CriLab:
    """A running private containerd with the CRI plugin and two runtime handlers."""

    guarded: cl.GuardedLab
    build: cl.Build
    runc: str
    client: cri_client.Cri
    prefix: str
    configure_output: str
    pods: list[Pod] = field(default_factory=list)

    @property
    def containerd(self) -> cl.Containerd:
        return self.guarded.containerd

    @property
    def settings(self) -> dict[str, str]:
        return self.guarded.settings

    @property
    def workdir(self) -> str:
        return self.guarded.workdir

    def cri(
        self, *args: str, check: bool = True, timeout: float = 60, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A crictl-style verb (``labkit.cri_client``'s CLI) on this containerd's CRI socket, in-process.

        Exit status, stdout and stderr as that CLI gives them; ``timeout`` is every RPC's deadline.
        """
        out, err = io.BytesIO(), io.BytesIO()
        data = None if stdin is None else stdin.encode()
        status = cri_client.run(self.client.with_timeout(timeout), args, data, out, err)
        text = [stream.getvalue().decode(errors="replace") for stream in (out, err)]
        proc = subprocess.CompletedProcess(list(args), status, text[0], text[1])
        if check and status != 0:
            raise RuntimeError(f"cri {' '.join(args)} failed ({status}): {proc.stderr.strip()}")
        return proc

    def write_json(self, name: str, body: dict[str, Any]) -> str:
        path = os.path.join(self.workdir, "cri-configs", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(body, f)
        return path

    def run_pod(self, handler: str, pid_mode: int, name: str = "rgcri") -> Pod:
        """``runp --runtime <handler>``: a host-network pod in the lab's cgroup prefix."""
        uid = unique("uid").split("-", 1)[1]
        pod_name = unique(name)
        parent = f"/{self.prefix}/pod{uid}"
        logs = os.path.join(self.workdir, "pod-logs", pod_name)
        os.makedirs(logs, exist_ok=True)
        config = self.write_json(
            f"{pod_name}-pod.json",
            {
                "metadata": {"name": pod_name, "namespace": "rgcri", "uid": uid, "attempt": 0},
                "log_directory": logs,
                "linux": {
                    "cgroup_parent": parent,
                    "security_context": {"namespace_options": {"network": NODE, "pid": pid_mode}},
                },
            },
        )
        pod = Pod("", pod_name, uid, handler, pid_mode, parent, config)
        self.pods.append(pod)
        pod.id = self.cri("runp", "--runtime", handler, config).stdout.strip()
        return pod

    def create(self, pod: Pod, command: list[str], name: str = "work") -> Container:
        """``create`` + ``start``: a busybox container with the pod's PID mode."""
        cname = unique(name)
        config = self.write_json(
            f"{cname}-ctr.json",
            {
                "metadata": {"name": cname, "attempt": 0},
                "image": {"image": images.BUSYBOX_IMAGE},
                "command": command,
                "log_path": f"{cname}.log",
                "linux": {"security_context": {"namespace_options": {"network": NODE, "pid": pod.pid_mode}}},
            },
        )
        cid = self.cri("create", pod.id, config, pod.config_path).stdout.strip()
        self.cri("start", cid)
        return Container(cid, pod, config)

    def start_sleepers(self, pod: Pod, children: int = 3) -> Container:
        """A container whose init forks ``children`` sleepers; waits for all of them."""
        ctr = self.create(pod, cl.sleepers_command(children))
        if not wait_for(lambda: len(ctr.pids()) >= children + 1, 15):
            raise RuntimeError(f"container {ctr.id} did not start {children} children: {ctr.pids()}")
        return ctr

    def inspect(self, cid: str) -> dict[str, Any]:
        """The container's verbose status, as ``inspect`` prints it (``info.pid``: its init)."""
        return self.client.container_status(cid)

    def state(self, cid: str) -> str | None:
        """CONTAINER_RUNNING / CONTAINER_EXITED / ..., None when CRI no longer knows it (or cannot say)."""
        try:
            return self.client.container_state(cid)
        except cri_client.CriError:
            return None

    def init_pid(self, cid: str) -> int:
        return int(self.inspect(cid)["info"]["pid"])

    def runtime_state(self, cid: str) -> bool:
        """Whether the shim's runc still has state for ``cid`` (/run/containerd/runc/k8s.io)."""
        return os.path.exists(self.containerd.runc_state(K8S_NS, cid))

    def bundle_exists(self, cid: str) -> bool:
        return os.path.exists(self.containerd.bundle(K8S_NS, cid))

    def remove_pod(self, pod: Pod) -> None:
        """Whatever state a test left: kill its processes, stop and remove it, remove its cgroups."""
        cl.kill_cgroup_procs(pod.cgroup_parent)
        if pod.id and self.containerd.alive():
            for _ in range(3):
                if self.cri("inspectp", pod.id, check=False).returncode != 0:
                    break  # CRI no longer knows it
                self.cri("stopp", pod.id, check=False)
                if self.cri("rmp", "-f", pod.id, check=False).returncode == 0:
                    break
        cl.kill_cgroup_procs(pod.cgroup_parent)
        wait_for(lambda: not any(procs(d) for d in dirs_named(pod.cgroup_parent)), 10)
        for mount in cgroup_mount_points():
            remove_tree(os.path.join(mount, pod.cgroup_parent.strip("/")))

    @contextlib.contextmanager
    def pod(self, handler: str, pid_mode: int) -> Iterator[Pod]:
        """A pod removed with everything in it, even when the test fails."""
        pod = self.run_pod(handler, pid_mode)
        try:
            yield pod
        finally:
            self.remove_pod(pod)


def missing_prerequisites(build: cl.Build) -> str | None:
    """Why a CRI lab cannot run here, or None."""
    return (
        cl.missing_prerequisites(build)
        or images.missing_tools()
        or (None if os.path.exists(guardctl_binary()) else f"{guardctl_binary()} is missing (make venv)")
    )


def require_stubs() -> str:
    """The CRI client's stubs for Debian's api.proto (compiled once, cached in /var/tmp).

    Without the proto or grpcio/grpcio-tools the test stops naming what is missing:
    a failure under CI, a skip elsewhere (labkit.prereq).
    """
    from labkit import prereq, runtimes

    proto = runtimes.require(runtimes.CRI_API_PROTO)
    try:
        import grpc  # type: ignore[import-untyped]  # noqa: F401

        return cri_client.generate_stubs(proto)
    except (ImportError, cri_client.StubsUnavailable) as e:
        prereq.missing(f"the CRI client (pip install grpcio grpcio-tools, the .[test] extra): {e}")


def find_stubs() -> str:
    """:func:`require_stubs` outside pytest (make demo, bench/): SystemExit naming what is missing."""
    from labkit import runtimes

    proto = runtimes.find(runtimes.CRI_API_PROTO)
    if proto is None:
        raise SystemExit(runtimes.why_missing(runtimes.CRI_API_PROTO))
    try:
        return cri_client.generate_stubs(proto)
    except cri_client.StubsUnavailable as e:
        raise SystemExit(f"the CRI client: {e}") from e


@contextlib.contextmanager
def cri_lab(workdir: str, build: cl.Build, stubs: str, **overrides: str) -> Iterator[CriLab]:
    """Start a CRI containerd for ``build`` in ``workdir``, images imported; always stop it.

    ``stubs``: the CRI client's generated stubs (:func:`require_stubs` / :func:`find_stubs`).
    """
    os.makedirs(os.path.join(workdir, "bin"), exist_ok=True)
    settings = cl.guard_settings(workdir, **{"RUNC_GUARD_RUNTIME": build.runc, **overrides})
    config = cri_config(workdir, build, build.runc)
    configured = configure(config, settings["RUNC_GUARD_CONFIG"], build.config_version)
    with running_cri(workdir, build, stubs, config, settings, configured) as lab:
        yield lab


@contextlib.contextmanager
def running_cri(
    workdir: str, build: cl.Build, stubs: str, config: str, settings: dict[str, str],
    configured: str = "", prefix_name: str = "rgcri",
) -> Iterator[CriLab]:
    """A CRI containerd on ``config`` (prepared by the caller), images imported; always stopped.

    Its pods' cgroups live below a unique ``prefix_name`` parent, removed afterwards.
    """
    image_dir = os.path.join(workdir, "images")
    os.makedirs(image_dir, exist_ok=True)
    built = [images.pause_image(image_dir), images.busybox_image(image_dir)]
    prefix = unique(prefix_name)
    try:
        with cl.running_containerd(workdir, settings, cl.HYBRID, build, config=config) as ctd:
            client = cri_client.Cri("unix://" + ctd.address, stubs, timeout=60)
            lab = CriLab(cl.GuardedLab(ctd, settings, workdir), build, build.runc, client, prefix, configured)
            try:
                for image in built:
                    ctd.ctr(K8S_NS, "images", "import", image.tar, timeout=120)
                for image in built:
                    if not wait_for(lambda i=image: _has_image(client, i.name), 20, 0.1):
                        raise RuntimeError(f"CRI does not see {image.name}:\n{ctd.log()[-2000:]}")
                yield lab
            finally:
                for pod in list(lab.pods):
                    with contextlib.suppress(Exception):
                        lab.remove_pod(pod)
                client.close()
    finally:
        cl.kill_cgroup_procs(prefix)
        wait_for(lambda: not any(procs(d) for d in dirs_named(prefix)), 10)
        for mount in cgroup_mount_points():
            remove_tree(os.path.join(mount, prefix))


def _has_image(client: cri_client.Cri, name: str) -> bool:
    """Whether the CRI sees ``name`` yet (its plugin may still be starting: no answer is a no)."""
    try:
        return client.image_status(name, timeout=5) is not None
    except cri_client.CriError:
        return False


@contextlib.contextmanager
def cri_lab_in(factory: Any, name: str, build: cl.Build, stubs: str, **overrides: str) -> Iterator[CriLab]:
    """cri_lab in a fresh temp dir from pytest's ``tmp_path_factory``, removed afterwards."""
    workdir = str(factory.mktemp(name))
    try:
        with cri_lab(workdir, build, stubs, **overrides) as lab:
            yield lab
    finally:
        wait_reported(os.path.join(workdir, "rg-cache"))
        shutil.rmtree(workdir, ignore_errors=True)


def shim_of(pid: int) -> int:
    """The shim above ``pid``: its parent, checked to be containerd-shim-runc-v2."""
    with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    with open(f"/proc/{ppid}/cmdline", "rb") as f:
        argv0 = f.read().split(b"\0")[0]
    if not os.path.basename(argv0).startswith(b"containerd-shim"):
        raise LookupError(f"parent {ppid} of {pid} is {argv0!r}, not a shim")
    return ppid


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def hold_children(ctr: Container, init: int, held: int = 2) -> FreezerHold:
    hold = FreezerHold.create()
    hold.hold([p for p in ctr.pids() if p != init][:held])
    return hold


def elapsed(start: float) -> float:
    return round(time.monotonic() - start, 3)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def timed_release(cell: Cell, hold: FreezerHold, start: float) -> Callable[[], None]:
    """``hold.release`` that first notes when, and how many held children were still alive.

    The proof that a teardown was slow: the held children lived until ``released_s``
    (``held_at_release`` > 0), whatever the runtime under test did meanwhile.
    """

    def release() -> None:
        cell.held_at_release = sum(_running(p) for p in hold.pids)
        cell.timings["released_s"] = elapsed(start)
        hold.release()

    return release


class ExitWatch:
    """Polls a container's CRI state in a thread: when did it first read EXITED?"""

    def __init__(self, lab: CriLab, cid: str, start: float) -> None:
        self.lab, self.cid, self.start = lab, cid, start
        self.exited_s: float | None = None
        self.states: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            state = self.lab.state(self.cid)
            if state not in self.states:
                self.states.append(str(state))
            if state == "CONTAINER_EXITED":
                self.exited_s = elapsed(self.start)
                return
            self._stop.wait(0.05)

    def wait(self, timeout: float) -> float | None:
        self._thread.join(timeout)
        return self.exited_s

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Cell:
    """What one scenario left behind and how long the CRI calls took."""

    scenario: str
    handler: str
    pid_mode: str
    container_id: str = ""
    sandbox_id: str = ""
    left: list[str] = field(default_factory=list)  # cgroup dirs of the container and below
    sandbox_left: list[str] = field(default_factory=list)
    runtime_state: bool = False  # runc state of the container still there
    sandbox_runtime_state: bool = False
    bundle: bool = False  # containerd's bundle of the container still there
    timings: dict[str, float | None] = field(default_factory=dict)
    guard_deletes: list[dict[str, Any]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # runc-guard records left for these ids
    after_removal: dict[str, Any] = field(default_factory=dict)  # after kubelet's rm -f, stopp, rmp
    alive: int = 0  # the container's processes still alive when measured
    held_at_release: int = 0  # held children still alive when the hold was released
    after_sweep: dict[str, Any] = field(default_factory=dict)  # after runc-guardctl sweep
    log_lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def leaked(self) -> bool:
        return bool(self.left or self.sandbox_left or self.runtime_state or self.sandbox_runtime_state)

    def summary(self) -> str:
        t = " ".join(f"{k}={v}" for k, v in self.timings.items())
        return (
            f"{self.scenario:9} pid={self.pid_mode:9} {self.handler:10} dirs={len(self.left)}"
            f"+{len(self.sandbox_left)} state={int(self.runtime_state)}"
            f"+{int(self.sandbox_runtime_state)} records={len(self.pending)} alive={self.alive}"
            f" held-at-release={self.held_at_release} {t}"
            + (f" after-rm={self.after_removal}" if self.after_removal else "")
            + (f" after-sweep={self.after_sweep}" if self.after_sweep else "")
        )


def _collect(lab: CriLab, cell: Cell, ctr: Container, pod: Pod, since: int) -> None:
    wait_for(lambda: not ctr.pids(), 5)
    cell.alive = len(ctr.pids())
    cell.left = ctr.cgroup_dirs()
    cell.sandbox_left = dirs_named(f"{pod.cgroup_parent}/{pod.id}")
    cell.runtime_state = lab.runtime_state(ctr.id)
    cell.sandbox_runtime_state = lab.runtime_state(pod.id)
    cell.bundle = lab.bundle_exists(ctr.id)
    cell.guard_deletes = [
        e
        for e in cl.guard_events(lab.settings, "delete")[since:]
        if e.get("container_id") in (ctr.id, pod.id)
    ]
    cell.pending = [r for r in cl.pending_records(lab.settings) if r.startswith((ctr.id, pod.id))]
    cell.log_lines = [
        line
        for line in lab.containerd.log().splitlines()
        if (ctr.id in line or pod.id in line) and ("level=warn" in line or "level=error" in line)
    ]


def kubelet_removal(lab: CriLab, cell: Cell, ctr: Container, pod: Pod, budget: float = 20.0) -> None:
    """What kubelet does next: ``rm -f`` the container until it succeeds, then stopp and rmp.

    Records what is left after that (``after_removal``): the container's dirs,
    its runc state, and runc-guard's records for it.
    """
    start = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        p = lab.cri("rm", "-f", ctr.id, check=False)
        if p.returncode != 0:  # every failed attempt is kept, the last one too
            cell.notes.append(f"rm -f attempt {attempts} at {elapsed(start)} s: {p.stderr.strip()[-200:]}")
        if p.returncode == 0 or time.monotonic() - start > budget:
            break
        time.sleep(1.0)
    cell.timings["rm_f_s"] = elapsed(start)
    cell.timings["rm_f_attempts"] = attempts
    t = time.monotonic()
    lab.cri("stopp", pod.id, check=False)
    cell.timings["stopp_s"] = elapsed(t)
    t = time.monotonic()
    lab.cri("rmp", pod.id, check=False)
    cell.timings["rmp_s"] = elapsed(t)
    cell.after_removal = {
        "alive": len(ctr.pids()),
        "dirs": len(ctr.cgroup_dirs()),
        "state": lab.runtime_state(ctr.id),
        "records": [r for r in cl.pending_records(lab.settings) if r.startswith(ctr.id)],
    }


def sweep(lab: CriLab, pod: Pod | None = None) -> subprocess.CompletedProcess[str]:
    """``runc-guardctl sweep`` over the lab's pods (or one pod), as a node's timer would run it.

    Runs in containerd's mount namespace (runc's state root is its private
    /run/containerd/runc) with containerd's environment (runc-guard's pending dir).
    """
    tree = pod.cgroup_parent.strip("/") if pod is not None else lab.prefix
    argv = [
        guardctl_binary(),
        "sweep",
        "--kubepods",
        tree,
        "--min-age",
        "0",
        "--pacing",
        "fixed",
        "--pause",
        "0",
        "--runtime-root",
        cl.RUNC_ROOT,
        "--bundle-root",
        os.path.join(lab.containerd.state_dir, "io.containerd.runtime.v2.task"),
    ]
    return cl.in_namespace(lab.containerd, argv, timeout=120)


def after_sweep(lab: CriLab, cell: Cell, ctr: Container) -> None:
    """Sweep the container's pod, then record what is left of it (``after_sweep``)."""
    result = sweep(lab, ctr.pod)
    cell.notes.append(
        f"sweep exited {result.returncode}: {result.stdout.strip()[:300]} {result.stderr.strip()[-300:]}"
    )
    cell.after_sweep = {
        "dirs": len(ctr.cgroup_dirs()),
        "state": lab.runtime_state(ctr.id),
        "records": [r for r in cl.pending_records(lab.settings) if r.startswith(ctr.id)],
    }


def path_b(
    lab: CriLab,
    handler: str,
    pid_mode: str,
    delay: float = 1.5,
    settle: float = 12.0,
    remove: bool = True,
    run_sweep: bool = False,
    sync: threading.Barrier | None = None,
) -> Cell:
    """Init and the pod's shim SIGKILLed, 2 children dying ``delay`` s later (freezer hold).

    containerd notices the dead shim and cleans up (the runtime's ``delete
    --force`` through ``containerd-shim-runc-v2 delete``). Measured once the
    container's bundle is gone (or, where containerd never deletes it, a while
    after the sandbox's is): the cgroup dirs and runc state left.
    """
    cell = Cell("path-b", handler, pid_mode)
    since = len(cl.guard_events(lab.settings, "delete"))
    with lab.pod(handler, PID_MODES[pid_mode]) as pod:
        ctr = lab.start_sleepers(pod)
        cell.container_id, cell.sandbox_id = ctr.id, pod.id
        init = lab.init_pid(ctr.id)
        shim = shim_of(init)
        hold = hold_children(ctr, init)
        watch: ExitWatch | None = None
        try:
            start = time.monotonic()
            watch = ExitWatch(lab, ctr.id, start)
            # Shim first, init right after: the shim never sees init's exit, so the only
            # delete is containerd's dead-shim cleanup (no live-shim delete racing it).
            kill(shim)
            kill(init)
            time.sleep(max(0.0, start + delay - time.monotonic()))
            hold.release()
            # containerd is done when both bundles are gone; containerd 2.x never deletes
            # the container's (issue 10), so give it 2 s after the sandbox's.
            wait_for(lambda: not lab.bundle_exists(pod.id), settle, 0.05)
            wait_for(lambda: not lab.bundle_exists(ctr.id), 2.0, 0.05)
            if lab.bundle_exists(pod.id):
                cell.notes.append(f"sandbox bundle still there after {settle} s")
            if lab.bundle_exists(ctr.id):
                cell.notes.append("container bundle outlived the sandbox's by 2 s")
            cell.timings["cleanup_s"] = elapsed(start)
            cell.timings["exited_s"] = watch.wait(2.0)
            cell.notes.append("states: " + ",".join(watch.states))
            if handler == GUARD_HANDLER:
                # The dead-shim cleanup deletes only the sandbox; runc-guard deletes the dead
                # container (its sibling) after the sandbox's reply, in its detached finisher.
                def gone() -> bool:
                    return not ctr.cgroup_dirs() and not lab.runtime_state(ctr.id)

                wait_for(gone, SIBLING_SETTLE, 0.05)
                cell.timings["sibling_s"] = elapsed(start)
            _collect(lab, cell, ctr, pod, since)
            if remove:
                kubelet_removal(lab, cell, ctr, pod)
            if sync is not None:
                # The sweep re-drives every orphan under the runtime root, the control's
                # too: both cells must have counted what they left before it runs.
                sync.wait(120)
            if run_sweep:
                after_sweep(lab, cell, ctr)
        finally:
            if watch is not None:
                watch.stop()
            hold.destroy()
    return cell


def path_a(lab: CriLab, handler: str, pid_mode: str, release_after: float, scenario: str = "path-a") -> Cell:
    """``stop`` / ``rm`` / ``stopp`` / ``rmp`` while 2 children take ``release_after`` s to die.

    The shim is alive: the CRI's exit handling deletes the task (the runtime's
    ``delete``) and ``StopContainer`` returns once that is done. Measured right
    after ``rm``; the pod is then stopped and removed (timed too).
    """
    cell = Cell(scenario, handler, pid_mode)
    since = len(cl.guard_events(lab.settings, "delete"))
    with lab.pod(handler, PID_MODES[pid_mode]) as pod:
        ctr = lab.start_sleepers(pod)
        cell.container_id, cell.sandbox_id = ctr.id, pod.id
        init = lab.init_pid(ctr.id)
        hold = hold_children(ctr, init)
        start = time.monotonic()
        timer = threading.Timer(release_after, timed_release(cell, hold, start))
        watch: ExitWatch | None = None
        try:
            watch = ExitWatch(lab, ctr.id, start)
            timer.start()
            stop = lab.cri("stop", "-t", "0", ctr.id, check=False)
            cell.timings["stop_s"] = elapsed(start)
            if stop.returncode != 0:
                cell.notes.append(f"stop exited {stop.returncode}: {stop.stderr.strip()}")
            cell.timings["exited_s"] = watch.wait(30)
            t = time.monotonic()
            rm = lab.cri("rm", ctr.id, check=False)
            cell.timings["rm_s"] = elapsed(t)
            if rm.returncode != 0:
                cell.notes.append(f"rm exited {rm.returncode}: {rm.stderr.strip()}")
            timer.join()
            wait_for(lambda: not ctr.pids(), 5)
            _collect(lab, cell, ctr, pod, since)
            t = time.monotonic()
            lab.cri("stopp", pod.id, check=False)
            cell.timings["stopp_s"] = elapsed(t)
            t = time.monotonic()
            lab.cri("rmp", pod.id, check=False)
            cell.timings["rmp_s"] = elapsed(t)
            # The sandbox only ends with the pod: count what its removal left.
            cell.sandbox_left = dirs_named(f"{pod.cgroup_parent}/{pod.id}")
            cell.sandbox_runtime_state = lab.runtime_state(pod.id)
        finally:
            timer.cancel()
            if watch is not None:
                watch.stop()
            hold.destroy()
    return cell


#: containerd versions the CRI suite runs on, each with the runc it ships.
VERSIONS = (cl.CONTAINERD_16, cl.CONTAINERD_17, cl.CONTAINERD_21)


@contextlib.contextmanager
def lab_for(version: str, factory: Any, **overrides: str) -> Iterator[CriLab]:
    """A CRI lab for ``version``; absent binaries fail under CI, skip elsewhere (labkit.prereq)."""
    from labkit import prereq

    build = cl.require_build(version)
    stubs = require_stubs()
    prereq.require_none(missing_prerequisites(build))
    with cri_lab_in(factory, f"rgcri{version.replace('.', '')}", build, stubs, **overrides) as lab:
        yield lab


def both(fn: Any, *args: Any, guard_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> tuple[Any, Any]:
    """Run ``fn(lab, handler, ...)`` for stock and runc-guard at once (2 threads): (stock, guard).

    ``guard_kwargs`` go to the runc-guard run only (e.g. a sweep afterwards).
    """
    from concurrent.futures import ThreadPoolExecutor

    lab = args[0]
    with ThreadPoolExecutor(2) as pool:
        stock = pool.submit(fn, lab, STOCK_HANDLER, *args[1:], **kwargs)
        guard = pool.submit(fn, lab, GUARD_HANDLER, *args[1:], **{**kwargs, **(guard_kwargs or {})})
        return stock.result(), guard.result()


class Labs:
    """One CRI lab per containerd version, started on first use, all stopped by ``close``.

    A module-scoped fixture holds one: tests parametrized by version share it, and
    a version whose binaries are absent stops only its own tests (labkit.prereq).
    """

    def __init__(self, factory: Any, **overrides: str) -> None:
        self.factory = factory
        self.overrides = overrides
        self._stack = contextlib.ExitStack()
        self._labs: dict[str, CriLab] = {}

    def __call__(self, version: str) -> CriLab:
        import pytest

        if version not in self._labs:
            self._labs[version] = self._stack.enter_context(lab_for(version, self.factory, **self.overrides))
        lab = self._labs[version]
        if not lab.containerd.alive():
            pytest.fail(f"containerd {version} died:\n{lab.containerd.log()[-2000:]}")
        return lab

    def close(self) -> None:
        self._stack.close()


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def lifecycle(lab: CriLab, handler: str) -> tuple[dict[str, Any], dict[str, float], list[str]]:
    """kubelet's everyday calls on one pod through ``handler``, normalized for comparison.

    Returns (results by step: exit status plus what the step must show, timings,
    the ids involved). Nothing in a result names the handler or an id, so stock
    and runc-guard results compare equal exactly when they behave the same.
    """
    res: dict[str, Any] = {}
    timings: dict[str, float] = {}
    with lab.pod(handler, CONTAINER) as pod:
        ctr = lab.create(pod, ["/bin/sh", "-c", "echo hello-out; echo hello-err >&2; exec sleep 1000"])
        wait_for(lambda: len(ctr.pids()) >= 1, 10)
        _running_steps(lab, pod, ctr, res)
        _teardown_steps(lab, pod, ctr, res, timings)
        return res, timings, [pod.id, ctr.id]


def _running_steps(lab: CriLab, pod: Pod, ctr: Container, res: dict[str, Any]) -> None:
    """ps, pods, exec variants, logs, stats, statsp, inspect(p), update on a running pod."""

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return lab.cri(*args, check=False, stdin=stdin)

    p = run("ps", "-q", "--pod", pod.id)
    res["ps"] = (p.returncode, p.stdout.split() == [ctr.id])
    p = run("ps", "-a", "-o", "json", "--id", ctr.id)
    res["ps-json"] = (p.returncode, [c["state"] for c in (_json(p) or {}).get("containers", [])])
    p = run("pods", "-q", "--id", pod.id)
    res["pods"] = (p.returncode, p.stdout.split() == [pod.id])
    p = run("pods", "-o", "json", "--id", pod.id)
    res["pods-json"] = (p.returncode, [i["state"] for i in (_json(p) or {}).get("items", [])])
    p = run("exec", "-s", ctr.id, "echo", "sync")
    res["exec-sync"] = (p.returncode, p.stdout.strip())
    p = run("exec", ctr.id, "echo", "stream")
    res["exec-stream"] = (p.returncode, p.stdout.strip())
    # The WebSocket exec stream (v4.channel.k8s.io) cannot close stdin: ``cat`` would never see
    # EOF, so the step reads one line and ends by itself (crictl's SPDY half-closed it).
    p = run("exec", "-i", ctr.id, "head", "-n1", stdin="from-stdin\n")
    res["exec-stdin"] = (p.returncode, p.stdout.strip())
    p = run("exec", ctr.id, "sh", "-c", "echo to-stderr >&2")
    res["exec-stderr"] = (p.returncode, "to-stderr" in p.stderr)
    # crictl (and labkit.cri_client) exits 1 and names the command's status on stderr.
    p = run("exec", ctr.id, "sh", "-c", "exit 3")
    res["exec-exit-code"] = (p.returncode, "exit code 3" in p.stderr)
    p = run("exec", "-s", ctr.id, "sh", "-c", "exit 4")
    res["exec-sync-exit-code"] = (p.returncode, "exited with 4" in p.stderr)
    p = run("exec", "-s", ctr.id, "/no/such/binary")
    res["exec-missing-binary"] = p.returncode != 0
    t = time.monotonic()
    p = run("exec", "-s", "--timeout", "1", ctr.id, "sleep", "30")
    res["exec-sync-timeout"] = (p.returncode != 0, time.monotonic() - t < 10)
    p = run("exec", "-s", ctr.id, "sh", "-c", "echo $$")
    res["exec-own-pidns"] = (p.returncode, p.stdout.strip() != "1" and p.stdout.strip() != "")
    p = run("logs", ctr.id)
    res["logs"] = (p.returncode, "hello-out" in p.stdout, "hello-err" in p.stderr)
    p = run("stats", "-o", "json", "--id", ctr.id)
    stats = (_json(p) or {}).get("stats", [])
    res["stats"] = (p.returncode, [s["attributes"]["id"] == ctr.id for s in stats])
    p = run("statsp", "-o", "json", "--id", pod.id)
    res["statsp"] = (
        p.returncode,
        [s["attributes"]["id"] == pod.id for s in (_json(p) or {}).get("stats", [])],
    )
    p = run("inspect", ctr.id)
    info = _json(p) or {}
    res["inspect"] = (
        p.returncode,
        info.get("status", {}).get("state"),
        isinstance(info.get("info", {}).get("pid"), int),
    )
    p = run("inspectp", pod.id)
    infop = _json(p) or {}
    # 1.6 and 1.7 name the handler in info.runtimeHandler, 2.x in the sandbox's metadata.
    handler = infop.get("info", {}).get("runtimeHandler") or infop.get("info", {}).get(
        "sandboxMetadata", {}
    ).get("Metadata", {}).get("RuntimeHandler")
    binary = infop.get("info", {}).get("runtimeOptions", {}).get("binary_name")
    expected = cl.guard_binary() if pod.handler == GUARD_HANDLER else lab.runc
    res["inspectp"] = (
        p.returncode,
        infop.get("status", {}).get("state"),
        handler == pod.handler,
        binary == expected,
    )
    p = run("update", "--cpu-share", "512", "--memory", str(64 << 20), ctr.id)
    res["update"] = (
        p.returncode,
        _read(f"{CGROUP_ROOT}/cpu{ctr.cgroup_relative}/cpu.shares"),
        _read(f"{CGROUP_ROOT}/memory{ctr.cgroup_relative}/memory.limit_in_bytes"),
    )


def _teardown_steps(
    lab: CriLab, pod: Pod, ctr: Container, res: dict[str, Any], timings: dict[str, float]
) -> None:
    """stop, rm, stopp, rmp, timed; and what each left."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return lab.cri(*args, check=False)

    t = time.monotonic()
    p = run("stop", "-t", "0", ctr.id)
    timings["stop_s"] = elapsed(t)
    res["stop"] = (
        p.returncode,
        lab.state(ctr.id),
        (_json(run("inspect", ctr.id)) or {}).get("status", {}).get("exitCode"),
    )
    t = time.monotonic()
    p = run("rm", ctr.id)
    timings["rm_s"] = elapsed(t)
    res["rm"] = (p.returncode, run("ps", "-a", "-q", "--id", ctr.id).stdout.split())
    res["rm-left"] = (ctr.cgroup_dirs(), lab.runtime_state(ctr.id))
    t = time.monotonic()
    p = run("stopp", pod.id)
    timings["stopp_s"] = elapsed(t)
    res["stopp"] = (p.returncode, _settled_pod_states(run, pod.id))
    t = time.monotonic()
    p = run("rmp", pod.id)
    timings["rmp_s"] = elapsed(t)
    res["rmp"] = (p.returncode, run("pods", "-q", "--id", pod.id).stdout.split())
    # The pod-level cgroup itself is kubelet's to remove, not containerd's.
    below = [d for d in dirs_named(pod.cgroup_parent) if not d.endswith(pod.cgroup_parent)]
    res["rmp-left"] = (below, lab.runtime_state(pod.id))


def _settled_pod_states(
    run: Callable[..., subprocess.CompletedProcess[str]], pod_id: str, settle: float = 10.0
) -> list[str]:
    """The pod's states once no longer ``SANDBOX_READY``, or as they stand after ``settle`` s.

    containerd 2.x returns StopPodSandbox once its sandbox controller saw the exit, while the
    CRI's own status turns NOTREADY in a separate exit-monitor goroutine woken by the same
    exit (internal/cri/server/events.go, ``startSandboxExitMonitor``): the listing may still
    say READY for a moment whatever the runtime. 1.6 and 1.7 wait for that update before
    returning. A pod that never leaves READY still shows it here.
    """

    def states() -> list[str]:
        p = run("pods", "-o", "json", "--id", pod_id)
        return [i["state"] for i in (_json(p) or {}).get("items", [])]

    wait_for(lambda: "SANDBOX_READY" not in states(), settle, interval=0.05)
    return states()


def rm_retry(lab: CriLab, handler: str, pid_mode: str, release_after: float, budget: float = 45.0) -> Cell:
    """kubelet's removal: ``rm -f`` every second until it succeeds, children dying slowly."""
    cell = Cell("rm-retry", handler, pid_mode)
    since = len(cl.guard_events(lab.settings, "delete"))
    with lab.pod(handler, PID_MODES[pid_mode]) as pod:
        ctr = lab.start_sleepers(pod)
        cell.container_id, cell.sandbox_id = ctr.id, pod.id
        hold = hold_children(ctr, lab.init_pid(ctr.id))
        start = time.monotonic()
        timer = threading.Timer(release_after, timed_release(cell, hold, start))
        try:
            timer.start()
            attempts = 0
            while True:
                attempts += 1
                p = lab.cri("rm", "-f", ctr.id, check=False)
                if p.returncode == 0:
                    break
                cell.notes.append(f"attempt {attempts} at {elapsed(start)} s: {p.stderr.strip()[-300:]}")
                if time.monotonic() - start > budget:
                    break
                time.sleep(1.0)
            cell.timings["rm_f_total_s"] = elapsed(start)
            cell.timings["attempts"] = attempts
            timer.join()
            _collect(lab, cell, ctr, pod, since)
            cell.sandbox_left, cell.sandbox_runtime_state = [], False  # the pod still runs
        finally:
            timer.cancel()
            hold.destroy()
    return cell


def cell_params(gaps: dict[tuple[str, str], str]) -> list[Any]:
    """pytest params (version, PID mode) for every cell; ``gaps`` marks known failures xfail.

    ``gaps`` maps (version, mode) to the observed reason: the cell still runs and
    keeps its assertions. Strict: a cell that starts passing fails the run until its
    gap is removed, so a gap can neither hide a regression nor outlive its fix.
    """
    import pytest

    params = []
    for version in VERSIONS:
        for mode in PID_MODES:
            gap = gaps.get((version, mode))
            marks = [pytest.mark.xfail(reason=gap, strict=True)] if gap else []
            params.append(pytest.param(version, mode, marks=marks, id=f"{version}-{mode}"))
    return params


def assert_guard_clean(cell: Cell) -> None:
    """runc-guard's cell: 0 cgroup dirs, 0 runc state, 0 processes; also after kubelet's removal."""
    reached = [
        (e.get("container_id", "")[:12], e.get("force"), e.get("outcome"), e.get("exit_status"))
        for e in cell.guard_deletes
    ]
    detail = (
        f"{cell.summary()} notes={cell.notes} deletes reaching runc-guard={reached} "
        f"containerd warnings={cell.log_lines}"
    )
    assert cell.left == [], detail
    assert not cell.runtime_state, detail
    assert cell.sandbox_left == [], detail
    assert not cell.sandbox_runtime_state, detail
    assert cell.alive == 0, detail
    if cell.after_removal:
        assert cell.after_removal == {"alive": 0, "dirs": 0, "state": False, "records": []}, detail
