"""A booted systemd for the systemd cgroup driver: a debootstrapped bookworm under systemd-nspawn.

PID 1 of this host is not systemd, and systemd must never be booted on the
host's own root (docs/background.md, the labs). So the lab builds a minimal Debian 12 root once
(``debootstrap --variant=minbase`` plus systemd, dbus, runc, containerd,
busybox-static, python3 and runc-guard's Debian dependencies), cached under
``/var/tmp`` by a key of its package list, and boots it with systemd-nspawn:

- ``--register=no --keep-unit``: no machined/systemd on the host to ask for a
  scope, so nspawn stays in the cgroups it was started in; the lab creates
  those first, one per hierarchy (cpuset.cpus/mems copied, the kernel refuses a
  task in a cpuset without them);
- ``--system-call-filter=@keyring``: runc joins a session keyring;
- ``--private-network``: runc sets ``lo`` up in every container's network
  namespace, which needs CAP_NET_ADMIN; nspawn drops it from the machine's
  bounding set unless the machine has its own network (``ctr run`` failed with
  ``error during container init: operation not permitted`` without it);
- ``--volatile=overlay``: a tmpfs over the cached root, every boot starts fresh;
- a unit inside (``labkit/units/rg-cgroup-rw.service``) remounts the v1
  controller mounts read-write (nspawn mounts them read-only; runc's systemd
  driver still creates the v1 directories itself);
- ``DefaultTimeoutStopSec=5s`` (so a stuck scope turns ``failed`` quickly);
- the host's hybrid layout (v1 controllers + cgroup2 at ``unified``).

containerd runs inside as Debian's own ``containerd.service`` with
``SystemdCgroup = true`` (the CRI runtime option; ``ctr`` passes the same
choice per task with ``--runc-systemd-cgroup``); journald runs inside too.
runc-guard runs from the checkout, bound read-only at ``/opt/runc-guard``,
under the machine's own python3. The runtimes fetched from Debian's archive
(``labkit.runtimes``: sid's runc 1.3 and containerd 2.1) are bound in read-only
at the same path they have on the host (their relinked programs name their own
loader by that path): ``booted_machine(..., containerd=CONTAINERD_21)`` runs that
containerd instead of Debian 12's 1.6.20 (:func:`machine_containerd`: the same unit, a ``version = 3``
config, a drop-in that puts its directory first on PATH so it starts its own
shim), the way a node upgraded in place runs it.

The machine is stopped with SIGRTMIN+4 to its PID 1 (systemd's "halt"), by pid,
then the host side is cleaned: the nspawn cgroups (and everything left below
them), the work dir.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from labkit import containerd as cl
from labkit import runtimes
from labkit.kernel import BUSYBOX, CGROUP_ROOT, FreezerHold, procs, shim_of, unique, wait_for

NSPAWN = shutil.which("systemd-nspawn") or "/usr/bin/systemd-nspawn"
DEBOOTSTRAP = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
SUITE = "bookworm"
MIRROR = os.environ.get("RUNC_GUARD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
#: Everything runc-guard needs to run from source, and nothing else (CI builds it every run).
PACKAGES = (
    "systemd",
    "dbus",
    "runc",
    "containerd",
    "busybox-static",
    "python3",
    "python3-psutil",
    "python3-tenacity",
    "python3-structlog",
    "python3-click",
    "python3-tomlkit",
    "python3-prometheus-client",
)
CACHE_ROOT = "/var/tmp/runc-guard-systemd-lab"
HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)
UNITS = os.path.join(HERE, "units")
#: Where things appear inside the machine.
GUARD_SRC = "/opt/runc-guard"
GUARD_BIN = "/opt/rg/bin"
#: The archive's runtimes, bound at the host's own path (labkit.runtimes.CACHE_ROOT).
RUNTIMES_DIR = runtimes.CACHE_ROOT
STOCK_RUNC = "/usr/sbin/runc"
GUARD = f"{GUARD_BIN}/runc-guard"
#: runc-guard under this name fronts sid's runc 1.3 (``[runtimes]`` in its settings file).
GUARD_13 = f"{GUARD_BIN}/runc-guard-13"
MACHINE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: containerd's dead-shim cleanup budget (io.containerd.timeout.shim.cleanup; 1.6 and 2.x alike).
SHIM_CLEANUP_BUDGET_S = 5.0
#: The lab's DefaultTimeoutStopSec: what a stuck scope gets before it is ``failed``.
STOP_TIMEOUT_S = 5.0


def missing() -> str | None:
    """Why this host cannot run the lab, or None: the only reasons to skip it."""
    if os.geteuid() != 0:
        return "the systemd lab needs root"
    for tool in (NSPAWN, DEBOOTSTRAP, NSENTER):
        if not os.access(tool, os.X_OK):
            return f"the systemd lab needs {tool} (apt packages systemd-container, debootstrap)"
    if not os.path.isdir(f"{CGROUP_ROOT}/freezer") or not os.path.isdir(f"{CGROUP_ROOT}/systemd"):
        return "the systemd lab needs the hybrid cgroup layout (v1 freezer and name=systemd)"
    return None


def versions_match() -> tuple[str, str]:
    """The host's systemd and systemd-container versions (nspawn is pinned to its systemd)."""

    def version(pkg: str) -> str:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", pkg], capture_output=True, text=True, check=False
        )
        return out.stdout.strip()

    return version("systemd"), version("systemd-container")


