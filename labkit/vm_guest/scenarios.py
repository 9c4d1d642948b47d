"""Inside the VM: CRI scenarios through labkit.cri_client, the way kubelet drives containerd.

Run by the host through the agent (``python3 scenarios.py NAME HANDLERS ARGS``);
prints one JSON line. The guest's python3 with the standard library, and the
CRI client from the share with the stubs setup.py compiled (one process makes
every call: a client process per call would cost 1.5-2.5 s of TCG each to
import grpc and the stubs, where crictl's Go binary started in a fraction of
that). Pods use the
systemd cgroup driver (every container is ``cri-containerd-<id>.scope`` in the
pod's ``kubepods-burstable-pod<uid>.slice``), or with setup.py's ``*-fs`` handlers
the cgroupfs driver (``/kubepods/burstable/pod<uid>/<id>``), and host networking
(no CNI here).

A slow teardown on pure cgroup v2: the v2 freezer lets SIGKILL through, so the
lab holds a container's process the way a real node does, in uninterruptible
I/O. The pod's slice gets ``IOWriteBandwidthMax`` (systemd writes the slice's
``io.max``; blk-throttle is hierarchical, so it limits the container's scope
below it: the scope's ``io.stat`` counts the bytes) and a process of the
container writes ``SLOW_BYTES`` to a hostPath volume and fsyncs (``busybox dd
conv=fsync``): cgroup v2 writeback charges those pages to the container, the
block layer throttles them, and the task sleeps in D state
(``folio_wait_bit_common``) until they are written, so a SIGKILL takes effect
only then, a time set by bytes / rate, not by scheduling luck.

The writer runs as ``busybox dd``: its comm is ``busybox``, not ``dd`` (comm is
the name exec'd), which is why an earlier version never saw "dd" in D state.

On the hybrid layout (``systemd.unified_cgroup_hierarchy=0``, the incident's) the
same hold needs two changes, both the v1 block controller's: cgroup writeback
exists only on v2 (on v1 the flusher writes every dirty page as the root
cgroup's, unthrottled), and v1 blk-throttle is flat (a limit on the pod slice
does not apply to the scope below it). So the writer there uses direct I/O
(``oflag=direct``: the task itself waits, in D, for its bios, which the
throttle holds) and the limit goes on the scope's own ``blkio`` cgroup
(``blkio.throttle.write_bps_device``) before the writer starts: the container
waits for a ``go`` file on its volume, written after the limit.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

#: setup.py's: labkit.cri_client in the share, the stubs it compiled, containerd's CRI socket.
CRI_CLIENT = "/opt/rg/share/py"
CRI_STUBS = "/var/lib/rgvm/cri-stubs/current"
ENDPOINT = "unix:///run/containerd/containerd.sock"
#: Seconds a CRI call may take: TCG plus a dead shim's cleanup (containerd's 5 s per delete).
CRI_TIMEOUT = 180.0
BUSYBOX_IMAGE = "docker.io/runc-guard-test/busybox:1"
CGROUP = "/sys/fs/cgroup"
UNIFIED, HYBRID = "unified", "hybrid"
#: cgroup2 at /sys/fs/cgroup (its root has cgroup.controllers): unified; a tmpfs of v1
#: hierarchies plus ``unified`` (cgroup2 without controllers): hybrid.
LAYOUT = UNIFIED if os.path.exists(os.path.join(CGROUP, "cgroup.controllers")) else HYBRID
RUNC_ROOT = "/run/containerd/runc/k8s.io"
TASKS = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"
PENDING = "/run/runc-guard/pending"
WORK = "/var/lib/rgvm"
#: The data disk the host attaches per boot (labkit.vm.DATA_MOUNT), apart from the root
#: disk: a throttled writer on the root disk would stall ext4's journal for the whole node.
DEVICE = "/dev/vdb"
DATA = "/var/lib/rgvm/data"
#: The pod's write limit and what the writer leaves to write back when it is killed:
#: 512 KiB at 64 KiB/s is 8 s, longer than containerd's 5 s dead-shim budget and
#: runc-guard's 4 s delete_timeout.
RATE = 64 * 1024
SLOW_BYTES = 512 * 1024
#: CRI NamespaceMode values.
PID_MODES = {"pod": 0, "container": 1, "node": 2}
NODE = 2
MEMORY_LIMIT = 64 << 20


def sh(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


@functools.cache
def cri() -> Any:
    """The process's one CRI client (a gRPC channel is safe to share between the handlers' threads)."""
    sys.path.insert(0, CRI_CLIENT)
    from labkit import cri_client

    return cri_client.Cri(ENDPOINT, CRI_STUBS, timeout=CRI_TIMEOUT)


def cri_errors() -> tuple[type[Exception], ...]:
    """What a CRI call that kubelet would retry raises (labkit.cri_client.CriError)."""
    from labkit import cri_client

    return (cri_client.CriError,)


def attempt(call: Any, *args: Any, **kwargs: Any) -> bool:
    """``call(*args)``, True when it succeeded, False on the CRI's error (kubelet retries those)."""
    try:
        call(*args, **kwargs)
    except cri_errors():
        return False
    return True


