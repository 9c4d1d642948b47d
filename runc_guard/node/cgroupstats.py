"""The kernel's own cgroup counters, read cheaply, as gauges none of the runtimes or kubelet export.

In the incident the first visible symptom was sys% above 30% after 8147
container cgroups had piled up in each of 12 hierarchies; nothing counted
them. The kernel does, for free:

- ``/proc/cgroups``: ``num_cgroups`` per controller (one small read, no walk;
  controllers bound to cgroup2 report hierarchy 0 and count the v2 tree);
- ``cgroup.stat`` (cgroup2 only, also the hybrid ``unified`` tree):
  ``nr_descendants`` and ``nr_dying_descendants`` of any cgroup, its whole
  subtree included. Dying cgroups are removed ones the kernel still holds
  (typically memcgs pinned by page cache); climbing numbers cost memory and
  make every walk slower.

Under kubepods, cgroup v1 has no ``cgroup.stat``: there the subtree is
counted by walking it, opening only directories whose link count says they
have subdirectories (bounded by ``MAX_WALK``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runc_guard.node.metrics import Family

PROC_CGROUPS = "/proc/cgroups"
#: A v1 kubepods walk stops here: the incident's 8147 x 1 per hierarchy is well inside.
MAX_WALK = 1_000_000


@dataclass(frozen=True)
class ControllerCount:
    """One line of ``/proc/cgroups``."""

    controller: str
    hierarchy_id: int
    num_cgroups: int
    enabled: bool


def parse_proc_cgroups(text: str) -> list[ControllerCount]:
    """``#subsys_name hierarchy num_cgroups enabled`` lines; malformed lines are skipped."""
    found: list[ControllerCount] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or len(fields) < 4:
            continue
        try:
            found.append(ControllerCount(fields[0], int(fields[1]), int(fields[2]), fields[3] == "1"))
        except ValueError:
            continue
    return found


def parse_cgroup_stat(text: str) -> dict[str, int]:
    """``key value`` lines of a cgroup2 ``cgroup.stat``."""
    stat: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            stat[key] = int(value)
    return stat


@dataclass(frozen=True)
class TreeCount:
    """Cgroups in one hierarchy's subtree: ``scope`` is ``root`` or the kubepods name."""

    hierarchy: str
    scope: str
    #: Live descendants (not counting the subtree's top itself); None when unknown.
    cgroups: int | None
    #: Dying descendants (cgroup2 only); None on cgroup v1.
    dying: int | None


@dataclass(frozen=True)
class KernelFacts:
    controllers: tuple[ControllerCount, ...]
    trees: tuple[TreeCount, ...]


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def count_descendants(top: str, limit: int = MAX_WALK) -> int:
    """Cgroup directories below ``top`` (a v1 hierarchy has no cgroup.stat); stops at ``limit``.

    kernfs keeps a directory's link count at 2 + its subdirectories, so a child
    with ``st_nlink == 2`` is a leaf and is never opened: one lstat instead of
    listing its ~30 control files (the incident's 8147 leaves per hierarchy).
    A link count of 1 (filesystems that do not count) means "look inside".
    """
    count = 0
    stack = [top]
    while stack and count < limit:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    count += 1
                    try:
                        links = entry.stat(follow_symlinks=False).st_nlink
                    except FileNotFoundError:
                        continue
                    if links != 2:
                        stack.append(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            continue
    return count


def read_tree(hierarchy: str, fstype: str, relative: str, scope: str) -> TreeCount | None:
    """One subtree's counts: cgroup.stat on cgroup2, a directory walk on v1; None when absent."""
    top = os.path.join(hierarchy, relative) if relative else hierarchy
    if os.path.islink(top) or not os.path.isdir(top):
        return None
    if fstype == "cgroup2":
        text = _read_text(os.path.join(top, "cgroup.stat"))
        if text is not None:
            stat = parse_cgroup_stat(text)
            return TreeCount(hierarchy, scope, stat.get("nr_descendants"), stat.get("nr_dying_descendants"))
    if not relative:
        return None  # a v1 root: /proc/cgroups already has its number, no walk
    return TreeCount(hierarchy, scope, count_descendants(top), None)


def read_kernel(
    mounts: Mapping[str, str], kubepods: Iterable[str], proc_cgroups: str = PROC_CGROUPS
) -> KernelFacts:
    """/proc/cgroups, plus every hierarchy's root (cgroup2) and kubepods trees."""
    text = _read_text(proc_cgroups)
    controllers = tuple(parse_proc_cgroups(text)) if text is not None else ()
    trees: list[TreeCount] = []
    names = list(kubepods)
    for mount, fstype in sorted(mounts.items()):
        for relative, scope in (("", "root"), *((n, n) for n in names)):
            tree = read_tree(mount, fstype, relative, scope)
            if tree is not None:
                trees.append(tree)
    return KernelFacts(controllers, tuple(trees))


def families(facts: KernelFacts) -> list[Family]:
    """The kernel's counters as gauge families."""
    enabled = [c for c in facts.controllers if c.enabled]
    out = [
        Family(
            "runc_guard_kernel_cgroups",
            "Cgroups per controller from /proc/cgroups num_cgroups (hierarchy_id 0: the cgroup2 tree).",
            tuple(
                ((("controller", c.controller), ("hierarchy_id", str(c.hierarchy_id))), float(c.num_cgroups))
                for c in enabled
            ),
        )
    ]
    kube = [t for t in facts.trees if t.scope != "root" and t.cgroups is not None]
    out.append(
        Family(
            "runc_guard_kubepods_cgroups",
            "Cgroups below the kubepods tree, per hierarchy (cgroup.stat on cgroup2, a walk on v1).",
            tuple(((("hierarchy", t.hierarchy), ("kubepods", t.scope)), float(t.cgroups or 0)) for t in kube),
        )
    )
    v2 = [t for t in facts.trees if t.dying is not None]
    out.append(
        Family(
            "runc_guard_dying_cgroups",
            "Removed cgroups the kernel still holds (cgroup.stat nr_dying_descendants), root and kubepods.",
            tuple(((("hierarchy", t.hierarchy), ("scope", t.scope)), float(t.dying or 0)) for t in v2),
        )
    )
    live = [t for t in facts.trees if t.dying is not None and t.cgroups is not None]
    out.append(
        Family(
            "runc_guard_cgroup2_descendants",
            "Live cgroups below a cgroup2 root or kubepods tree (cgroup.stat nr_descendants).",
            tuple(((("hierarchy", t.hierarchy), ("scope", t.scope)), float(t.cgroups or 0)) for t in live),
        )
    )
    return [f for f in out if f.samples]
