"""Runtime state whose container is gone: find it, judge it, re-run the runtime's own delete.

runc >= 1.2 keeps ``<root>/<id>/state.json`` when ``delete`` fails (a busy
cgroup) so that the delete can be re-run, and containerd's dead-shim cleanup
never re-runs it (it only logs ``failed to remove runc container``); the CRI's
dead-shim path does not even call ``delete`` for a pod's containers. Such
state keeps its cgroups "in use" for the sweep forever. A state is an orphan
when containerd owns it (it lies in containerd's namespaced root, or in a root
the operator named and shows no other manager: :mod:`node.ownership`), its
init is provably dead (pid gone, a zombie, or its start time changed: runc's
own ``Status()`` test; a ``/proc`` that cannot be read is not proof:
:mod:`node.liveness`), no containerd bundle and no live shim owns it, and it
is older than ``min_age``.

Read (:func:`find_states`, :func:`read_state_facts`, :func:`live_shim_ids`),
decide (:func:`judge`, pure) and act (:func:`redrive`) are apart. Acting is
only ever the runtime's own ``delete --force``, run directly (never through
runc-guard), bounded by a timeout, its output kept for the report.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from runc_guard.delete.state import read_state
from runc_guard.errors import RuncGuardError
from runc_guard.invocation import valid_container_id
from runc_guard.node import liveness, ownership

#: Flat state roots (``<root>/<id>``): runc's and crun's defaults when run by hand or by CRI-O/podman.
#: Shared with other managers: state there keeps its container's cgroups, but is never
#: judged or re-driven unless a root is named explicitly (``Orphans.named_roots``).
DEFAULT_FLAT_ROOTS = ("/run/runc", "/run/crun")
#: runc 1.1's ``delete --force`` alone may poll 10 s for an init in its own PID namespace.
DEFAULT_REDRIVE_TIMEOUT = 30.0
#: Enough of the runtime's output to show its error; the rest is noise in a report.
MAX_OUTPUT = 4000

#: judge()'s verdicts: only ORPHAN is acted on.
ORPHAN = "orphan"
#: Another manager's state (podman, CRI-O ...), or one whose owner cannot be told: never touched.
FOREIGN = "foreign"
OWNER_UNKNOWN = "owner_unknown"
#: ``/proc`` could not say whether the init lives: never touched.
INIT_UNKNOWN = "init_unknown"
VERDICTS = (
    "unreadable", FOREIGN, OWNER_UNKNOWN, INIT_UNKNOWN, "alive", "bundle", "shim", "too_young", ORPHAN,
)
#: Verdicts the audit lists as left alone on purpose (the operator may want to look).
LEFT_ALONE = (FOREIGN, OWNER_UNKNOWN, INIT_UNKNOWN)

RUNC_STATE = "state.json"
CRUN_STATE = "status"


# -- read ---------------------------------------------------------------------


@dataclass(frozen=True)
class StateDir:
    """One runtime state directory: ``<root>/<id>``, where ``root`` is what ``--root`` names."""

    root: str
    container_id: str
    #: containerd namespace (``<top>/<ns>/<id>`` layout), "" for a flat root.
    namespace: str = ""
    #: ``root`` is a namespace of containerd's runtime root: the location proves containerd owns it.
    containerd_root: bool = False

    @property
    def path(self) -> str:
        return os.path.join(self.root, self.container_id)


def _state_kind(path: str) -> str | None:
    """``runc`` (state.json), ``crun`` (status), or None when ``path`` holds no runtime state."""
    if os.path.isfile(os.path.join(path, RUNC_STATE)):
        return "runc"
    if os.path.isfile(os.path.join(path, CRUN_STATE)):
        return "crun"
    return None


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


def find_states(containerd_roots: Iterable[str], named_roots: Iterable[str] = ()) -> list[StateDir]:
    """Every state directory under containerd's runtime roots and the roots the operator named.

    containerd's shim always runs its runtime with ``--root <runtime root>/<ns>``,
    so only ``<root>/<ns>/<id>`` there is containerd's (anything directly in the
    root is not). In a named root the layout is told per entry: a directory
    holding ``state.json``/``status`` is a container; any other directory is a
    namespace whose children are looked at. A directory runc made but has not
    written state into yet (a container being created) is neither, and is skipped.
    """
    found: list[StateDir] = []
    containerd = list(dict.fromkeys(os.path.normpath(r) for r in containerd_roots))
    for root in containerd:
        for name in _subdirs(root):
            path = os.path.join(root, name)
            for cid in _subdirs(path):
                if valid_container_id(cid) and _state_kind(os.path.join(path, cid)) is not None:
                    found.append(StateDir(path, cid, name, containerd_root=True))
    for root in dict.fromkeys(os.path.normpath(r) for r in named_roots):
        if root in containerd:
            continue
        for name in _subdirs(root):
            path = os.path.join(root, name)
            if _state_kind(path) is not None:
                if valid_container_id(name):
                    found.append(StateDir(root, name))
                continue
            for cid in _subdirs(path):
                if valid_container_id(cid) and _state_kind(os.path.join(path, cid)) is not None:
                    found.append(StateDir(path, cid, name))
    return found


def states_of(
    containerd_roots: Iterable[str],
    container_id: str,
    extra_root: str | None = None,
    named_roots: Iterable[str] = (),
) -> list[StateDir]:
    """The state directories of one container id in containerd's roots, named roots and ``extra_root``.

    ``extra_root`` is the ``--root`` a pending record names (the delete runc-guard
    was asked to do): containerd's when it is a namespace of a containerd root.
    """
    if not valid_container_id(container_id):
        return []
    found: list[StateDir] = []
    containerd = list(dict.fromkeys(os.path.normpath(r) for r in containerd_roots))
    candidates: dict[str, tuple[str, bool]] = {}
    for top in containerd:
        for ns in _subdirs(top):
            candidates.setdefault(os.path.join(top, ns), (ns, True))
    if extra_root:
        root = os.path.normpath(extra_root)
        parent = os.path.dirname(root)
        candidates.setdefault(root, (os.path.basename(root), True) if parent in containerd else ("", False))
    for top in dict.fromkeys(os.path.normpath(r) for r in named_roots):
        if top in containerd:
            continue
        candidates.setdefault(top, ("", False))
        for ns in _subdirs(top):
            candidates.setdefault(os.path.join(top, ns), (ns, False))
    for root, (namespace, in_containerd) in candidates.items():
        if _state_kind(os.path.join(root, container_id)) is not None:
            found.append(StateDir(root, container_id, namespace, in_containerd))
    return found


def _shim_argvs(proc: str) -> Iterator[list[bytes]]:
    """The command line of every running containerd shim (one pass over ``/proc/*/cmdline``)."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                argv = f.read(8192).split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if os.path.basename(argv[0]).startswith(b"containerd-shim"):
            yield argv


def _is_cleanup(argv: list[bytes]) -> bool:
    """containerd's dead-shim cleanup: ``containerd-shim-runc-v2 ... delete``."""
    return [a for a in argv if a][-1:] == [b"delete"]


def live_shim_ids(proc: str = "/proc", serving_only: bool = False) -> frozenset[str]:
    """Ids named by every running containerd shim (``-id <id>``, v1's ``-workdir .../<id>``).

    One pass over ``/proc/*/cmdline`` per sweep or audit (a few hundred small
    reads). A grouped CRI shim names the sandbox id only; its containers keep
    their bundles while it lives, which the bundle check sees. ``serving_only``
    leaves out containerd's dead-shim cleanup (``containerd-shim-runc-v2 ...
    delete``), which serves nothing and exits once its runtime's delete returned.
    """
    ids: set[str] = set()
    for argv in _shim_argvs(proc):
        if serving_only and _is_cleanup(argv):
            continue
        for flag, value in itertools.pairwise(argv):
            if flag in (b"-id", b"--id"):
                ids.add(value.decode("utf-8", "replace"))
            elif flag in (b"-workdir", b"--workdir"):
                ids.add(os.path.basename(value.rstrip(b"/")).decode("utf-8", "replace"))
    return frozenset(ids)


def cleanups_running(proc: str = "/proc") -> int:
    """How many of containerd's dead-shim cleanups run right now (a crash storm still under way)."""
    return sum(1 for argv in _shim_argvs(proc) if _is_cleanup(argv))