class Pod:
    """A pod sandbox through ``handler``; ``pid`` is the CRI PID namespace mode of its containers."""

    def __init__(self, handler: str, pid: str = "container") -> None:
        self.handler = handler
        self.pid = PID_MODES[pid]
        self.uid = str(uuid.uuid4())
        self.name = f"rgvm-{self.uid[:8]}"
        #: The cgroupfs driver's handlers (setup.py's ``*-fs``) take kubelet's cgroupfs pod path.
        self.cgroupfs = handler.endswith("-fs")
        self.slice = (f"/kubepods/burstable/pod{self.uid}" if self.cgroupfs
                      else f"kubepods-burstable-pod{self.uid.replace('-', '_')}.slice")  # fmt: skip
        logs = os.path.join(WORK, "logs", self.name)
        os.makedirs(logs, exist_ok=True)
        self.config: dict[str, Any] = {
            "metadata": {"name": self.name, "namespace": "rgvm", "uid": self.uid, "attempt": 0},
            "log_directory": logs,
            "linux": {"cgroup_parent": self.slice,
                      "security_context": {"namespace_options": {"network": NODE, "pid": self.pid}}},
        }  # fmt: skip
        self.id: str = cri().run_pod(self.config, handler)
        #: container id -> its hostPath volume on the data disk (host side)
        self.volumes: dict[str, str] = {}

    @property
    def slice_dir(self) -> str:
        """The pod slice's directory on the unified tree, or in the v1 ``systemd`` hierarchy (hybrid)."""
        return self.slice_in("systemd")

    def slice_in(self, controller: str) -> str:
        """The pod slice's directory in ``controller``'s hierarchy (the one tree when unified)."""
        top = CGROUP if LAYOUT == UNIFIED else os.path.join(CGROUP, controller)
        if self.cgroupfs:
            return os.path.join(top, self.slice.strip("/"))
        return os.path.join(top, "kubepods.slice", "kubepods-burstable.slice", self.slice)

    def create(
        self, command: list[str], name: str = "work", attempt: int = 0, memory: int = 0, data: bool = False,
        volume: str = "",
    ) -> str:
        """``volume``: a host directory mounted at /data that outlives this container (an emptyDir)."""
        unique = f"{name}-{uuid.uuid4().hex[:8]}"
        resources = {"memory_limit_in_bytes": memory} if memory else {}
        mounts = []
        if data:  # a hostPath volume on the data disk (writes bypass the overlay)
            host = os.path.join(DATA, unique)
            os.makedirs(host)
            mounts.append({"container_path": "/data", "host_path": host})
        elif volume:
            mounts.append({"container_path": "/data", "host_path": volume})
        config = {
            "metadata": {"name": name, "attempt": attempt},
            "image": {"image": BUSYBOX_IMAGE},
            "command": command,
            "log_path": f"{unique}.log",
            "mounts": mounts,
            "linux": {"resources": resources,
                      "security_context": {"namespace_options": {"network": NODE, "pid": self.pid}}},
        }  # fmt: skip
        cid: str = cri().create_container(self.id, config, self.config)
        if data:
            self.volumes[cid] = host
        cri().start_container(cid)
        return cid

    def remove(self) -> None:
        """kubelet's ``StopPodSandbox`` then ``RemovePodSandbox``; either may fail once it is gone."""
        attempt(cri().stop_pod, self.id)
        attempt(cri().remove_pod, self.id)
        if not self.cgroupfs:
            sh("systemctl", "reset-failed", self.slice, check=False)
            return
        # kubelet removes the pod's own cgroup once its containers are gone; runc removes only theirs.
        hierarchies = [h for h in os.listdir(CGROUP) if not os.path.islink(os.path.join(CGROUP, h))]
        for hierarchy in hierarchies if LAYOUT == HYBRID else [""]:
            with contextlib.suppress(OSError):
                os.rmdir(self.slice_in(hierarchy))


# -- what a container left ---------------------------------------------------------


def scope(cid: str) -> str:
    return f"cri-containerd-{cid}.scope"


def scope_dirs(cid: str) -> list[str]:
    """Every cgroup directory of the container, in every hierarchy: its scope, or (cgroupfs) its id."""
    found = []
    for dirpath, dirs, _files in os.walk(CGROUP):
        for d in dirs:
            if d in (scope(cid), cid):
                found.append(os.path.join(dirpath, d))
    return sorted(found)


def unit(cid: str) -> str:
    """The scope unit as systemd sees it: ``gone`` once it is unloaded, else ``active/result``."""
    out = sh("systemctl", "show", scope(cid), "-p", "LoadState,ActiveState,Result", check=False).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if props.get("LoadState") != "loaded":
        return "gone"
    return f"{props.get('ActiveState')}/{props.get('Result')}"


def scope_units() -> list[str]:
    """``systemctl list-units --all 'cri-containerd-*'``: every container scope systemd still holds."""
    out = sh("systemctl", "list-units", "--all", "--plain", "--no-legend", "cri-containerd-*", check=False)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def records(cid: str) -> list[str]:
    if not os.path.isdir(PENDING):
        return []
    found = []
    for name in os.listdir(PENDING):
        try:
            with open(os.path.join(PENDING, name)) as f:
                if cid in f.read():
                    found.append(name)
        except OSError:
            continue
    return found


