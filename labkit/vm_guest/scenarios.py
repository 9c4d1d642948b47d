"""Inside the VM: CRI scenarios through crictl, the way kubelet drives containerd.

Run by the host through the agent (``python3 scenarios.py NAME ARGS``); prints
one JSON line. Standard library only (the guest's python3). Pods use the systemd
cgroup driver (every container is ``cri-containerd-<id>.scope`` in the pod's
``kubepods-burstable-pod<uid>.slice``) and host networking (no CNI here).

A slow teardown on pure cgroup v2: the v2 freezer lets SIGKILL through, so the
lab holds a container's process the way a real node does, in uninterruptible
I/O. The pod's slice gets ``IOWriteBandwidthMax`` (systemd writes the pod's
``io.max``) and a child of the container writes ``SLOW_BYTES`` to a hostPath
volume and fsyncs (``dd conv=fsync``): cgroup v2 writeback charges those pages
to the container, the block layer throttles them, and the task sleeps in D
state (``folio_wait_bit_common``) until they are written, so a SIGKILL takes
effect only then, a time set by bytes / rate, not by scheduling luck.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

CRICTL = "/opt/rg/runtimes/crictl"
BUSYBOX_IMAGE = "docker.io/runc-guard-test/busybox:1"
CGROUP = "/sys/fs/cgroup"
RUNC_ROOT = "/run/containerd/runc/k8s.io"
TASKS = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"
PENDING = "/run/runc-guard/pending"
WORK = "/var/lib/rgvm"
#: The pod's write limit and what the slow child writes in one O_DIRECT call.
RATE = 64 * 1024
SLOW_BYTES = 640 * 1024
NODE = 2
CONTAINER = 1


def sh(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


def crictl(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return sh(CRICTL, *args, check=check, timeout=timeout)


def write_json(name: str, body: dict[str, object]) -> str:
    os.makedirs(WORK, exist_ok=True)
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        json.dump(body, f)
    return path


class Pod:
    def __init__(self, handler: str) -> None:
        self.handler = handler
        self.uid = str(uuid.uuid4())
        self.name = f"rgvm-{self.uid[:8]}"
        self.slice = f"kubepods-burstable-pod{self.uid.replace('-', '_')}.slice"
        logs = os.path.join(WORK, "logs", self.name)
        os.makedirs(logs, exist_ok=True)
        self.config = write_json(f"{self.name}-pod.json", {
            "metadata": {"name": self.name, "namespace": "rgvm", "uid": self.uid, "attempt": 0},
            "log_directory": logs,
            "linux": {"cgroup_parent": self.slice,
                      "security_context": {"namespace_options": {"network": NODE, "pid": CONTAINER}}},
        })
        self.id = crictl("runp", "--runtime", handler, self.config).stdout.strip()

    def create(self, command: list[str], attempt: int = 0, memory: int = 0, data: bool = False) -> str:
        name = f"work-{uuid.uuid4().hex[:8]}"
        resources = {"memory_limit_in_bytes": memory} if memory else {}
        mounts = []
        if data:  # a hostPath volume on the node's ext4 (writes bypass the overlay)
            host = os.path.join(WORK, "data", name)
            os.makedirs(host)
            mounts.append({"container_path": "/data", "host_path": host})
        config = write_json(f"{name}.json", {
            "metadata": {"name": "work", "attempt": attempt},
            "image": {"image": BUSYBOX_IMAGE},
            "command": command,
            "log_path": f"{name}.log",
            "mounts": mounts,
            "linux": {"resources": resources,
                      "security_context": {"namespace_options": {"network": NODE, "pid": CONTAINER}}},
        })
        cid = crictl("create", self.id, config, self.config).stdout.strip()
        crictl("start", cid)
        return cid

    def remove(self) -> None:
        crictl("stopp", self.id, check=False)
        crictl("rmp", "-f", self.id, check=False)
        sh("systemctl", "reset-failed", self.slice, check=False)


# -- what a container left ---------------------------------------------------------


def scope(cid: str) -> str:
    return f"cri-containerd-{cid}.scope"


def scope_dirs(cid: str) -> list[str]:
    """Every cgroup directory of the container's scope, in every hierarchy."""
    found = []
    for dirpath, dirs, _files in os.walk(CGROUP):
        for d in dirs:
            if d == scope(cid):
                found.append(os.path.join(dirpath, d))
    return sorted(found)


