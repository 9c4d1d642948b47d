"""Do we see the PID namespace the containers' runtime runs in? (sweep and audit ask first)

runc records its init's pid as its own PID namespace sees it, and the sweep
judges that init dead when ``/proc/<pid>`` is gone. From any other PID
namespace (a sweeper pod without ``hostPID``, ``kubectl debug``,
``unshare --pid --mount-proc``) every init looks dead, and the sweep would
re-run ``delete --force`` for running containers; cgroup v1's ``cgroup.procs``
even hides the processes it cannot see, so a populated cgroup reads as empty.
So sweep and audit refuse to run unless the answer is a proven "yes".

What proves it, both from the kernel:

- ``/proc`` is this PID namespace's own (``/proc/self`` names our own pid):
  a procfs mounted from another namespace maps every pid wrongly;
- and either this is the kernel's initial PID namespace (its nsfs inode
  is ``PROC_PID_INIT_INO``, 0xEFFFFFFC, include/linux/proc_ns.h; every other
  namespace gets a dynamic inode >= 0xF0000000), or a running ``containerd``
  shares our namespace *and our root directory* (a node that is itself a
  container: kind, a systemd-nspawn machine), so its shims and runtimes do too.
  A name alone proves nothing: a pod without ``hostPID`` that runs its own
  ``containerd`` (Docker-in-Docker, a CI runner) shares its namespace with that
  one, not with the node's runtime whose state it may have mounted. A
  containerd whose ``/proc/<pid>/root`` is another directory than ours runs
  in another container, and is no proof.

``NSpid`` in ``/proc/self/status`` is no proof: it lists our pid from the
namespace of the procfs that is mounted down, so ``unshare --pid
--mount-proc`` shows a single level exactly like the host. Anything that cannot
be read is ``unknown``, and unknown refuses like foreign.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: include/linux/proc_ns.h: the initial PID namespace's inode number in nsfs.
PROC_PID_INIT_INO = 0xEFFFFFFC

HOST = "host"
FOREIGN = "foreign"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class PidNamespaceView:
    """``host``, ``foreign`` or ``unknown``, with the reason in words."""

    verdict: str
    reason: str

    @property
    def trusted(self) -> bool:
        return self.verdict == HOST


def _ns_inode(path: str) -> int:
    return os.stat(path).st_ino


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _containerd_in(proc: str, own: int) -> bool | None:
    """Whether a ``containerd`` process shares PID namespace ``own`` and our root directory;
    None when /proc cannot be listed or our own root cannot be read."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
        root = _identity(f"{proc}/self/root")
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/comm", "rb") as f:
                if f.read().strip() != b"containerd":
                    continue
            if _ns_inode(f"{proc}/{pid}/ns/pid") == own and _identity(f"{proc}/{pid}/root") == root:
                return True
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return False


def pid_namespace_view(proc: str = "/proc", pid: int | None = None) -> PidNamespaceView:
    """Whether pids in runtime state can be judged from here (see the module's docstring)."""
    me = os.getpid() if pid is None else pid
    try:
        self_link = os.readlink(f"{proc}/self")
    except OSError as exc:
        return PidNamespaceView(UNKNOWN, f"cannot read {proc}/self: {exc.strerror}")
    if self_link != str(me):
        return PidNamespaceView(
            FOREIGN, f"{proc} belongs to another PID namespace ({proc}/self is {self_link!r}, we are {me})"
        )
    try:
        own = _ns_inode(f"{proc}/self/ns/pid")
    except OSError as exc:
        return PidNamespaceView(UNKNOWN, f"cannot stat {proc}/self/ns/pid: {exc.strerror}")
    if own == PROC_PID_INIT_INO:
        return PidNamespaceView(HOST, "the initial PID namespace")
    shared = _containerd_in(proc, own)
    if shared is None:
        return PidNamespaceView(UNKNOWN, f"cannot list {proc}")
    if shared:
        return PidNamespaceView(
            HOST, f"not the initial PID namespace; containerd runs in it, with our root (pid:[{own}])"
        )
    return PidNamespaceView(
        FOREIGN, f"a private PID namespace (pid:[{own}]) without a containerd of our root in it"
    )


def refusal(command: str, view: PidNamespaceView) -> str:
    """The one line an operator reads: what was refused, why, and what to do."""
    return (
        f"{command} refused: cannot judge container processes from this PID namespace ({view.verdict}: "
        f"{view.reason}); every init would look dead. Run it on the host, or in a pod with hostPID: true"
    )