def deletes(cid: str) -> list[dict[str, object]]:
    """runc-guard's journal entries for ``cid``: journald is the node's system journal here."""
    out = sh("journalctl", "-t", "runc-guard", f"CONTAINER_ID={cid}", "-o", "json", "--no-pager", check=False)
    found = []
    for line in out.stdout.splitlines():
        entry = json.loads(line)
        keys = ("EVENT", "OUTCOME", "EXIT_STATUS", "FORCE", "WAITED_MS", "PRIORITY", "MEMCG_RECLAIMED_KB",
                "MEMCG_UNRECLAIMED")
        found.append({k.lower(): entry[k] for k in keys if k in entry})
    return found


def containerd_says(cid: str) -> list[str]:
    """containerd's warnings and errors naming ``cid`` (stock runc's only trace of a failed delete).

    containerd logs to stderr, which journald files at priority info whatever its
    ``level=``: filter on the text, and on processes of containerd.service
    (the shims and runtimes it starts, runc-guard included).
    """
    out = sh("journalctl", "-u", "containerd", "--grep", cid[:12], "-o", "cat", "--no-pager", check=False)
    keep = ("level=warning", "level=error", "runc-guard", "startup_overloaded")
    return [line[:300] for line in out.stdout.splitlines() if any(k in line for k in keep)]


def left(cid: str) -> dict[str, object]:
    return {
        "dirs": len(scope_dirs(cid)),
        "unit": unit(cid),
        # The runtime's state directory under containerd's --root: runc keeps state.json there,
        # crun its status file; either runtime's delete removes the directory.
        "state": os.path.exists(os.path.join(RUNC_ROOT, cid)),
        "bundle": os.path.exists(os.path.join(TASKS, cid)),
        "records": len(records(cid)),
    }


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split()[1] for line in f if line.startswith("State:")), "?")
    except OSError:
        return "gone"