def unit(cid: str) -> str:
    out = sh("systemctl", "show", scope(cid), "-p", "LoadState,ActiveState,Result", check=False).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if props.get("LoadState") != "loaded":
        return "gone"
    return f"{props.get('ActiveState')}/{props.get('Result')}"


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
        keys = ("OUTCOME", "EXIT_STATUS", "FORCE", "MESSAGE")
        found.append({k.lower(): entry[k] for k in keys if k in entry})
    return found


def left(cid: str) -> dict[str, object]:
    return {
        "dirs": len(scope_dirs(cid)),
        "unit": unit(cid),
        "state": os.path.exists(os.path.join(RUNC_ROOT, cid, "state.json")),
        "bundle": os.path.exists(os.path.join(TASKS, cid)),
        "records": len(records(cid)),
    }


def pids_of(cid: str) -> list[int]:
    for d in scope_dirs(cid):
        if d.startswith(CGROUP + "/kubepods") or d.startswith(CGROUP + "/unified/") or "/memory/" in d:
            try:
                with open(os.path.join(d, "cgroup.procs")) as f:
                    return [int(p) for p in f.read().split()]
            except OSError:
                continue
    return []


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line.split()[1] for line in f if line.startswith("State:")), "?")
    except OSError:
        return "gone"


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def wait_for(fn, timeout: float, interval: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(interval)
    return bool(fn())


# -- a teardown held by throttled I/O ----------------------------------------------


def teardown(handler: str, path: str) -> dict[str, object]:
    """Path A (``crictl stop``) or B (init and shim SIGKILLed) while a child sleeps in throttled I/O."""
    result: dict[str, object] = {"scenario": f"path-{path}", "handler": handler}
    pod = Pod(handler)
    try:
        device = "/dev/vda"
        sh("systemctl", "set-property", "--runtime", pod.slice, f"IOWriteBandwidthMax={device} {RATE}")
        script = (
            "sleep 1000 & sleep 1000 & "
            f"busybox dd if=/dev/zero of=/data/slow bs={SLOW_BYTES} count=1 conv=fsync 2>/data/dd.err & wait"
        )
        cid = pod.create(["/bin/sh", "-c", script], data=True)
        result["container_id"] = cid
        slow = 0

        def in_d() -> bool:
            nonlocal slow
            for pid in pids_of(cid):
                if comm(pid) == "dd" and proc_state(pid) == "D":
                    slow = pid
                    return True
            return False

        if not wait_for(in_d, 60, 0.05):
            seen = [(p, comm(p), proc_state(p)) for p in pids_of(cid)]
            raise RuntimeError(f"dd never slept in D state: {seen}")
        info = json.loads(crictl("inspect", cid).stdout)
        init = int(info["info"]["pid"])
        killed = time.monotonic()
        if path == "a":
            stop = crictl("stop", "-t", "0", cid, check=False, timeout=180)
            result["stop_s"] = round(time.monotonic() - killed, 2)
            result["stop_rc"] = stop.returncode
        else:
            with open(f"/proc/{init}/stat") as f:
                shim = int(f.read().rsplit(")", 1)[1].split()[1])
            os.kill(init, 9)
            os.kill(shim, 9)
        wait_for(lambda: proc_state(slow) in ("gone", "Z"), 120, 0.05)
        result["linger_s"] = round(time.monotonic() - killed, 2)
        # containerd's dead-shim cleanup or the CRI's exit handling has run its course.
        wait_for(lambda: not os.path.exists(os.path.join(TASKS, cid)), 15, 0.2)
        time.sleep(2)
        result["left"] = left(cid)
        result["deletes"] = deletes(cid)
        if path == "a":
            rm = crictl("rm", cid, check=False)
            result["rm_rc"] = rm.returncode
            result["after_rm"] = left(cid)
    finally:
        pod.remove()
    return result


# -- a real memcg OOM, restarted like kubelet's CrashLoopBackOff --------------------


def crash_loop(handler: str, seconds: float, backoff: float = 1.0) -> dict[str, object]:
    """A container that outgrows its 64 MiB ``memory.max`` (8 children, then a 200 MB string), restarted.

    kubelet's CrashLoopBackOff at its 1 s floor: wait for the exit, ``backoff`` s,
    create and start the next attempt, remove the previous dead container.
    """
    command = [
        "/bin/sh", "-c",
        "i=0; while [ $i -lt 8 ]; do sleep 1000 & i=$((i+1)); done; "
        "x=$(busybox head -c 200000000 /dev/zero | busybox tr '\\0' a); echo survived",
    ]  # fmt: skip
    pod = Pod(handler)
    ids: list[str] = []
    reasons: dict[str, int] = {}
    started = time.monotonic()
    try:
        previous = ""
        while time.monotonic() - started < seconds:
            cid = pod.create(command, attempt=len(ids), memory=64 << 20)
            ids.append(cid)
            status: dict[str, object] = {}

            def exited(cid: str = cid) -> bool:
                nonlocal status
                out = crictl("inspect", cid, check=False)
                if out.returncode != 0:
                    return False
                status = json.loads(out.stdout)["status"]
                return status.get("state") == "CONTAINER_EXITED"

            wait_for(exited, 120, 0.2)
            reason = f"{status.get('reason')}/{status.get('exitCode')}"
            reasons[reason] = reasons.get(reason, 0) + 1
            if previous:
                crictl("rm", previous, check=False)
            previous = cid
            time.sleep(backoff)
        if previous:
            crictl("rm", previous, check=False)
        loop_s = time.monotonic() - started
        time.sleep(2)
        per = [left(c) for c in ids]
        outcomes: dict[str, int] = {}
        journal = 0
        for c in ids:
            entries = deletes(c)
            journal += len(entries)
            for e in entries:
                key = f"{e.get('outcome')}/{e.get('exit_status')}"
                outcomes[key] = outcomes.get(key, 0) + 1
        units: dict[str, int] = {}
        for p in per:
            units[str(p["unit"])] = units.get(str(p["unit"]), 0) + 1
        return {
            "scenario": "oom-crash-loop", "handler": handler, "restarts": len(ids),
            "loop_s": round(loop_s, 1), "per_restart_s": round(loop_s / max(len(ids), 1), 2),
            "exits": reasons, "dirs": sum(int(p["dirs"]) for p in per),  # type: ignore[call-overload]
            "units": units, "states": sum(bool(p["state"]) for p in per),
            "records": sum(int(p["records"]) for p in per),  # type: ignore[call-overload]
            "journal_deletes": journal, "outcomes": outcomes,
        }
    finally:
        pod.remove()


def both(fn, *args: object) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """``fn(handler, *args)`` for every handler named in argv, in parallel threads."""
    results: dict[str, object] = {}

    def one(handler: str) -> None:
        try:
            results[handler] = fn(handler, *args)
        except Exception as exc:  # noqa: BLE001 -- reported to the host, which fails the test with it
            results[handler] = {"error": repr(exc)}

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
    if name == "teardown":
        print(json.dumps(both(teardown, rest[0])))
    elif name == "crash-loop":
        print(json.dumps(both(crash_loop, float(rest[0]))))
    else:
        raise SystemExit(f"unknown scenario {name}")


if __name__ == "__main__":
    main()
