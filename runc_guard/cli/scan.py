"""What sweep, audit and metrics look at: their shared options, as one ``Where`` (node.host)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from runc_guard.node.discovery import DEFAULT_KUBEPODS, check_kubepods_name
from runc_guard.node.host import Where
from runc_guard.node.orphans import DEFAULT_FLAT_ROOTS
from runc_guard.node.sweep import DEFAULT_BUNDLE_ROOT, DEFAULT_MIN_AGE, DEFAULT_RUNTIME_ROOT

F = TypeVar("F", bound=Callable[..., Any])


def _kubepods(_ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return tuple(check_kubepods_name(v) for v in value) or DEFAULT_KUBEPODS
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


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