def argv_of(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def wait_for(fn, timeout: float, interval: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(interval)
    return bool(fn())


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as exc:
        return f"<{exc.strerror}>"


# -- a teardown held by throttled I/O ----------------------------------------------


WRITER = ["busybox", "dd"]


def pids_below(cgroup: str) -> list[str]:
    """The pids in ``cgroup`` and every cgroup below it: crun's systemd driver puts the container's
    processes in a ``container`` child of the scope, runc in the scope itself."""
    found = []
    for dirpath, _dirs, _files in os.walk(cgroup):
        found += read(os.path.join(dirpath, "cgroup.procs")).split()
    return [p for p in found if p.isdigit()]


def writer_in_d(cgroup: str) -> int:
    """The pid of the container's ``busybox dd`` while it sleeps in D state, else 0."""
    for pid in pids_below(cgroup):
        if pid.isdigit() and argv_of(int(pid))[:2] == WRITER and proc_state(int(pid)) == "D":
            return int(pid)
    return 0


def start_held(pod: Pod) -> tuple[str, int, str]:
    """A container whose ``busybox dd`` child sleeps in throttled I/O: its id, the writer's pid, the limit.

    Unified: the pod slice's ``io.max`` and a buffered write + fsync (cgroup
    writeback). Hybrid: the scope's own ``blkio.throttle.write_bps_device`` and a
    direct write (v1 has no cgroup writeback and its blk-throttle is flat).
    """
    if LAYOUT == UNIFIED and pod.cgroupfs:
        # No unit to set a property on: kubelet's cgroupfs driver writes the pod cgroup's files itself.
        rdev = os.stat(DEVICE).st_rdev
        with open(os.path.join(pod.slice_dir, "io.max"), "w") as f:
            f.write(f"{os.major(rdev)}:{os.minor(rdev)} wbps={RATE}")
    elif LAYOUT == UNIFIED:
        sh("systemctl", "set-property", "--runtime", pod.slice, f"IOWriteBandwidthMax={DEVICE} {RATE}")
    if LAYOUT == UNIFIED:
        write = f"busybox dd if=/dev/zero of=/data/slow bs={SLOW_BYTES} count=1 conv=fsync 2>/data/dd.err"
    else:
        write = ("while [ ! -e /data/go ]; do sleep 0.2; done; "
                 f"busybox dd if=/dev/zero of=/data/slow bs={SLOW_BYTES} count=1 oflag=direct 2>/data/dd.err")
    script = f"sleep 1000 & sleep 1000 & {write} & wait"
    cid = pod.create(["/bin/sh", "-c", script], data=True)
    procs = os.path.join(pod.slice_dir, cid if pod.cgroupfs else scope(cid))
    if LAYOUT == UNIFIED:
        limit = read(os.path.join(pod.slice_dir, "io.max"))
    else:
        rdev = os.stat(DEVICE).st_rdev
        throttle = os.path.join(pod.slice_in("blkio"), scope(cid), "blkio.throttle.write_bps_device")
        with open(throttle, "w") as f:
            f.write(f"{os.major(rdev)}:{os.minor(rdev)} {RATE}")
        limit = read(throttle)
        with open(os.path.join(pod.volumes[cid], "go"), "w"):
            pass
    writer = 0

    def seen() -> bool:
        nonlocal writer
        writer = writer_in_d(procs)
        return writer != 0

    if not wait_for(seen, 90, 0.1):
        found = [(p, argv_of(int(p)), proc_state(int(p))) for p in pids_below(procs)]
        raise RuntimeError(f"busybox dd never slept in D state: {found} in {procs}; the container's "
                           f"cgroups: {scope_dirs(cid)}")
    return cid, writer, limit


def init_and_shim(cid: str) -> tuple[int, int]:
    init = int(cri().container_status(cid)["info"]["pid"])
    with open(f"/proc/{init}/stat") as f:
        return init, int(f.read().rsplit(")", 1)[1].split()[1])


def cleanup_over(cid: str) -> bool:
    """containerd is done with a dead shim's container: the bundle is gone, or it logged the failure.

    containerd 2.x removes the bundle either way; 1.6 keeps it when the shim's delete
    failed and says ``failed to clean up after shim disconnected``.
    """
    if not os.path.exists(os.path.join(TASKS, cid)):
        return True
    pattern = f"failed to clean up after shim disconnected.*id={cid}"
    out = sh("journalctl", "-u", "containerd", "--grep", pattern, "-o", "cat", "--no-pager", check=False)
    return bool(out.stdout.strip())


def kubelet_rm(cid: str, attempts: int = 30) -> int:
    """``RemoveContainer`` until it succeeds, 1 s apart, as kubelet retries; the attempts taken (0: never)."""
    for n in range(1, attempts + 1):
        if attempt(cri().remove_container, cid):
            return n
        time.sleep(1)
    return 0


def crun_status(cid: str) -> dict[str, object] | None:
    """What crun's ``status`` says of the container's cgroup (``cgroup-path``, ``scope``, the driver);
    None behind runc (its state is ``state.json``) or once it is gone."""
    try:
        with open(os.path.join(RUNC_ROOT, cid, "status")) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return {k: doc.get(k) for k in ("cgroup-path", "scope", "systemd-cgroup")}


def teardown(handler: str, path: str, pid: str) -> dict[str, object]:
    """Path A (``StopContainer``) or B (init and shim SIGKILLed) while a process sleeps in throttled I/O.

    ``b+sibling``: the pod also has a sibling container (two sleepers) that shares the dead shim.
    Counted once containerd's own handling is over, then after kubelet's removal.
    """
    result: dict[str, object] = {"scenario": f"path-{path}", "pid": pid, "handler": handler}
    path, _, with_sibling = path.partition("+")
    pod = Pod(handler, pid)
    ids: dict[str, str] = {}
    try:
        if with_sibling:  # first: creating a container takes seconds under TCG, the hold 8
            ids["sibling"] = pod.create(["/bin/sh", "-c", "sleep 1000 & sleep 1000 & wait"], name="sibling")
        cid, slow, limit = start_held(pod)
        ids["work"] = cid
        result["ids"] = ids
        result["layout"] = LAYOUT
        result["io_max"] = limit
        init, shim = init_and_shim(cid)
        result["crun_status"] = {"work": crun_status(cid), "sandbox": crun_status(pod.id)}
        killed = time.monotonic()
        if path == "a":
            stopped = attempt(cri().stop_container, cid, 0)
            result["stop_s"] = round(time.monotonic() - killed, 2)
            result["stop_rc"] = 0 if stopped else 1
        else:
            os.kill(init, 9)
            os.kill(shim, 9)
        wait_for(lambda: proc_state(slow) in ("gone", "Z"), 120, 0.05)
        result["held_s"] = round(time.monotonic() - killed, 2)
        if path == "a":
            # kubelet's removal after its stop: CRI retries a failed delete in the background.
            result["rm_attempts"] = kubelet_rm(cid)
        else:
            # containerd's dead-shim cleanup has run its course (5 s budget per shim delete).
            wait_for(lambda: cleanup_over(cid), 10, 1.0)
        time.sleep(3)
        result["left"] = {name: left(c) for name, c in ids.items()}
        if path == "b":
            result["rm_attempts"] = {name: kubelet_rm(c) for name, c in ids.items()}
        pod.remove()
        time.sleep(1)
        result["after_removal"] = {name: left(c) for name, c in ids.items()}
        result["deletes"] = {name: deletes(c) for name, c in ids.items()}
        result["containerd"] = {name: containerd_says(c) for name, c in ids.items()}
        # The pod's sandbox (pause) shares the killed shim: its own dead-shim delete ran too,
        # of a live init. Measured after the pod's removal, like the containers.
        result["sandbox"] = {"id": pod.id, "after_removal": left(pod.id), "deletes": deletes(pod.id)}
    finally:
        pod.remove()
    return result


# -- a real memcg OOM, restarted like kubelet's CrashLoopBackOff --------------------


#: Eight sleepers, then init becomes ``busybox dd bs=200M``: dd allocates its 200 MB
#: buffer and reads /dev/zero into it, touching every page, so the 64 MiB memcg
#: reaches its limit in well under a second even under TCG (a 200 MB string built
#: by sh never got there in 120 s). The OOM killer picks dd, the largest task.
OOM_COMMAND = [
    "/bin/sh", "-c",
    "i=0; while [ $i -lt 8 ]; do sleep 1000 & i=$((i+1)); done; "
    "exec busybox dd if=/dev/zero of=/dev/null bs=200M count=1",
]  # fmt: skip


def append_command(mib: int) -> list[str]:
    """An attempt that appends ``mib`` MiB to its pod's emptyDir (no fsync: a log), forks 8 sleepers,
    and exits 1 (its sleepers die with its PID namespace).

    Not an OOM kill: the memcg's reclaim before an OOM kill would evict the appended page
    cache itself, and init cannot SIGKILL itself inside its PID namespace (the kernel
    drops signals to a namespace's init from within).
    """
    return ["/bin/sh", "-c", f"head -c {mib << 20} /dev/zero >> /data/crash.log; "
            "i=0; while [ $i -lt 8 ]; do sleep 1000 & i=$((i+1)); done; exit 1"]


#: Seconds after the last attempt's removal before the dying cgroups are counted again.
SETTLE = 15.0


def dying(path: str) -> int | None:
    """``nr_dying_descendants`` of ``path``'s ``cgroup.stat`` (removed, not yet freed), None if unreadable."""
    for line in read(os.path.join(path, "cgroup.stat")).splitlines():
        key, _, value = line.partition(" ")
        if key == "nr_dying_descendants":
            return int(value)
    return None


class DyingSampler(threading.Thread):
    """Every ``interval`` s: dying cgroups below the pod's slice and below the root, the slice's memory.

    Per parent on cgroup v2, so two handlers' pods sampled at once do not mix; the root's
    count is the node's (both handlers, and anything else).
    """

    def __init__(self, pod: Pod, interval: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.pod, self.interval, self.started = pod, interval, time.monotonic()
        self.samples: list[dict[str, object]] = []
        self.stop = threading.Event()

    def sample(self) -> dict[str, object]:
        current = read(os.path.join(self.pod.slice_dir, "memory.current"))
        row: dict[str, object] = {
            "t": round(time.monotonic() - self.started, 1), "pod": dying(self.pod.slice_dir),
            "root": dying(CGROUP), "pod_kb": int(current) >> 10 if current.isdigit() else None,
        }  # fmt: skip
        self.samples.append(row)
        return row

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.sample()


def oom_kills(pod: Pod) -> int:
    """``oom_kill`` in the pod slice's ``memory.events`` (hierarchical: counts every container's)."""
    for line in read(os.path.join(pod.slice_dir, "memory.events")).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def attempts_of(pod: Pod, mib: int) -> tuple[list[str], str]:
    """What each attempt of ``pod`` runs, and its emptyDir ("" for the OOM loop)."""
    if not mib:
        return OOM_COMMAND, ""
    # On the data disk when mounted (ext4, like the root disk): never a tmpfs, whose pages are shmem.
    volume = os.path.join(DATA if os.path.ismount(DATA) else WORK, f"emptydir-{pod.name}")
    os.makedirs(volume, exist_ok=True)
    return append_command(mib), volume


def journal_outcomes(ids: list[str]) -> tuple[int, int, dict[str, int], dict[str, Any]]:
    """runc-guard's delete entries of ``ids``: how many, how many ids had none, outcome/exit counts,
    and what they reclaimed (KiB, deletes that did) and left charged (reason -> memcgs)."""
    outcomes: dict[str, int] = {}
    memcg: dict[str, Any] = {"reclaimed_kb": 0, "reclaimed_by": 0, "unreclaimed": {}}
    journal = silent = 0
    for c in ids:
        entries = deletes(c)
        silent += not entries
        for e in entries:
            if "outcome" not in e:
                continue
            journal += 1
            key = f"{e.get('outcome')}/{e.get('exit_status')}"
            outcomes[key] = outcomes.get(key, 0) + 1
            if int(str(e.get("memcg_reclaimed_kb", 0))):
                memcg["reclaimed_kb"] += int(str(e["memcg_reclaimed_kb"]))
                memcg["reclaimed_by"] += 1
            for reason in json.loads(str(e.get("memcg_unreclaimed", "{}"))).values():
                memcg["unreclaimed"][reason] = memcg["unreclaimed"].get(reason, 0) + 1
    return journal, silent, outcomes, memcg


def crash_loop(
    handler: str, restarts: int, seconds: float, pid: str, mib: int = 0, backoff: float = 1
) -> dict[str, Any]:
    """A container that outgrows its 64 MiB ``memory.max``, restarted ``restarts`` times or for ``seconds``.

    kubelet's CrashLoopBackOff at its 1 s floor: wait for the exit, ``backoff`` s,
    create and start the next attempt, remove the previous dead container.
    ``mib``: instead each attempt appends that much to the pod's emptyDir and exits 1
    (:func:`append_command`). Dying cgroups are sampled throughout (:class:`DyingSampler`).
    """
    pod = Pod(handler, pid)
    ids: list[str] = []
    reasons: dict[str, int] = {}
    command, volume = attempts_of(pod, mib)
    sampler = DyingSampler(pod)
    start = sampler.sample()
    sampler.start()
    started = time.monotonic()
    try:
        previous = ""
        while len(ids) < restarts and time.monotonic() - started < seconds:
            cid = pod.create(command, attempt=len(ids), memory=MEMORY_LIMIT, volume=volume)
            ids.append(cid)
            status: dict[str, object] = {}

            def exited(cid: str = cid) -> bool:
                nonlocal status
                try:
                    status = cri().container_status(cid, verbose=False)["status"]
                except cri_errors():
                    return False
                return status.get("state") == "CONTAINER_EXITED"

            # kubelet's PLEG relists every second; polling the CRI faster only takes the
            # one vCPU away from the container being watched.
            wait_for(exited, 120, 1.0)
            reason = f"{status.get('reason')}/{status.get('exitCode')}"
            reasons[reason] = reasons.get(reason, 0) + 1
            if previous:
                attempt(cri().remove_container, previous)
            previous = cid
            time.sleep(backoff)
        if previous:
            attempt(cri().remove_container, previous)
        loop_s = time.monotonic() - started
        end = sampler.sample()
        time.sleep(SETTLE if mib else 3)  # the OOM loop's 3 s: the suite's cell counts no dying cgroups
        sampler.stop.set()
        settled = sampler.sample()
        kills = oom_kills(pod)
        per = [left(c) for c in ids]
        journal, silent, outcomes, memcg = journal_outcomes(ids)
        units: dict[str, int] = {}
        for p in per:
            units[str(p["unit"])] = units.get(str(p["unit"]), 0) + 1
        return {
            "scenario": "emptydir-crash-loop" if mib else "oom-crash-loop", "handler": handler, "pid": pid,
            "restarts": len(ids),
            "oom_kills": kills, "loop_s": round(loop_s, 1),
            "per_restart_s": round(loop_s / max(len(ids), 1), 2),
            "per_minute": round(max(len(ids) - 1, 0) / loop_s * 60, 2), "emptydir_mib": mib,
            "dying": {"start": start, "end": end, "settled": settled}, "samples": sampler.samples,
            "exits": reasons, "dirs": sum(int(p["dirs"]) for p in per),  # type: ignore[call-overload]
            "units": units, "units_left": sum(1 for p in per if p["unit"] != "gone"),
            "states": sum(bool(p["state"]) for p in per),
            "records": sum(int(p["records"]) for p in per),  # type: ignore[call-overload]
            "journal_deletes": journal, "journal_silent": silent, "outcomes": outcomes,
            "memcg": memcg, "ids": ids,
        }  # fmt: skip
    finally:
        sampler.stop.set()
        pod.remove()


# -- a crash storm: N pods' inits and shims SIGKILLed at once ------------------------


#: The storm's hold (the v1 freezer hold of bench.storm, as a v2 node has it): each pod's slice
#: gets this write limit on the data disk before its container starts, and the container's
#: ``busybox dd oflag=direct`` then waits in D for its one 512 KiB write (512 s at 1 KiB/s,
#: longer than any storm's setup); the hold ends when the limit is lifted (``wbps=max``: the
#: kernel re-dispatches the queued bio at once), each pod's after its own delay from the kill.
#: Direct I/O, not the teardown's buffered write + fsync: with many pods on one ext4 data disk,
#: an fsync's journal commit would wait for another pod's throttled pages (data=ordered), so
#: one pod's release would not end its own hold.
STORM_HOLD_RATE = 1024
#: Each hold ends this many seconds after the kills (seeded): bench.storm's 0.3-3 s teardowns.
STORM_HOLDS = (0.3, 3.0)
#: kubelet's RemoveContainer retries per container before the count (teardown's 30 would cost
#: minutes per storm under TCG when a container never goes).
STORM_RM_ATTEMPTS = 5
#: Seconds after the kills to wait for every sandbox's bundle to go: each shim delete has 5 s.
STORM_CLEANUP_WAIT = 30.0
STORM_WRITE = f"busybox dd if=/dev/zero of=/data/slow bs={SLOW_BYTES} count=1 oflag=direct 2>/data/dd.err"
STORM_COMMAND = ["/bin/sh", "-c", f"sleep 1000 & sleep 1000 & {STORM_WRITE} & wait"]


class StormPod:
    """One pod of the storm: a sandbox and one container (two sleepers and a held writer)."""

    def __init__(self, handler: str) -> None:
        self.pod = Pod(handler, "container")
        self.gone_s: float | None = None
        try:
            sh("systemctl", "set-property", "--runtime", self.pod.slice,
               f"IOWriteBandwidthMax={DEVICE} {STORM_HOLD_RATE}")  # fmt: skip
            self.cid = self.pod.create(STORM_COMMAND, data=True)
            procs = os.path.join(self.pod.slice_dir, scope(self.cid))
            if not wait_for(lambda: writer_in_d(procs) != 0, 90, 0.2):
                raise RuntimeError(f"the storm's writer never slept in D state in {procs}")
            self.writer = writer_in_d(procs)
            self.init, self.shim = init_and_shim(self.cid)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """The hold lifted (a held writer would keep the pod's stop waiting), then kubelet's removal."""
        with contextlib.suppress(OSError):
            self.release()
        self.pod.remove()

    def release(self) -> None:
        """Lift the slice's write limit: the held bio is dispatched, the writer's SIGKILL takes effect."""
        rdev = os.stat(DEVICE).st_rdev
        with open(os.path.join(self.pod.slice_dir, "io.max"), "w") as f:
            f.write(f"{os.major(rdev)}:{os.minor(rdev)} wbps=max")


def cpu_busy() -> tuple[float, float]:
    """The node's busy and idle CPU seconds from ``/proc/stat`` (bench.storm's figure, in TCG time)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / hz, idle / hz


def journal_by_id(since: float) -> dict[str, list[dict[str, str]]]:
    """runc-guard's journal entries since ``since`` (wall clock), per container id: one journalctl."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since - 1))
    out = sh("journalctl", "-t", "runc-guard", "--since", stamp, "-o", "json", "--no-pager", check=False)
    found: dict[str, list[dict[str, str]]] = {}
    for line in out.stdout.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            keys = ("EVENT", "OUTCOME", "EXIT_STATUS", "WAITED_MS", "REASON", "SANDBOX_ID")
            cid = str(entry.get("CONTAINER_ID", ""))
            found.setdefault(cid, []).append({k.lower(): str(entry[k])[:200] for k in keys if k in entry})
    return found


def containerd_lines(since: float, ids: list[str]) -> dict[str, list[str]]:
    """containerd's warnings and errors since ``since`` naming each id (one journalctl, filtered here)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since - 1))
    out = sh("journalctl", "-u", "containerd", "--since", stamp, "-o", "cat", "--no-pager", check=False)
    said: dict[str, list[str]] = {c: [] for c in ids}
    for line in out.stdout.splitlines():
        if "level=warning" not in line and "level=error" not in line:
            continue
        for c in ids:
            if c in line:
                said[c].append(line[:300])
    return said


def cleanup_failed(lines: list[str]) -> bool:
    """containerd said its dead-shim cleanup of this id failed (the shim delete killed at 5 s, or failed)."""
    marks = ("failed to clean up after shim disconnected", "signal: killed")
    return any(m in line for line in lines for m in marks)


def storm_left(ids: list[str]) -> dict[str, dict[str, object]]:
    """Per id: cgroup dirs (one walk of the tree for all), scope unit, runtime state, bundle, records."""
    names = {scope(c): c for c in ids} | {c: c for c in ids}
    dirs = dict.fromkeys(ids, 0)
    for _dirpath, sub, _files in os.walk(CGROUP):
        for d in sub:
            if d in names:
                dirs[names[d]] += 1
    units = set(scope_units())
    texts = []
    for directory in (PENDING, "/run/runc-guard/aside"):
        for name in os.listdir(directory) if os.path.isdir(directory) else []:
            with contextlib.suppress(OSError), open(os.path.join(directory, name)) as f:
                texts.append((directory, f.read()))
    return {c: {
        "dirs": dirs[c], "unit": scope(c) in units,
        "state": os.path.exists(os.path.join(RUNC_ROOT, c)), "bundle": os.path.exists(os.path.join(TASKS, c)),
        "records": sum(1 for d, t in texts if d == PENDING and c in t),
        "aside": sum(1 for d, t in texts if d != PENDING and c in t),
    } for c in ids}  # fmt: skip


def kill_and_release(members: list[StormPod], delays: list[float]) -> tuple[float, dict[str, object]]:
    """Every init and every shim SIGKILLed, each hold lifted after its delay, each writer's exit timed.

    Returns the kills' monotonic time, how long the kills took, and the node's busy and
    idle CPU seconds in the 5 s after them (containerd's dead-shim budget).
    """
    busy0, idle0 = cpu_busy()
    killed = time.monotonic()
    for m in members:
        os.kill(m.init, 9)
        os.kill(m.shim, 9)
    spread = time.monotonic() - killed
    order = sorted(range(len(members)), key=lambda i: delays[i])
    waiting = set(order)
    cpu: dict[str, float] = {}
    released = 0
    while waiting or released < len(members) or not cpu:
        now = time.monotonic() - killed
        while released < len(members) and delays[order[released]] <= now:
            members[order[released]].release()
            released += 1
        for i in list(waiting):
            if proc_state(members[i].writer) in ("gone", "Z"):
                members[i].gone_s = round(now, 2)
                waiting.discard(i)
        if not cpu and now >= 5.0:
            busy, idle = cpu_busy()
            cpu = {"busy": round(busy - busy0, 2), "idle": round(idle - idle0, 2)}
        if now > 120:
            break
        time.sleep(0.1)
    return killed, {"kill_spread_s": round(spread, 3), "cpu_5s": cpu}


def node_before_the_storm(handler: str) -> None:
    """A node's earlier life: one pod run and removed through ``handler``, as kubelet does.

    A node that has run pods before its storm has deleted containers through runc-guard's
    full path before, and measured what that path costs here (shim.startup.slots reads it);
    a storm on a freshly booted node with no delete behind it would be no node's storm.
    The same for both handlers, so each storm starts from the same point.
    """
    pod = Pod(handler, "container")
    try:
        cid = pod.create(["/bin/sh", "-c", "sleep 1000 & sleep 1000 & wait"], name="before")
        attempt(cri().stop_container, cid, 0)
        attempt(cri().remove_container, cid)
    finally:
        pod.remove()


def path_cost() -> int | None:
    """runc-guard's measured CPU per full-path delete on this node (overload.read_cost), if any."""
    try:
        with open("/run/runc-guard/startup/cost") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def storm(handler: str, pods: int, seed: int, settle: float) -> dict[str, Any]:
    """``pods`` pods through ``handler``, every container's init and every shim SIGKILLed at once.

    containerd 2.x's dead-shim cleanup then runs one shim delete per pod (its
    sandbox's: docs/vm.md, Path B) at once. Each pod's writer is held until its own
    delay (seeded, STORM_HOLDS) after the kills. Then kubelet's removal (RemoveContainer
    retried, StopPodSandbox, RemovePodSandbox), ``settle`` s with no sweep, and the count.
    """
    import random

    rng = random.Random(seed)
    delays = [round(rng.uniform(*STORM_HOLDS), 2) for _ in range(pods)]
    warmup = time.monotonic()
    node_before_the_storm(handler)
    warmup_s = time.monotonic() - warmup
    started = time.monotonic()
    members: list[StormPod] = []
    removed = False
    try:
        for _ in range(pods):
            members.append(StormPod(handler))
        setup_s = time.monotonic() - started
        wall = time.time()
        killed, kills = kill_and_release(members, delays)
        # containerd's dead-shim cleanup has run its course: every sandbox's bundle is gone, or
        # STORM_CLEANUP_WAIT s passed (containerd 2.1.9 keeps the bundle of a shim whose delete it killed).
        sandboxes = [m.pod.id for m in members]
        bundles = [os.path.join(TASKS, s) for s in sandboxes]
        wait_for(lambda: not any(os.path.exists(b) for b in bundles), STORM_CLEANUP_WAIT, 1.0)
        cleanup_s = time.monotonic() - killed
        ids = [m.cid for m in members]
        at_cleanup = storm_left(ids + sandboxes)
        removal = time.monotonic()
        rm = [kubelet_rm(c, STORM_RM_ATTEMPTS) for c in ids]
        for m in members:
            m.pod.remove()
        removed = True
        removal_s = time.monotonic() - removal
        listed_pods = {p["id"] for p in cri().list_pods()} & set(sandboxes)
        listed = {c["id"] for c in cri().list_containers()} & set(ids)
        time.sleep(settle)
        said = containerd_lines(wall, ids + sandboxes)
        return {
            "scenario": "storm", "handler": handler, "pods": pods, "seed": seed, "delays": delays,
            "warmup_s": round(warmup_s, 1), "path_cost_ms": path_cost(),
            "setup_s": round(setup_s, 1), **kills, "held_s": [m.gone_s for m in members],
            "cleanup_s": round(cleanup_s, 1), "removal_s": round(removal_s, 1), "settle_s": settle,
            "sandboxes": sandboxes, "ids": ids, "rm_attempts": rm,
            "cri_listed": {"pods": sorted(listed_pods), "containers": sorted(listed)},
            "at_cleanup": at_cleanup, "left": storm_left(ids + sandboxes),
            "cleanup_failed": [s for s in sandboxes if cleanup_failed(said[s])],
            "containerd": {c: lines[-3:] for c, lines in said.items() if lines},
            "journal": {c: e for c, e in journal_by_id(wall).items() if c in set(ids + sandboxes)},
        }  # fmt: skip
    finally:
        for m in [] if removed else members:
            m.remove()


# -- the node tools on the unified tree -------------------------------------------


def node_tools(ids: list[str]) -> dict[str, object]:
    """``runc-guardctl audit``, ``sweep`` and ``metrics`` after the cells, and what is left then."""
    audit = sh("runc-guardctl", "audit", check=False, timeout=300)
    sweep = sh("runc-guardctl", "sweep", "--min-age", "0", check=False, timeout=300)
    after = sh("runc-guardctl", "audit", check=False, timeout=300)
    metrics = sh("runc-guardctl", "metrics", check=False, timeout=300)  # as audit: TCG beside a busy host
    wanted = ("runc_guard_deletes_total", "runc_guard_leaked", "runc_guard_pending", "runc_guard_orphan")
    return {
        "audit_rc": audit.returncode, "audit": audit.stdout.strip().splitlines()[:12],
        "sweep_rc": sweep.returncode, "sweep": sweep.stdout.strip().splitlines()[-12:],
        "audit_after_rc": after.returncode, "audit_after": after.stdout.strip().splitlines()[:6],
        "metrics_rc": metrics.returncode,
        "metrics": [line for line in metrics.stdout.splitlines()
                    if line.startswith(wanted) and not line.endswith(" 0.0")],
        "left": {c: left(c) for c in ids},
        "scope_units": scope_units(),
    }  # fmt: skip


def each(fn, *args: object, parallel: bool = True) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """``fn(handler, *args)`` for every handler named in argv, in parallel threads or one after another.

    Under TCG with one vCPU, two dead-shim cleanups at once already spend most of
    containerd's 5 s budget starting Go and Python: the teardown cells run one
    handler at a time so the budget measures the runtime, not the emulator's queue.
    """
    results: dict[str, object] = {}

    def one(handler: str) -> None:
        try:
            results[handler] = fn(handler, *args)
        except Exception as exc:  # noqa: BLE001 -- reported to the host, which fails the test with it
            results[handler] = {"error": repr(exc)}

    if not parallel:
        for handler in HANDLERS:
            one(handler)
        return results
    threads = [threading.Thread(target=one, args=(h,)) for h in HANDLERS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


HANDLERS: list[str] = []


def main() -> None:
    name, handlers, *rest = sys.argv[1:]
    HANDLERS.extend(handlers.split(","))
    if name == "teardown":  # teardown HANDLERS a|b PIDMODE
        print(json.dumps(each(teardown, rest[0], rest[1], parallel=False)))
    elif name == "crash-loop":  # crash-loop HANDLERS RESTARTS SECONDS PIDMODE [MIB: the emptyDir variant]
        mib = int(rest[3]) if len(rest) > 3 else 0
        print(json.dumps(each(crash_loop, int(rest[0]), float(rest[1]), rest[2], mib)))
    elif name == "storm":  # storm HANDLERS PODS SEED SETTLE: one handler's storm after the other's
        print(json.dumps(each(storm, int(rest[0]), int(rest[1]), float(rest[2]), parallel=False)))
    elif name == "node-tools":  # node-tools - ID...
        print(json.dumps(node_tools(rest)))
    elif name == "journal":  # journal - ID...: runc-guard's journal entries per container
        print(json.dumps({c: deletes(c) for c in rest}))
    else:
        raise SystemExit(f"unknown scenario {name}")


if __name__ == "__main__":
    main()