@dataclass(frozen=True)
class StateFacts:
    """One look at a runtime state directory."""

    state: StateDir
    #: ``runc`` (state.json) or ``crun`` (status).
    kind: str
    #: Why the state could not be parsed (then nothing is known about its init).
    error: str | None
    init_pid: int
    #: ``alive``, ``dead`` or ``unknown`` (:mod:`node.liveness`): only ``dead`` is acted on.
    init: str
    has_bundle: bool
    shim_alive: bool
    #: Newest mtime of the directory and its state file (runc rewrites state.json on every change).
    modified: float
    cgroup_paths: tuple[str, ...] = ()
    #: :func:`ownership.owner_of`: containerd, named_root, foreign:<manager> or unknown.
    owner: str = ownership.UNKNOWN


def _mtime(path: str) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def read_state_facts(
    state: StateDir,
    has_bundle: Callable[[str], bool],
    shims: frozenset[str],
    mounts: Callable[[], Mapping[str, str]],
    proc: str = "/proc",
) -> StateFacts:
    """Parse the state with :func:`state.read_state` and look at its owner, init, bundle and shim."""
    kind = "runc" if os.path.exists(os.path.join(state.path, RUNC_STATE)) else "crun"
    modified = max(
        _mtime(state.path),
        _mtime(os.path.join(state.path, RUNC_STATE if kind == "runc" else CRUN_STATE)),
    )
    bundle = has_bundle(state.container_id)
    shim = state.container_id in shims
    try:
        parsed = read_state(state.root, state.container_id, mounts)
    except RuncGuardError as exc:
        return StateFacts(state, kind, str(exc), 0, liveness.UNKNOWN, bundle, shim, modified)
    return StateFacts(
        state,
        kind,
        None,
        parsed.init_pid,
        liveness.init_liveness(parsed.init_pid, parsed.init_start, proc),
        bundle,
        shim,
        modified,
        tuple(sorted(set(parsed.cgroup_paths.values()))),
        ownership.owner_of(parsed.labels, state.containerd_root),
    )


