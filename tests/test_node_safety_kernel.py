"""Issue 21, item 7 and friends, on the real kernel with real runc: the node tools do no harm.

- Someone else's container: a plain ``runc run -d`` container whose process
  exited, its state in runc's default root ``/run/runc``. The sweep over the
  default roots (in a private mount namespace whose ``/run`` is a tmpfs, so no
  real state on this machine is ever in reach) leaves it alone; named with
  ``--orphan-root`` it is re-driven (what the default did before), unless it
  carries another manager's annotations.
- A private PID namespace (``unshare --pid --fork [--mount-proc]``) next to a
  running container in a containerd-style root: sweep and audit refuse; the
  container's state and process survive.
- A /proc read that fails (EMFILE, injected with strace) is not a dead init.
- doctor on a "kernel without pidfd_open" (ENOSYS injected) says what degrades.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit.kernel import RUNC, cgroup_mount_points, dirs_named, make_bundle, procs, remove_tree, wait_for

pytestmark = pytest.mark.kernel

CTL = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
STRACE = shutil.which("strace")
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"

#: A private mount namespace whose /run is an empty tmpfs, with the test's own directories
#: bound where runc and containerd keep state by default.
ISOLATE = (
    "set -e; mount --make-rprivate /; mount -t tmpfs rg21 /run; "
    "mkdir -p /run/runc /run/crun /run/containerd; "
    'mount --bind "$RG_FLAT" /run/runc; mount --bind "$RG_CONTAINERD" /run/containerd; exec "$@"'
)


def need_strace() -> str:
    if STRACE is None:
        if os.environ.get("CI") == "true":
            pytest.fail("strace is missing (make deps installs it)")
        pytest.skip("needs strace (make deps installs it)")
    return STRACE


def new_id() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


@dataclass
class Container:
    """A detached runc container below a unique cgroup parent; destroy() removes it whatever happened."""

    root: str
    container_id: str
    parent: str
    relative: str

    def state_dir(self) -> str:
        return os.path.join(self.root, self.container_id)

    def init_pid(self) -> int:
        with open(os.path.join(self.state_dir(), "state.json")) as f:
            return int(json.load(f)["init_process_pid"])

    def status(self) -> str:
        out = subprocess.run(
            [RUNC, "--root", self.root, "state", self.container_id],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        return str(json.loads(out.stdout)["status"]) if out.returncode == 0 else "gone"

    def dirs(self) -> list[str]:
        return dirs_named(self.relative)

    def destroy(self) -> None:
        for directory in self.dirs():
            for pid in procs(directory):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        wait_for(lambda: not any(procs(d) for d in self.dirs()), 10)
        subprocess.run(
            [RUNC, "--root", self.root, "delete", "--force", self.container_id],
            capture_output=True, check=False, timeout=30,
        )  # fmt: skip
        for mount in cgroup_mount_points():
            remove_tree(os.path.join(mount, self.parent))


def start(tmp_path: Path, root: str, script: str, annotations: dict[str, str] | None = None) -> Container:
    """``runc --root <root> run -d`` a busybox container in its own PID namespace, below a unique parent."""
    cid = new_id()
    parent = f"rg21-{uuid.uuid4().hex[:12]}"
    relative = f"/{parent}/{cid}"
    container = Container(root, cid, parent, relative)
    bundle = make_bundle(str(tmp_path / f"bundle-{cid[:8]}"), relative, script, host_pid=False)
    if annotations:
        with open(os.path.join(bundle, "config.json")) as f:
            config = json.load(f)
        config["annotations"] = annotations
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(config, f)
    try:
        subprocess.run(
            [RUNC, "--root", root, "run", "-d", cid], cwd=bundle,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            check=True, timeout=30,
        )  # fmt: skip
    except BaseException:
        container.destroy()
        raise
    return container


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    made: list[Container] = []
    yield made
    for container in made:
        container.destroy()


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        RUNC_GUARD_CONFIG=str(tmp_path / "absent.toml"),
        RUNC_GUARD_PENDING_DIR=str(tmp_path / "guard" / "pending"),
        RUNC_GUARD_STATS_FILE=str(tmp_path / "guard" / "deletes.jsonl"),
        RUNC_GUARD_CACHE_DIR=str(tmp_path / "guard" / "cache"),
        RUNC_GUARD_RUNTIME=RUNC,
        **extra,
    )


def isolated(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ISOLATE's mount namespace: tmp/flat is /run/runc, tmp/containerd /run/containerd."""
    environ = env(tmp_path, RG_FLAT=str(tmp_path / "flat"), RG_CONTAINERD=str(tmp_path / "containerd"))
    return subprocess.run(
        [UNSHARE, "-m", "sh", "-c", ISOLATE, "sh", *argv],
        capture_output=True, text=True, env=environ, timeout=120, check=False,
    )  # fmt: skip