# -- the image ----------------------------------------------------------------


def image_key() -> str:
    """The cache key: suite and package list (a new list builds a new root)."""
    return hashlib.sha256(f"{SUITE}:minbase:{','.join(sorted(PACKAGES))}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Image:
    path: str
    #: Seconds debootstrap took in this process; None when the cached root was reused.
    build_s: float | None
    #: What the build that made this root took (recorded next to it).
    recorded_build_s: float


def ensure_image(cache_root: str = CACHE_ROOT) -> Image:
    """The cached root, built with debootstrap when absent (needs the Debian mirror once)."""
    target = os.path.join(cache_root, image_key())
    stamp = os.path.join(target, ".rg-built.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            return Image(target + "/root", None, float(json.load(f)["build_s"]))
    os.makedirs(cache_root, exist_ok=True)
    partial = f"{target}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    started = time.monotonic()
    with open(os.path.join(partial, "debootstrap.log"), "wb") as log:
        result = subprocess.run(
            [
                DEBOOTSTRAP,
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                os.path.join(partial, "root"),
                MIRROR,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
            timeout=1200,
        )
    build_s = time.monotonic() - started
    if result.returncode != 0:
        with open(os.path.join(partial, "debootstrap.log"), errors="replace") as f:
            tail = f.read()[-3000:]
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"debootstrap failed ({result.returncode}):\n{tail}")
    # apt's package cache is 100+ MB of .debs nobody reads again.
    shutil.rmtree(os.path.join(partial, "root/var/cache/apt/archives"), ignore_errors=True)
    with open(os.path.join(partial, ".rg-built.json"), "w") as f:
        json.dump({"build_s": round(build_s, 1), "packages": list(PACKAGES), "suite": SUITE}, f)
    try:
        os.rename(partial, target)
    except OSError:  # another session built it first: theirs is as good
        shutil.rmtree(partial, ignore_errors=True)
    return Image(target + "/root", build_s, build_s)


# -- the host side: nspawn's own cgroups -------------------------------------------


def _hierarchies() -> list[str]:
    """Every cgroup mount under /sys/fs/cgroup (v1 controllers, name=systemd, unified)."""
    found = []
    for name in sorted(os.listdir(CGROUP_ROOT)):
        path = os.path.join(CGROUP_ROOT, name)
        if os.path.ismount(path):
            found.append(path)
    return found


def _kill_and_remove(top: str) -> None:
    """SIGKILL every process left below ``top``, then rmdir the subtree leaf-first."""
    if not os.path.isdir(top):
        return
    for dirpath, _dirs, _files in os.walk(top):
        for pid in procs(dirpath):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    freezer_top = top if top.startswith(f"{CGROUP_ROOT}/freezer/") else None
    if freezer_top:  # a frozen hold keeps SIGKILL pending: thaw everything below
        for dirpath, _dirs, _files in os.walk(freezer_top):
            with contextlib.suppress(OSError), open(os.path.join(dirpath, "freezer.state"), "w") as f:
                f.write("THAWED")
    for _ in range(50):
        walked = sorted(os.walk(top), key=lambda t: -t[0].count("/"))
        for dirpath, _dirs, _files in walked:
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        if not os.path.isdir(top):
            return
        time.sleep(0.1)


@dataclass
class HostCgroups:
    """One directory per hierarchy for nspawn and everything it starts; removable whatever happens."""

    name: str
    paths: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, name: str) -> HostCgroups:
        made = cls(name)
        try:
            for hierarchy in _hierarchies():
                path = os.path.join(hierarchy, name)
                os.mkdir(path)
                made.paths.append(path)
                if os.path.basename(hierarchy) == "cpuset":
                    # A new cpuset is empty; the kernel refuses tasks until cpus/mems are set.
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        with open(os.path.join(hierarchy, knob)) as src:
                            value = src.read().strip()
                        with open(os.path.join(path, knob), "w") as dst:
                            dst.write(value)
        except BaseException:
            made.destroy()
            raise
        return made

    def procs_files(self) -> list[str]:
        return [os.path.join(p, "cgroup.procs") for p in self.paths]

    def destroy(self) -> None:
        for path in self.paths:
            _kill_and_remove(path)


# -- the machine ----------------------------------------------------------------------


PY_ENTRY = f"""#!/usr/bin/python3
# runc-guard's Python entry from the read-only checkout, under the machine's own python3
# (the compiled launcher beside it, rg-bin/runc-guard, hands it what it does not route).
import sys
sys.path.insert(0, {GUARD_SRC!r})
from runc_guard.shim.entry import main
sys.exit(main())
"""

CTL_LAUNCHER = f"""#!/usr/bin/python3
import sys
sys.path.insert(0, {GUARD_SRC!r})
from runc_guard.cli import main
sys.exit(main())
"""

#: containerd's config inside the machine: Debian's default path, so ``runc-guardctl doctor`` reads it.
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DEBIAN_CTR = "/usr/bin/ctr"


@dataclass(frozen=True)
class MachineContainerd:
    """The containerd the machine's ``containerd.service`` runs; paths as the machine sees them."""

    #: labkit.containerd's build name (CONTAINERD_16: Debian 12's own, CONTAINERD_21: sid's).
    build: str
    ctr: str
    #: The config's text (bound at CONTAINERD_CONFIG).
    config: str
    #: A drop-in for ``containerd.service`` that runs another binary; None: Debian's unit as it is.
    drop_in: str | None = None


def machine_containerd(name: str = cl.CONTAINERD_16) -> MachineContainerd:
    """containerd ``name`` for the machine, configured the kubeadm way (``SystemdCgroup = true``).

    Debian 12's 1.6.20 is in the root and runs as packaged. Another build (sid's 2.1) is
    a tree of labkit.runtimes, which the machine sees at the same path; Debian's
    unit runs it through a drop-in, as an in-place upgrade does (labkit/vm_guest/setup.py):
    its directory first on PATH (containerd looks its shim up there: else it would find
    Debian's 1.6 shim in /usr/bin) and ``ExecStart`` replaced, with a ``version = 3``
    config. Its own ``ctr`` talks to it.
    LookupError when the build is absent (a test asks ``labkit.containerd.require_build`` first).
    """
    if name == cl.CONTAINERD_16:
        return MachineContainerd(name, DEBIAN_CTR, _containerd_config(cl.DEBIAN_BUILD.config_version))
    build = cl.find_build(name)
    if build is None or build.bin_dir is None:
        raise LookupError(f"containerd build {name} could not be had from Debian's archive (labkit.runtimes)")
    for path in (build.containerd, build.ctr):
        if not path.startswith(RUNTIMES_DIR + "/"):
            raise LookupError(f"{path} is not below {RUNTIMES_DIR}, which the machine sees at the same path")
    drop_in = (
        "[Service]\n"
        f"Environment=PATH={build.bin_dir}:{MACHINE_PATH}\n"
        "ExecStart=\n"
        f"ExecStart={build.containerd} --config {CONTAINERD_CONFIG}\n"
    )
    return MachineContainerd(name, build.ctr, _containerd_config(build.config_version), drop_in)


def _containerd_config(version: int) -> str:
    """The whole config: containerd's defaults but for the CRI's runc handler (its layout per ``version``)."""
    header = "# The lab's containerd: the kubeadm-style systemd cgroup driver for CRI's runc.\n"
    return f"version = {version}\n{header}{cl.cri_runc_handler(version, systemd_cgroup=True)}"


def _write(path: str, text: str, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _prepare_binds(workdir: str, containerd: MachineContainerd) -> list[str]:
    """Files the machine sees through read-only binds; returns nspawn's --bind-ro flags."""
    control = os.path.join(workdir, "system.control")
    os.makedirs(os.path.join(control, "multi-user.target.wants"), exist_ok=True)
    os.makedirs(os.path.join(control, "containerd.service.d"), exist_ok=True)
    for unit in sorted(os.listdir(UNITS)):
        shutil.copy2(os.path.join(UNITS, unit), os.path.join(control, unit))
    shutil.move(
        os.path.join(control, "containerd-lab.conf"),
        os.path.join(control, "containerd.service.d", "lab.conf"),
    )
    os.symlink(
        "../rg-cgroup-rw.service", os.path.join(control, "multi-user.target.wants", "rg-cgroup-rw.service")
    )
    _write(
        os.path.join(workdir, "system.conf.d", "lab.conf"),
        f"[Manager]\nDefaultTimeoutStopSec={int(STOP_TIMEOUT_S)}s\n",
    )
    if containerd.drop_in is not None:
        _write(os.path.join(control, "containerd.service.d", "build.conf"), containerd.drop_in)
    _write(os.path.join(workdir, "containerd", "config.toml"), containerd.config)
    bindir = os.path.join(workdir, "rg-bin")
    _write(os.path.join(bindir, "runc-guard.py"), PY_ENTRY, 0o755)
    # The launcher, as every install path builds it (static: it runs in the machine's root).
    subprocess.run([os.path.join(CHECKOUT, "launcher", "build.sh"), os.path.join(bindir, "runc-guard")],
                   check=True, timeout=120)
    _write(os.path.join(bindir, "runc-guardctl"), CTL_LAUNCHER, 0o755)
    os.symlink("runc-guard", os.path.join(bindir, os.path.basename(GUARD_13)))
    runc_13 = runtimes.find(runtimes.RUNC_13)
    routes = f'[runtimes]\n"{os.path.basename(GUARD_13)}" = "{runc_13}"\n' if runc_13 else ""
    _write(os.path.join(workdir, "runc-guard", "config.toml"), routes)
    binds = [
        f"{CHECKOUT}:{GUARD_SRC}",
        f"{bindir}:{GUARD_BIN}",
        f"{control}:/etc/systemd/system.control",
        f"{workdir}/system.conf.d:/etc/systemd/system.conf.d",
        f"{workdir}/containerd/config.toml:{CONTAINERD_CONFIG}",
        f"{workdir}/runc-guard:/etc/runc-guard",
    ]
    if os.path.isdir(RUNTIMES_DIR):
        binds.append(f"{RUNTIMES_DIR}:{RUNTIMES_DIR}")
    return [f"--bind-ro={b}" for b in binds]


def _children(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            found.append(int(name))
    return found


def _leader(nspawn_pid: int) -> int | None:
    """The machine's PID 1 as the host sees it: nspawn's child running systemd."""
    for child in _children(nspawn_pid):
        try:
            with open(f"/proc/{child}/comm") as f:
                if f.read().strip() == "systemd":
                    return child
        except OSError:
            continue
    return None


@dataclass
class Machine:
    """A booted systemd-nspawn machine; use :func:`booted_machine` to get one."""

    name: str
    workdir: str
    cgroups: HostCgroups
    proc: subprocess.Popen[bytes]
    leader: int = 0
    boot_s: float = 0.0
    image: Image | None = None
    containerd: MachineContainerd = field(default_factory=machine_containerd)

    # -- looking inside ----------------------------------------------------------------

    def host_path(self, path: str) -> str:
        """``path`` inside the machine, as the host can read it."""
        return f"/proc/{self.leader}/root{path}"

    @property
    def cgroup_prefix(self) -> str:
        """What the machine's systemd calls its root cgroup, relative to each hierarchy's root."""
        return "/" + self.cgroups.name

    def run(
        self, *argv: str, timeout: float = 60, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside every namespace of the machine (nsenter by its PID 1)."""
        environ = {"PATH": MACHINE_PATH, "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
        environ.update(env or {})
        proc = subprocess.run(
            [NSENTER, "-t", str(self.leader), "-a", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            env=environ,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"in machine {self.name}: {' '.join(argv)} failed ({proc.returncode}):\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return proc

    def ctr(
        self, namespace: str, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """The machine's containerd's own ``ctr`` (2.1's for 2.1)."""
        return self.run(self.containerd.ctr, "-n", namespace, *args, check=check, timeout=timeout)

    def containerd_answers(self) -> bool:
        return self.run(self.containerd.ctr, "version", check=False).returncode == 0

    def containerd_version(self) -> str:
        """The server version ``ctr version`` reports: which containerd really runs."""
        out = self.run(self.containerd.ctr, "version", check=False).stdout
        server = out.split("Server:", 1)[-1]
        versions = [ln.split(":", 1)[1].strip() for ln in server.splitlines() if "Version:" in ln]
        return versions[0] if versions else "unknown"

    def systemctl(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", "--no-pager", *args, check=check)

    def unit_properties(self, unit: str, *names: str) -> dict[str, str]:
        """``systemctl show`` of ``unit`` (ActiveState, SubState, LoadState ...)."""
        out = self.systemctl("show", unit, *(f"--property={n}" for n in names)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, *matches: str) -> list[dict[str, object]]:
        out = self.run("journalctl", "--no-pager", "-o", "json", *matches, check=False).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        with open(os.path.join(self.workdir, "nspawn.log"), errors="replace") as f:
            return f.read()

    # -- stopping ----------------------------------------------------------------------

    def stop(self, timeout: float = 30) -> None:
        """SIGRTMIN+4 (halt) to the machine's PID 1, by pid; SIGKILL nspawn if it hangs."""
        if self.proc.poll() is None and self.leader:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.leader, signal.SIGRTMIN + 4)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        elif self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _boot(
    image: Image, workdir: str, name: str, cgroups: HostCgroups, containerd: MachineContainerd,
    extra: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    binds = _prepare_binds(workdir, containerd)
    join = "; ".join(f"echo $$ > {f}" for f in cgroups.procs_files())
    argv = [
        NSPAWN,
        "--quiet",
        "-D",
        image.path,
        "--boot",
        f"--machine={name}",
        "--register=no",
        "--keep-unit",
        "--system-call-filter=@keyring",
        # runc brings up ``lo`` in each container's network namespace: that needs
        # CAP_NET_ADMIN, which nspawn keeps in the bounding set only with a private network.
        "--private-network",
        "--volatile=overlay",
        "--console=read-only",
        *binds,
        *extra,
    ]
    script = f"{join}; exec " + " ".join(_quote(a) for a in argv)
    env = {"PATH": MACHINE_PATH, "LANG": "C.UTF-8"}
    with open(os.path.join(workdir, "nspawn.log"), "wb") as log:
        return subprocess.Popen(
            ["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
        )


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


@contextlib.contextmanager
def booted_machine(
    base_dir: str,
    image: Image | None = None,
    boot_timeout: float = 60,
    extra: tuple[str, ...] = (),
    containerd: str = cl.CONTAINERD_16,
) -> Iterator[Machine]:
    """Boot the lab machine, wait until systemd reports running and containerd answers; always stop.

    ``containerd``: which one the machine runs (:func:`machine_containerd`; Debian's by default).
    """
    which = machine_containerd(containerd)  # an absent build fails here, before anything starts
    image = image or ensure_image()
    name = unique("rgsd")
    workdir = os.path.join(base_dir, name)
    os.makedirs(workdir)
    cgroups = HostCgroups.create(name)
    machine: Machine | None = None
    try:
        started = time.monotonic()
        proc = _boot(image, workdir, name, cgroups, which, extra)
        machine = Machine(name, workdir, cgroups, proc, image=image, containerd=which)
        if not wait_for(lambda: proc.poll() is not None or _leader(proc.pid) is not None, boot_timeout, 0.01):
            raise RuntimeError("systemd-nspawn started no systemd")
        if proc.poll() is not None:
            raise RuntimeError(f"systemd-nspawn exited {proc.returncode}:\n{machine.log()[-3000:]}")
        machine.leader = _leader(proc.pid) or 0

        def up() -> bool:
            state = machine.run("systemctl", "is-system-running", check=False).stdout.strip()
            return state in ("running", "degraded") or proc.poll() is not None

        if not wait_for(up, boot_timeout, 0.05) or proc.poll() is not None:
            raise RuntimeError(f"machine {name} did not boot:\n{machine.log()[-3000:]}")
        machine.boot_s = time.monotonic() - started
        install_rootfs(machine)
        if not wait_for(machine.containerd_answers, 30, 0.1):
            status = machine.systemctl("status", "containerd").stdout
            raise RuntimeError(f"containerd did not start in {name}:\n{status}")
        yield machine
    finally:
        if machine is not None:
            machine.stop()
        cgroups.destroy()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    """``python -m labkit.systemd [build]``: build the cached root (CI's install step)."""
    import sys
    import tempfile

    image = ensure_image()
    print(
        f"image {image.path} (debootstrap {image.recorded_build_s:.1f} s"
        f"{', cached' if image.build_s is None else ''})"
    )
    if sys.argv[1:] == ["build"]:
        return
    with tempfile.TemporaryDirectory(prefix="rgsd-") as tmp, booted_machine(tmp) as machine:
        print(f"booted {machine.name} in {machine.boot_s:.2f} s, PID 1 = {machine.leader}")
        print(machine.run("systemctl", "is-system-running", check=False).stdout.strip())
        print(machine.run("cat", "/proc/self/cgroup").stdout)


if __name__ == "__main__":
    main()


# -- containers under the systemd driver ------------------------------------------------

#: The rootfs every task runs from, inside the machine.
ROOTFS = "/var/lib/rg-rootfs"
TASK_STATE = "/run/containerd/io.containerd.runtime.v2.task"
RUNC_ROOT = "/run/containerd/runc"
#: runc-guard's files inside the machine (its defaults: the machine is fresh every boot).
PENDING_DIR = "/run/runc-guard/pending"
STATS_FILE = "/run/runc-guard/deletes.jsonl"
V1_CONTROLLERS_LEFT_BY_SYSTEMD = ("cpuset", "freezer")


def install_rootfs(machine: Machine) -> None:
    """A static-busybox root filesystem for ``ctr run --rootfs``, written from the host side."""
    root = machine.host_path(ROOTFS)
    os.makedirs(os.path.join(root, "bin"), exist_ok=True)
    shutil.copy2(BUSYBOX, os.path.join(root, "bin", "busybox"))
    for applet in ("sh", "sleep", "cat", "true"):
        with contextlib.suppress(FileExistsError):
            os.symlink("busybox", os.path.join(root, "bin", applet))
    for d in ("proc", "dev", "sys", "tmp", "etc", "run"):
        os.makedirs(os.path.join(root, d), exist_ok=True)


def pod_slice(pod_uid: str, qos: str = "burstable") -> str:
    """kubelet's slice for a pod: dashes in the uid become underscores (systemd escaping)."""
    return f"kubepods-{qos}-pod{pod_uid.replace('-', '_')}.slice"


def slice_path(slice_name: str) -> str:
    """The cgroup path systemd gives a nested slice: every dash-prefix is a parent slice."""
    parts = slice_name[: -len(".slice")].split("-")
    return "/" + "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


@dataclass
class SdTask:
    """A task of the machine's containerd (host PID unless ``private_pid``), under runc's systemd driver."""

    machine: Machine
    namespace: str
    id: str
    binary: str
    pod_slice: str

    @property
    def unit(self) -> str:
        return f"cri-containerd-{self.id}.scope"

    @property
    def relative(self) -> str:
        """The scope's cgroup path inside the machine (the same in every hierarchy)."""
        return f"{slice_path(self.pod_slice)}/{self.unit}"

    @property
    def cgroups_path(self) -> str:
        """The OCI cgroupsPath of the systemd driver: ``slice:prefix:name``."""
        return f"{self.pod_slice}:cri-containerd:{self.id}"

    def host_dirs(self) -> list[str]:
        """Every directory of the scope (and below) left in any hierarchy, as the host sees them."""
        found = []
        for path in self.machine.cgroups.paths:
            top = path + self.relative
            if os.path.isdir(top):
                found.extend(d for d, _s, _f in os.walk(top))
        return sorted(found)

    def host_cgroup(self, hierarchy: str) -> str:
        return f"{CGROUP_ROOT}/{hierarchy}{self.machine.cgroup_prefix}{self.relative}"

    def host_pids(self) -> list[int]:
        return procs(self.host_cgroup("memory"))

    def bundle(self) -> str:
        return self.machine.host_path(f"{TASK_STATE}/{self.namespace}/{self.id}")

    def runc_state(self) -> str:
        return self.machine.host_path(f"{RUNC_ROOT}/{self.namespace}/{self.id}/state.json")

    def gone(self) -> bool:
        return not os.path.exists(self.bundle())

    def unit_state(self) -> dict[str, str]:
        return self.machine.unit_properties(self.unit, "LoadState", "ActiveState", "SubState", "Result")

    def containerd_lines(self) -> list[str]:
        """containerd's journal lines that name this task."""
        out = self.machine.run("journalctl", "-u", "containerd", "-o", "cat", "--no-pager", check=False)
        return [line for line in out.stdout.splitlines() if self.id in line]

    def cleanup_failures(self) -> list[str]:
        """containerd's ``failed to delete`` lines: the shim's cleanup failed or was killed."""
        return [line for line in self.containerd_lines() if "failed to delete" in line]

    def init_host_pid(self) -> int:
        """init's host pid: the task's pid in the machine, mapped through NSpid."""
        listed = self.machine.ctr(self.namespace, "task", "ls").stdout.splitlines()[1:]
        inner = next(int(c[1]) for c in (line.split() for line in listed) if c and c[0] == self.id)
        for pid in self.host_pids():
            # NSpid: host, machine[, container]: the machine's pid is the second field.
            if _ns_pid(pid, 1) == inner:
                return pid
        raise LookupError(f"init {inner} of {self.id} not found among {self.host_pids()}")

    def shim_host_pid(self, init: int) -> int:
        return shim_of(init, self.id)

    def children(self) -> list[int]:
        init = self.init_host_pid()
        return [p for p in self.host_pids() if p != init]


def _ns_pid(pid: int, level: int = -1) -> int | None:
    """A host pid in one PID namespace level (``NSpid``'s fields; default: the innermost)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    fields = line.split()[1:]
                    return int(fields[level]) if -len(fields) <= level < len(fields) else None
    except (OSError, ValueError):
        return None
    return None


def new_id() -> str:
    """A 64-hex container id, as containerd's CRI makes them (sweep and discovery match on it)."""
    import uuid

    return uuid.uuid4().hex + uuid.uuid4().hex


def run_task(
    machine: Machine, namespace: str, binary: str, children: int = 3, private_pid: bool = False
) -> SdTask:
    """Start a detached task in a pod slice through ``binary`` with ``--runc-systemd-cgroup``.

    Host PID by default (the incident's shape); ``private_pid``: its own PID namespace
    (kubelet's default), whose init stays in do_exit until every child is gone.
    """
    import uuid

    task = SdTask(machine, namespace, new_id(), binary, pod_slice(str(uuid.uuid4())))
    script = " ".join(["/bin/sleep 1000 &"] * children) + " wait"
    pid_ns = [] if private_pid else ["--with-ns", "pid:/proc/1/ns/pid"]
    machine.ctr(
        namespace, "run", "-d", "--null-io", "--rootfs", "--runc-binary", binary,
        "--runc-systemd-cgroup", "--cgroup", task.cgroups_path,
        *pid_ns, ROOTFS, task.id, "/bin/sh", "-c", script,
    )  # fmt: skip
    if not wait_for(lambda: len(task.host_pids()) >= children + 1, 10):
        raise RuntimeError(f"task {task.id} did not start {children} children: {task.host_pids()}")
    return task


def freezer_hold(machine: Machine) -> FreezerHold:
    """A frozen hold inside the machine's own freezer hierarchy (its cgroup namespace root)."""
    return FreezerHold.create(f"{CGROUP_ROOT}/freezer{machine.cgroup_prefix}")


def remove_task(task: SdTask) -> None:
    """Whatever a scenario left: processes, the containerd record, the scope unit, the dirs."""
    for d in task.host_dirs():
        for pid in procs(d):
            with (
                contextlib.suppress(OSError),
                open(f"{CGROUP_ROOT}/freezer{task.machine.cgroup_prefix}/cgroup.procs", "w") as f,
            ):
                f.write(str(pid))
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    m = task.machine
    if m.alive():
        m.ctr(task.namespace, "task", "delete", "-f", task.id, check=False)
        m.ctr(task.namespace, "container", "rm", task.id, check=False)
        m.systemctl("stop", task.unit)
        m.systemctl("reset-failed", task.unit)
    wait_for(lambda: not any(procs(d) for d in task.host_dirs()), 10)
    for d in sorted(task.host_dirs(), key=lambda p: -p.count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(d)


@dataclass
class CrashOutcome:
    """What one Path B crash under the systemd driver left behind."""

    task: SdTask
    delay: float
    cleanup_s: float
    dirs_left: list[str]
    unit: dict[str, str]
    bundle_gone: bool
    state_left: bool
    #: containerd's errors about the dead shim's cleanup (e.g. ``error="signal: killed"``).
    containerd_errors: list[str]

    def hierarchies_left(self) -> list[str]:
        """The hierarchy names that still hold a directory of the scope."""
        prefix = len(CGROUP_ROOT) + 1
        return sorted({d[prefix:].split("/", 1)[0] for d in self.dirs_left})


def path_b(
    machine: Machine,
    namespace: str,
    binary: str,
    delay: float,
    children: int = 3,
    held: int = 3,
    settle: float = 20.0,
    private_pid: bool = False,
) -> CrashOutcome:
    """The incident's path under the systemd driver: children frozen, init and shim SIGKILLed.

    containerd notices the dead shim and runs ``<binary> delete --force`` (without
    ``--systemd-cgroup``) through ``containerd-shim-runc-v2 delete`` within its
    5 s budget; the held children are released ``delay`` s after the shim died.
    Reports the directories and the scope unit once the kernel is done.
    """
    task = run_task(machine, namespace, binary, children, private_pid)
    hold = freezer_hold(machine)
    try:
        hold.hold(task.children()[:held])
        init = task.init_host_pid()
        shim = task.shim_host_pid(init)
        os.kill(init, signal.SIGKILL)
        wait_for(lambda: init not in task.host_pids(), 5)
        os.kill(shim, signal.SIGKILL)
        killed = time.monotonic()
        # containerd may be done (bundle deleted) while the children are still held.
        gone_at = None
        while time.monotonic() < killed + delay:
            if gone_at is None and task.gone():
                gone_at = time.monotonic()
            time.sleep(0.05)
        hold.release()
        wait_for(lambda: task.gone() or bool(task.cleanup_failures()), settle, 0.1)
        cleanup_s = (gone_at or time.monotonic()) - killed
        wait_for(lambda: not task.host_pids(), 5)
        # systemd may still be collecting the unit: let its state settle.
        time.sleep(0.5)
        outcome = CrashOutcome(
            task, delay, cleanup_s, task.host_dirs(), task.unit_state(), task.gone(),
            os.path.exists(task.runc_state()), task.cleanup_failures(),
        )  # fmt: skip
    finally:
        hold.destroy()
    return outcome


@dataclass
class DeleteOutcome:
    """What one ``ctr task delete`` (the serving shim's delete) did and left."""

    task: SdTask
    status: int
    took_s: float
    stderr: str
    dirs_left: list[str]
    unit: dict[str, str]
    state_left: bool


def path_a(machine: Machine, namespace: str, binary: str, delay: float, children: int = 3) -> DeleteOutcome:
    """kubelet's stop with the shim alive: init SIGKILLed, then ``ctr task delete``.

    The serving shim runs ``<binary> --systemd-cgroup delete <id>`` for it; the held
    children are released ``delay`` s after the delete started.
    """
    import threading

    task = run_task(machine, namespace, binary, children)
    hold = freezer_hold(machine)
    try:
        hold.hold(task.children())
        init = task.init_host_pid()
        os.kill(init, signal.SIGKILL)
        wait_for(lambda: init not in task.host_pids(), 5)
        wait_for(lambda: "STOPPED" in machine.ctr(namespace, "task", "ls", check=False).stdout, 5, 0.05)
        timer = threading.Timer(delay, hold.release)
        timer.start()
        started = time.monotonic()
        try:
            out = machine.ctr(namespace, "task", "delete", task.id, check=False)
        finally:
            timer.cancel()
        took = time.monotonic() - started
        hold.release()
        wait_for(lambda: not task.host_pids(), 5)
        time.sleep(0.5)  # systemd may still be collecting the unit
        return DeleteOutcome(
            task, out.returncode, round(took, 2), out.stderr, task.host_dirs(), task.unit_state(),
            os.path.exists(task.runc_state()),
        )  # fmt: skip
    finally:
        hold.destroy()


@contextlib.contextmanager
def scope_stop_timeout(machine: Machine, seconds: int) -> Iterator[None]:
    """Give every ``cri-containerd-*.scope`` another stop timeout (a dash-prefix drop-in; systemd >= 246).

    The drop-in applies to transient scopes too; without it the lab's
    DefaultTimeoutStopSec (5 s) holds. Removed (and systemd reloaded) afterwards.
    """
    directory = machine.host_path("/etc/systemd/system/cri-containerd-.scope.d")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "90-rg-stop-timeout.conf")
    with open(path, "w") as f:
        f.write(f"[Scope]\nTimeoutStopSec={seconds}s\n")
    machine.systemctl("daemon-reload", check=True)
    try:
        yield
    finally:
        os.unlink(path)
        machine.systemctl("daemon-reload")


@contextlib.contextmanager
def containerd_environment(machine: Machine, **variables: str) -> Iterator[None]:
    """Restart the machine's containerd with extra environment (the shim and runc-guard inherit it)."""
    assignments = [f"{k}={v}" for k, v in variables.items()]
    machine.systemctl("set-environment", *assignments, check=True)
    machine.systemctl("restart", "containerd", check=True)
    try:
        yield
    finally:
        machine.systemctl("unset-environment", *variables)
        machine.systemctl("restart", "containerd")
        wait_for(machine.containerd_answers, 30, 0.1)


def guard_stats(machine: Machine, container_id: str) -> list[dict[str, object]]:
    """runc-guard's stats lines inside the machine for one container (its own, not the last written)."""
    return cl.read_stats(machine.host_path(STATS_FILE), {container_id})


def pending_records(machine: Machine) -> list[str]:
    path = machine.host_path(PENDING_DIR)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []
