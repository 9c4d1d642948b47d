"""What sweep, audit and metrics look at: their shared options and the scan they drive."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from runc_guard.delete.cgroupfs import RealCgroupFs, cgroup_mounts
from runc_guard.node.discovery import DEFAULT_KUBEPODS, Discovery, check_kubepods_name, discover
from runc_guard.node.orphans import DEFAULT_FLAT_ROOTS, DEFAULT_REDRIVE_TIMEOUT, Orphans, live_shim_ids
from runc_guard.node.sweep import DEFAULT_BUNDLE_ROOT, DEFAULT_MIN_AGE, DEFAULT_RUNTIME_ROOT, RuntimeDirs
from runc_guard.settings import Settings
from runc_guard.values import Value

F = TypeVar("F", bound=Callable[..., Any])


def _kubepods(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return tuple(check_kubepods_name(v) for v in value) or DEFAULT_KUBEPODS
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


class Where(Value):
    """Where sweep, audit and metrics look: the options they share, as one value."""

    __slots__ = (
        "bundle_root", "cgroup_root", "kubepods", "min_age", "orphan_roots", "orphans", "runtime_root",
        "state_roots",
    )
    cgroup_root: str
    kubepods: tuple[str, ...]
    runtime_root: str
    bundle_root: str
    state_roots: tuple[str, ...]
    orphans: bool
    min_age: float
    #: Roots besides containerd's whose state is judged (and re-driven by the sweep).
    orphan_roots: tuple[str, ...]

    def __init__(
        self,
        cgroup_root: str,
        kubepods: tuple[str, ...],
        runtime_root: str,
        bundle_root: str,
        state_roots: tuple[str, ...],
        orphans: bool,
        min_age: float,
        orphan_roots: tuple[str, ...] = (),
    ) -> None:
        self._init(locals())


def scan_options(func: F) -> F:
    """Where to look: shared by sweep, audit and metrics so they always agree on "leaked".

    The command receives them as one ``where: Where`` argument.
    """

    @functools.wraps(func)
    def command(**kw: Any) -> Any:
        where = Where(**{name: kw.pop(name) for name in Where.__slots__})
        return func(where=where, **kw)

    options = [
        click.option("--cgroup-root", default="/sys/fs/cgroup", show_default=True,
                     type=click.Path(file_okay=False),
                     help="Look at every cgroup hierarchy mounted at or below this directory."),
        click.option("--kubepods", "kubepods", multiple=True, callback=_kubepods,
                     metavar="NAME",
                     help="Top-level pod tree inside each hierarchy, relative; repeatable. "
                          "[default: kubepods and kubepods.slice]"),
        click.option("--runtime-root", default=DEFAULT_RUNTIME_ROOT, show_default=True,
                     type=click.Path(file_okay=False),
                     help="containerd's runc state root holding <namespace>/<id>: a container with "
                          "state is kept; state whose init is dead is judged (--orphans)."),
        click.option("--bundle-root", default=DEFAULT_BUNDLE_ROOT, show_default=True,
                     type=click.Path(file_okay=False),
                     help="containerd's task bundles <namespace>/<id>: a container with a bundle is kept."),
        click.option("--state-root", "state_roots", multiple=True,
                     default=DEFAULT_FLAT_ROOTS, show_default=True, type=click.Path(file_okay=False),
                     help="Flat runtime state root holding <id> (runc's /run/runc, crun's /run/crun); "
                          "repeatable. State there keeps its container like --runtime-root's, but is "
                          "never judged: podman, CRI-O and plain runc keep theirs there."),
        click.option("--orphan-root", "orphan_roots", multiple=True, type=click.Path(file_okay=False),
                     metavar="DIR",
                     help="Also judge runtime state under DIR (<id> or <namespace>/<id>); repeatable. "
                          "State showing another manager (podman, CRI-O annotations or bundles) or "
                          "naming no bundle or annotation at all is still never touched."),
        click.option("--orphans/--no-orphans", default=True, show_default=True,
                     help="Judge runtime state in containerd's root (and --orphan-root) whose init is "
                          "dead, with no containerd bundle and no live shim: an orphan (sweep re-runs "
                          "the runtime's delete --force, audit reports it). --no-orphans: any runtime "
                          "state keeps its container."),
        click.option("--min-age", default=DEFAULT_MIN_AGE, show_default=True,
                     type=click.FloatRange(min=0), metavar="SECONDS",
                     help="Keep cgroups and runtime state younger than this (a container being "
                          "created has its cgroup before its runtime state)."),
    ]
    wrapped: Any = command
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped  # type: ignore[no-any-return]


def runtime_dirs(
    settings: Settings, where: Where, redrive_timeout: float = DEFAULT_REDRIVE_TIMEOUT
) -> RuntimeDirs:
    """Where runtime state and bundles live, and (``orphans``) how orphaned state is judged and re-driven."""
    plain = RuntimeDirs(where.runtime_root, where.bundle_root, tuple(where.state_roots))
    if not where.orphans:
        return plain
    judge = Orphans(
        roots=(where.runtime_root,),
        named_roots=tuple(where.orphan_roots),
        has_bundle=plain.has_bundle,
        configured_runtime=settings.runtime,
        mounts=cgroup_mounts,
        shims=live_shim_ids(),
        timeout=redrive_timeout,
    )
    return RuntimeDirs(where.runtime_root, where.bundle_root, tuple(where.state_roots), judge)


def require_host_pid_namespace(command: str, proc: str = "/proc") -> None:
    """Refuse (ForeignPidNamespace, exit 77) unless this process sees the runtime's PID namespace.

    Every liveness judgement and every cgroup v1 ``cgroup.procs`` read is wrong
    from another PID namespace (node/pidns.py). The refusal is logged to the
    journal too: a sweeper that never runs must not stay silent.
    """
    from runc_guard.journal import send_minimal
    from runc_guard.node.pidns import ForeignPidNamespace, pid_namespace_view, refusal

    view = pid_namespace_view(proc)
    if view.trusted:
        return
    message = refusal(command, view)
    send_minimal(os.environ, f"{command}_refused", message, 3)  # LOG_ERR
    raise ForeignPidNamespace(message)


def scan(settings: Settings, where: Where, fs: RealCgroupFs, runtime: RuntimeDirs) -> Discovery:
    """Find every container unit below the kubepods trees, the shim's pending records and orphaned state."""
    states = None
    if runtime.orphans is not None:
        states = (runtime.orphans.scan(), time.time(), where.min_age)
    mounts = cgroup_mounts()
    return discover(where.cgroup_root, where.kubepods, settings.pending_dir, fs, mounts, states, settings)