def kubepods(container: Container) -> list[str]:
    """Look only at a pod tree that does not exist: no real pod's cgroups are in reach."""
    return ["--kubepods", f"{container.parent}/kubepods"]


# -- someone else's container in runc's default root ------------------------------------------


def test_default_sweep_leaves_a_plain_runc_container_in_run_runc_alone(
    tmp_path: Path, containers: list[Container]
) -> None:
    """Stock (285c279): one default sweep re-ran runc delete --force and the state was gone.
    Now the default sweep and audit do not judge /run/runc; named explicitly, it is re-driven."""
    (tmp_path / "containerd" / "runc").mkdir(parents=True)
    flat = tmp_path / "flat"
    flat.mkdir()
    plain = start(tmp_path, str(flat), "exit 0")
    containers.append(plain)
    assert wait_for(lambda: plain.status() == "stopped", 10)
    dirs = len(plain.dirs())
    assert dirs > 0

    sweep = isolated(tmp_path, CTL, "sweep", "--min-age", "0", "--format", "json", *kubepods(plain))
    assert sweep.returncode == 0, sweep.stderr
    report = json.loads(sweep.stdout)
    assert report["redriven"] == [] and report["errors"] == []
    assert plain.status() == "stopped" and len(plain.dirs()) == dirs
    audit = isolated(tmp_path, CTL, "audit", "--min-age", "0", "--format", "json", *kubepods(plain))
    assert json.loads(audit.stdout)["orphaned_states"] == [], audit.stdout

    # What the old default did, now only when the root is named.
    named = isolated(
        tmp_path, CTL, "sweep", "--min-age", "0", "--format", "json", "--orphan-root", "/run/runc",
        *kubepods(plain),
    )  # fmt: skip
    assert named.returncode == 0, named.stderr
    (rerun,) = json.loads(named.stdout)["redriven"]
    assert rerun["argv"] == [RUNC, "--root", "/run/runc", "delete", "--force", plain.container_id]
    assert (rerun["exit_code"], rerun["state_left"]) == (0, False)
    assert plain.status() == "gone" and plain.dirs() == []
    print(
        f"\nplain runc run -d, exited, state in /run/runc ({dirs} dirs): default sweep: untouched "
        f"(status stopped, {dirs} dirs); --orphan-root /run/runc: re-driven, exit 0, 0 dirs, state gone"
    )


def test_a_named_root_never_touches_podmans_container(tmp_path: Path, containers: list[Container]) -> None:
    """Named with --orphan-root, a state with podman's annotations is left alone and listed by the audit."""
    (tmp_path / "containerd" / "runc").mkdir(parents=True)
    flat = tmp_path / "flat"
    flat.mkdir()
    podman = start(tmp_path, str(flat), "exit 0", {"io.container.manager": "libpod"})
    containers.append(podman)
    assert wait_for(lambda: podman.status() == "stopped", 10)
    dirs = len(podman.dirs())
    args = ["--min-age", "0", "--format", "json", "--orphan-root", "/run/runc", *kubepods(podman)]
    sweep = isolated(tmp_path, CTL, "sweep", *args)
    assert sweep.returncode == 0, sweep.stderr
    assert json.loads(sweep.stdout)["redriven"] == []
    assert podman.status() == "stopped" and len(podman.dirs()) == dirs
    audit = isolated(tmp_path, CTL, "audit", *args)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    left = json.loads(audit.stdout)["states_left_alone"]
    assert [(e["container_id"], e["verdict"], e["owner"]) for e in left] == [
        (podman.container_id, "foreign", "foreign:podman")
    ]


# -- a private PID namespace -------------------------------------------------------------------