# -- decide -------------------------------------------------------------------


def judge(facts: StateFacts, now: float, min_age: float) -> str:
    """``orphan`` only when containerd owns the state, its init is provably dead and nothing holds it.

    Unreadable state says nothing about its init, so it is kept like live state;
    so is another manager's state, state whose owner cannot be told, and state
    whose init ``/proc`` could not judge (:mod:`node.liveness`).
    """
    if facts.error is not None:
        return "unreadable"
    if facts.owner.startswith(ownership.FOREIGN):
        return FOREIGN
    if ownership.untouchable(facts.owner):
        return OWNER_UNKNOWN
    if facts.init == liveness.UNKNOWN:
        return INIT_UNKNOWN
    if facts.init != liveness.DEAD:
        return "alive"
    if facts.has_bundle:
        return "bundle"
    if facts.shim_alive:
        return "shim"
    if now - facts.modified < min_age:
        return "too_young"
    return ORPHAN


def runtime_for(facts: StateFacts, recorded: str | None, configured: str) -> str:
    """The runtime to re-run: the pending record's, else crun for crun's state, else the configured one."""
    if recorded:
        return recorded
    if facts.kind == "crun" and "crun" not in os.path.basename(configured):
        return "crun"
    return configured


# -- act ----------------------------------------------------------------------


