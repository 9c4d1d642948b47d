"""One error hierarchy, one exit code per kind of failure.

Exit codes follow sysexits(3) so that they never collide with the runtime's own
statuses (runc exits 1 on its errors; a signal death is 128+N). When the
runtime itself fails, runc-guard exits with the runtime's status unchanged; the
codes below are runc-guard's own verdicts. Imported on the hot path: stdlib only.
"""

from __future__ import annotations

#: sweep/audit: no cgroup filesystem is mounted below the given root (EX_NOINPUT).
EXIT_NO_HIERARCHY = 66
#: state.json names cgroup paths that are not the container's own cgroups: nothing was touched.
EXIT_UNSAFE_STATE = 65
#: The runtime to front cannot be found, is not executable, or is runc-guard itself.
EXIT_RUNTIME_UNAVAILABLE = 69
#: A bug in runc-guard: logged with its traceback to the journal, one line on stderr.
EXIT_INTERNAL = 70
#: A cgroup could not be removed for a reason waiting cannot fix (EROFS, EACCES, ...).
EXIT_CGROUP_ERROR = 74
#: sweep: another sweep holds the node's sweep lock; nothing was done, that sweep does it
#: (EX_CANTCREAT: the lock cannot be taken). Its own code: 75 is the delete's deadline alone.
EXIT_SWEEP_LOCKED = 73
#: The deadline passed (cgroups still in use, or the runtime's own delete still running);
#: the pending record stays for a retry or the sweep (EX_TEMPFAIL).
EXIT_CGROUP_BUSY = 75
#: sweep/audit: this process does not see the runtime's PID namespace (EX_NOPERM: not refused
#: for a lack of rights, but "not from here"; node.pidns).
EXIT_FOREIGN_PID_NAMESPACE = 77
#: The settings file or a RUNC_GUARD_* variable is invalid.
EXIT_CONFIG = 78


class RuncGuardError(Exception):
    """Base of every error runc-guard reports on purpose; ``exit_code`` is its verdict."""

    exit_code = EXIT_INTERNAL


class ConfigError(RuncGuardError):
    """A setting has a bad value, an unknown key, or the file cannot be read."""

    exit_code = EXIT_CONFIG


class ContainerdConfigError(ConfigError):
    """A containerd config runc-guard cannot (or must not) change as asked (node.containerd_config)."""


class RuntimeNotFound(RuncGuardError):
    """No usable runtime to exec: missing, not executable, or a loop back to runc-guard."""

    exit_code = EXIT_RUNTIME_UNAVAILABLE


class StateUnreadable(RuncGuardError):
    """state.json is missing, unreadable or not what runc writes; the delete passes through."""


class StateMissing(StateUnreadable):
    """The runtime has no state for the container at all (never created, or already deleted)."""


class UnsafeCgroupPath(RuncGuardError):
    """A recorded cgroup path is not a plain directory inside the container's cgroup tree."""

    exit_code = EXIT_UNSAFE_STATE

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"refusing cgroup path {path!r}: {reason}")
        self.path = path
        self.reason = reason


class RuntimeDeadline(RuncGuardError):
    """The runtime's own delete was still running at the deadline and was stopped."""

    exit_code = EXIT_CGROUP_BUSY

    def __init__(self, runtime: str, waited_ms: int) -> None:
        super().__init__(
            f"{runtime} delete still running after {waited_ms} ms: stopped it;"
            " recorded for a retry or runc-guardctl sweep"
        )
        self.waited_ms = waited_ms


class Interrupted(RuncGuardError):
    """SIGTERM/SIGINT/SIGHUP arrived while the delete waited for the cgroups; exit 128+N."""

    def __init__(self, signum: int, signame: str) -> None:
        super().__init__(f"interrupted by {signame} while waiting for cgroups")
        self.exit_code = 128 + signum


class NoCgroupHierarchy(RuncGuardError):
    """No cgroup filesystem is mounted below the given root: nothing can be swept or audited."""

    exit_code = EXIT_NO_HIERARCHY


class SweepLocked(RuncGuardError):
    """Another sweep is running on this node (timer, DaemonSet or by hand)."""

    exit_code = EXIT_SWEEP_LOCKED


class ForeignPidNamespace(RuncGuardError):
    """sweep/audit refused: this process does not see the runtime's PID namespace (node.pidns)."""

    exit_code = EXIT_FOREIGN_PID_NAMESPACE


# -- how a cleanup (delete.cleanup.drain) ends early: built complete, with what it did so far --


class CleanupReport:
    """What one cleanup did, filled in as it goes: the errors below carry it, so a failure reports it."""

    __slots__ = (
        "attempts", "held", "killed", "reclaimed", "remaining", "removed", "unreclaimed", "waited_ms",
    )  # fmt: skip

    def __init__(self) -> None:
        self.attempts = 0
        self.waited_ms = 0
        self.removed: list[str] = []
        self.killed: list[int] = []
        #: Directories still present at the end -> live pids found in them.
        self.remaining: dict[str, tuple[int, ...]] = {}
        #: Bytes reclaimed from the container's empty memory cgroups before their rmdir (delete.reclaim).
        self.reclaimed = 0
        #: Memory cgroups left charged (why: the value): removed anyway, the kernel keeps them dying.
        self.unreclaimed: dict[str, str] = {}
        #: Memory cgroups held aside for a reclaim after the reply (delete.memcg_hold): path -> held path.
        self.held: dict[str, str] = {}


class CgroupBusy(RuncGuardError):
    """The deadline passed with processes still inside (or EBUSY on rmdir)."""

    exit_code = EXIT_CGROUP_BUSY

    def __init__(
        self, path: str, pids: tuple[int, ...], waited_ms: int, report: CleanupReport | None = None
    ) -> None:
        shown = ", ".join(str(p) for p in pids[:8]) + (" ..." if len(pids) > 8 else "")
        detail = f"{len(pids)} process(es) still inside: {shown}" if pids else "rmdir kept failing with EBUSY"
        super().__init__(
            f"cgroup {path} still in use after {waited_ms} ms ({detail}); recorded for runc-guardctl sweep"
        )
        self.path = path
        self.pids = pids
        self.waited_ms = waited_ms
        #: What the cleanup did before giving up.
        self.report = report


class CgroupRemovalFailed(RuncGuardError):
    """rmdir failed with an error that retrying cannot fix."""

    exit_code = EXIT_CGROUP_ERROR

    def __init__(
        self, path: str, errno_name: str, strerror: str, report: CleanupReport | None = None
    ) -> None:
        super().__init__(f"cannot remove cgroup {path}: {errno_name} ({strerror})")
        self.path = path
        self.errno_name = errno_name
        #: What the cleanup did before failing.
        self.report = report


class ForeignProcess(RuncGuardError):
    """A live process that is not dying sits in a private-PID-namespace container's cgroup.

    The kernel SIGKILLs every process of a PID namespace when its init dies, so
    this one is not the container's: runc-guard steps aside and leaves it, and
    its cgroup, to the runtime and the operator.
    """

    def __init__(self, path: str, pid: int, report: CleanupReport | None = None) -> None:
        super().__init__(f"process {pid} in {path} is alive and not the container's (not dying)")
        self.path = path
        self.pid = pid
        self.report = report