@pytest.mark.parametrize("mount_proc", [True, False], ids=["mount-proc", "host-proc"])
def test_sweep_and_audit_refuse_in_a_private_pid_namespace(
    tmp_path: Path, containers: list[Container], journald: tuple[str, socket.socket], mount_proc: bool
) -> None:
    """Stock (285c279): the sweep re-ran runc delete --force for the running container; its state was
    gone, its process ran on. Now: exit 77 (sweep) / 2 (audit), one stderr line, a journal entry;
    the container is untouched. The same sweep from the host's namespace keeps it (alive)."""
    root = tmp_path / "runc" / "k8s.io"
    running = start(tmp_path, str(root), "sleep 1000")
    containers.append(running)
    assert wait_for(lambda: running.status() == "running", 10)
    init = running.init_pid()
    where = [
        "--runtime-root", str(tmp_path / "runc"), "--bundle-root", str(tmp_path / "bundles"),
        "--state-root", str(tmp_path / "flat"), "--min-age", "0", "--format", "json", *kubepods(running),
    ]  # fmt: skip
    socket_path, sock = journald
    unshare = [UNSHARE, "--pid", "--fork", *(["--mount-proc"] if mount_proc else [])]
    environ = env(tmp_path, RUNC_GUARD_JOURNAL_SOCKET=socket_path)
    sweep = subprocess.run([*unshare, CTL, "sweep", *where], capture_output=True, text=True,
                           env=environ, timeout=120, check=False)  # fmt: skip
    assert sweep.returncode == 77, (sweep.stdout, sweep.stderr)
    assert sweep.stdout == ""
    assert "sweep refused: cannot judge container processes from this PID namespace" in sweep.stderr
    assert "EVENT=sweep_refused" in sock.recv(65536).decode()
    audit = subprocess.run([*unshare, CTL, "audit", *where], capture_output=True, text=True,
                           env=environ, timeout=120, check=False)  # fmt: skip
    assert audit.returncode == 2, (audit.stdout, audit.stderr)
    assert audit.stdout.startswith("UNKNOWN: audit refused") and "audit refused" in audit.stderr
    assert running.status() == "running" and running.init_pid() == init
    assert os.path.exists(f"/proc/{init}")

    control = subprocess.run([CTL, "sweep", *where], capture_output=True, text=True, env=environ,
                             timeout=120, check=False)  # fmt: skip
    assert control.returncode == 0, control.stderr
    assert json.loads(control.stdout)["redriven"] == [] and running.status() == "running"
    print(f"\nunshare --pid --fork{' --mount-proc' if mount_proc else ''}: sweep exit 77, audit exit 2, "
          "container running, state kept; the host namespace's sweep re-drives nothing either")


# -- a /proc read that fails is not a dead init ------------------------------------------------------