@dataclass
class Redrive:
    """One re-run of the runtime's ``delete --force`` for an orphaned state, for the report."""

    container_id: str
    root: str
    argv: list[str]
    #: The runtime's exit status; None when it could not be started or hit the timeout.
    exit_code: int | None
    output: str
    seconds: float
    #: Whether the state directory is still there afterwards.
    state_left: bool
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def redrive(state: StateDir, runtime_path: str, timeout: float) -> Redrive:
    """Run ``<runtime> --root <root> delete --force <id>`` as a child, within ``timeout``.

    On timeout ``subprocess.run`` SIGKILLs the child (by its pid) and reaps it.
    """
    argv = [runtime_path, "--root", state.root, "delete", "--force", state.container_id]
    started = time.monotonic()
    exit_code: int | None = None
    error = ""
    output = ""
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
        exit_code = done.returncode
        output = (done.stdout + done.stderr).decode("utf-8", "replace")
    except subprocess.TimeoutExpired as exc:
        error = f"timed out after {timeout:g}s (killed)"
        output = ((exc.stdout or b"") + (exc.stderr or b"")).decode("utf-8", "replace")
    except OSError as exc:
        error = f"cannot run {runtime_path}: {exc.strerror}"
    return Redrive(
        state.container_id,
        state.root,
        argv,
        exit_code,
        output.strip()[-MAX_OUTPUT:],
        round(time.monotonic() - started, 3),
        _state_kind(state.path) is not None,
        error,
    )


def resolve(name: str, environ: Mapping[str, str]) -> str:
    """The runtime's absolute path, never runc-guard itself (an install may shadow ``runc``)."""
    from runc_guard.runtime import resolve_runtime

    me = shutil.which("runc-guard", path=environ.get("PATH")) or os.path.join(
        os.path.dirname(sys.executable), "runc-guard"
    )
    return resolve_runtime(name, me, environ)


@dataclass
class Orphans:
    """What the sweep and the audit need to judge runtime state and re-drive orphans.

    Built once per run (one ``/proc`` pass for the shims); ``redrive`` is the act,
    a parameter so unit tests never start a real runtime.
    """

    #: containerd's runtime roots (``<root>/<ns>/<id>``): judged, the location proves the owner.
    roots: tuple[str, ...]
    has_bundle: Callable[[str], bool]
    configured_runtime: str
    mounts: Callable[[], Mapping[str, str]]
    shims: frozenset[str] = frozenset()
    timeout: float = DEFAULT_REDRIVE_TIMEOUT
    proc: str = "/proc"
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    run: Callable[[StateDir, str, float], Redrive] = redrive
    #: Other roots the operator named (flat or namespaced): judged, never another manager's state.
    named_roots: tuple[str, ...] = ()

    def scan(self) -> list[StateFacts]:
        """Every state under the roots, looked at once."""
        return [self.look(state) for state in find_states(self.roots, self.named_roots)]

    def look(self, state: StateDir) -> StateFacts:
        return read_state_facts(state, self.has_bundle, self.shims, self.mounts, self.proc)

    def of(self, container_id: str, extra_root: str | None = None) -> list[StateFacts]:
        """A fresh look at every state of one container (right before acting on it)."""
        return [self.look(s) for s in states_of(self.roots, container_id, extra_root, self.named_roots)]

    def act(self, facts: StateFacts, recorded_runtime: str | None) -> Redrive:
        """Re-run the runtime's own delete for an orphan; a runtime that cannot be found is reported."""
        name = runtime_for(facts, recorded_runtime, self.configured_runtime)
        try:
            path = resolve(name, self.environ)
        except RuncGuardError as exc:
            return Redrive(facts.state.container_id, facts.state.root, [name], None, "", 0.0, True, str(exc))
        return self.run(facts.state, path, self.timeout)
