"""What one delete may do to its container's cgroups, decided once from the state and frozen.

Every later step (the wait before the runtime, the re-runs, the removal, the
deadline's kill of a live init, the thaw of a freezer the runtime left FROZEN)
reads this plan instead of re-deriving it, so a newcomer finds each rule once.
"""

from __future__ import annotations

from runc_guard.delete.state import PID_HOST, PID_JOINED, PID_PRIVATE
from runc_guard.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from runc_guard.delete.cgroupfs import CgroupFsOps
    from runc_guard.delete.state import ContainerState


class DeletePlan(Value):
    """The container's cgroup directories and what runc-guard may do to them.

    ``paths``: its distinct cgroup directories (proven at the start, or a pending
    record's). ``paused``: those whose v1 freezer was already frozen when the
    delete began (``runc pause``): never thawed by runc-guard. ``may_kill``:
    runc-guard SIGKILLs stragglers where runc's destroy would (host or joined
    PID namespace, ``kill_stragglers`` on). ``watch_foreign``: a private PID
    namespace, where a process the container's init did not start (one that
    joined the cgroup from outside) makes runc-guard step aside. ``wait_first``:
    wait for the cgroups to empty before the runtime runs, only where that
    changes nothing the runtime would do (runc-guard kills as it would, or the
    kernel is already killing a dead init's namespace); otherwise the runtime
    runs first and its own kill applies. ``may_thaw``: the runtime's delete of
    this container may be the one that left a freezer FROZEN (not so for a
    record's leftovers, whose runtime state is gone).
    """

    __slots__ = ("may_kill", "may_thaw", "paths", "paused", "wait_first", "watch_foreign")
    paths: tuple[str, ...]
    paused: frozenset[str]
    may_kill: bool
    watch_foreign: bool
    wait_first: bool
    may_thaw: bool

    def __init__(
        self,
        paths: tuple[str, ...],
        paused: frozenset[str],
        may_kill: bool,
        watch_foreign: bool,
        wait_first: bool,
        may_thaw: bool,
    ) -> None:
        self._init(locals())

    @classmethod
    def of(
        cls, state: ContainerState, paths: Sequence[str], fs: CgroupFsOps, kill_stragglers: bool
    ) -> DeletePlan:
        """The plan for a container read from its runtime state."""
        may_kill = kill_stragglers and state.pid_namespace in (PID_HOST, PID_JOINED)
        private = state.pid_namespace == PID_PRIVATE
        paused = frozenset(p for p in paths if fs.frozen(p))
        return cls(tuple(paths), paused, may_kill, private, may_kill or private, True)

    def kill_member(self, fs: CgroupFsOps, pid: int) -> bool:
        """SIGKILL ``pid`` only as a member of one of the plan's cgroups (CgroupFs.kill_if_member:
        through a pidfd, never a recycled pid); True if signalled."""
        return any(fs.exists(path) and fs.kill_if_member(pid, path) for path in self.paths)

    def thaw_left_frozen(self, fs: CgroupFsOps) -> list[str]:
        """Thaw the plan's v1 freezers that are FROZEN now but were not when the delete began.

        runc 1.1's destroy of a host-PID container freezes the container's freezer
        cgroup, SIGKILLs every process, then thaws (signalAllProcesses). Stopped in
        between (runc-guard's deadline, a signal, containerd's kill), it leaves the
        freezer FROZEN: the SIGKILLs stay pending and the cgroups can never empty
        (seen in a crash storm: ``sleep`` in state D, in every hierarchy, for good).
        Thawing is what runc itself would have done next. A container paused before
        (``runc pause``: ``paused``) stays paused, as the runtime alone leaves it and
        containerd still believes. Returns the paths thawed.
        """
        if not self.may_thaw:
            return []
        return [
            path
            for path in self.paths
            if path not in self.paused and fs.frozen(path) is True and fs.thaw(path)
        ]

    @classmethod
    def of_record(cls, paths: Sequence[str]) -> DeletePlan:
        """A pending record's leftovers: removed as found, nothing killed, thawed or watched."""
        return cls(tuple(paths), frozenset(), False, False, False, False)


#: Before the state is read: nothing to act on.
NO_PLAN = DeletePlan((), frozenset(), False, False, False, False)