def test_a_failing_proc_read_keeps_a_running_container(tmp_path: Path, containers: list[Container]) -> None:
    """EMFILE on /proc/<init>/stat (strace fault injection): before issue 21 procinfo read that as
    "dead" and the sweep re-drove the running container; now both the delete's reading and the sweep's
    say unknown, and the sweep judges init_unknown and leaves the container alone."""
    strace = need_strace()
    root = tmp_path / "runc" / "k8s.io"
    running = start(tmp_path, str(root), "sleep 1000")
    containers.append(running)
    assert wait_for(lambda: running.status() == "running", 10)
    init = running.init_pid()
    fault = [strace, "-f", "-qq", "-o", "/dev/null", "-e", "trace=openat,open",
             "-e", "inject=openat,open:error=EMFILE", "-P", f"/proc/{init}/stat"]  # fmt: skip
    probe = (
        "import sys; from runc_guard import procinfo; "
        "from runc_guard.node.liveness import init_liveness; p = int(sys.argv[1]); s = int(sys.argv[2]); "
        "print(procinfo.init_liveness(p, s), init_liveness(p, s))"
    )
    with open(f"/proc/{init}/stat", "rb") as f:
        start_ticks = f.read().rsplit(b")", 1)[1].split()[19].decode()
    judged = subprocess.run([*fault, sys.executable, "-c", probe, str(init), start_ticks],
                            capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert judged.stdout.split() == ["unknown", "unknown"], judged.stdout + judged.stderr
    where = [
        "--runtime-root", str(tmp_path / "runc"), "--bundle-root", str(tmp_path / "bundles"),
        "--state-root", str(tmp_path / "flat"), "--min-age", "0", "--format", "json", *kubepods(running),
    ]  # fmt: skip
    audit = subprocess.run([*fault, CTL, "audit", *where], capture_output=True, text=True,
                           env=env(tmp_path), timeout=120, check=False)  # fmt: skip
    report = json.loads(audit.stdout)
    assert report["state_verdicts"] == {"init_unknown": 1}, report
    sweep = subprocess.run([*fault, CTL, "sweep", *where], capture_output=True, text=True,
                           env=env(tmp_path), timeout=120, check=False)  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    assert json.loads(sweep.stdout)["redriven"] == []
    assert running.status() == "running"


# -- doctor on a kernel without pidfd_open ---------------------------------------------------------------


def test_doctor_names_a_missing_pidfd_open(tmp_path: Path) -> None:
    """ENOSYS for pidfd_open (a kernel before 5.3): doctor lists it with what degrades; exit unchanged."""
    no_pidfd = [need_strace(), "-f", "-qq", "-o", "/dev/null",
                "-e", "trace=pidfd_open", "-e", "inject=pidfd_open:error=ENOSYS"]  # fmt: skip
    plain = subprocess.run([CTL, "doctor", "--format", "json"], capture_output=True, text=True,
                           env=env(tmp_path), timeout=60, check=False)  # fmt: skip
    faulted = subprocess.run(
        [*no_pidfd, CTL, "doctor", "--format", "json"],
        capture_output=True, text=True, env=env(tmp_path), timeout=60, check=False,
    )  # fmt: skip
    assert faulted.returncode == plain.returncode, faulted.stderr
    before = {f["name"]: f["present"] for f in json.loads(plain.stdout)["kernel"]}
    report = json.loads(faulted.stdout)
    after = {f["name"]: f["present"] for f in report["kernel"]}
    assert before["pidfd_open"] is True and after["pidfd_open"] is False
    assert after["pidfd_send_signal"] is True  # probed through a /proc/<pid> fd, not a pidfd
    assert [w for w in report["warnings"] if w.startswith("kernel: pidfd_open missing") and "by pid" in w]
    text = subprocess.run(
        [*no_pidfd, CTL, "doctor"],
        capture_output=True, text=True, env=env(tmp_path), timeout=60, check=False,
    )  # fmt: skip
    assert "pidfd_open         MISSING" in text.stdout


# -- a process named containerd is no proof of the runtime's PID namespace ---------------------------

_BESIDE_A_CONTAINERD = """
import os, sys, time
from runc_guard.node.pidns import pid_namespace_view
binary, chroot = sys.argv[1], sys.argv[2] == "chroot"
pid = os.fork()
if pid == 0:
    if chroot:
        os.chroot(os.path.dirname(binary))
        os.chdir("/")
    os.execv("/containerd" if chroot else binary, ["sleep", "1000"])  # comm: containerd
try:
    deadline = time.monotonic() + 10
    while open(f"/proc/{pid}/comm").read().strip() != "containerd" and time.monotonic() < deadline:
        time.sleep(0.01)
    print(pid_namespace_view().verdict)
finally:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
"""


@pytest.mark.parametrize(("chroot", "verdict"), [(True, "foreign"), (False, "host")],
                         ids=["own-root-no-proof", "shared-root-proof"])  # fmt: skip
def test_a_containerd_of_another_root_proves_nothing(tmp_path: Path, chroot: bool, verdict: str) -> None:
    """A private PID namespace whose only ``containerd`` runs in another root (a pod's own
    Docker-in-Docker beside a mounted node /run): before, its name alone made the namespace
    trusted; now foreign. The same process in our own root is still the proof (kind, nspawn)."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox-static (make deps installs it)")
    root = tmp_path / "other-root"
    root.mkdir()
    shutil.copy(busybox, root / "containerd")
    done = subprocess.run(
        [UNSHARE, "--pid", "--fork", "--mount-proc", sys.executable, "-c", _BESIDE_A_CONTAINERD,
         str(root / "containerd"), "chroot" if chroot else "same"],
        capture_output=True, text=True, timeout=60, check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == verdict
