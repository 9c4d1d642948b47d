"""Who owns a runtime state: containerd, another manager, or nobody we can tell? (pure)

runc's default root ``/run/runc`` and crun's ``/run/crun`` are shared: podman,
CRI-O and plain ``runc run`` keep their state there, and a stopped container
of theirs (init exited, no containerd bundle, no containerd shim) looks exactly
like a containerd orphan. Only the location proves containerd's ownership:
its shim always passes ``--root <runc root>/<namespace>``. So the sweep
judges containerd's namespaced root by default; another root only when the
operator names it, and even there a state that shows another manager is
never touched, nor one whose owner cannot be told from it.

The signs are what runc keeps in ``state.json`` (``config.labels``: every OCI
annotation as ``key=value`` and ``bundle=<dir>``) and crun in the
``config.json`` beside its status (``delete/state.py`` reads both).
"""

from __future__ import annotations

from collections.abc import Mapping

#: Owners: containerd (by location or its own marks), a named root's unmarked state, or unknown.
CONTAINERD = "containerd"
NAMED = "named_root"
UNKNOWN = "unknown"
#: Prefix of another manager's owner value, e.g. ``foreign:podman``.
FOREIGN = "foreign:"

#: podman and CRI-O both set it (``libpod``, ``cri-o``); containerd does not.
_MANAGER_ANNOTATION = "io.container.manager"
#: Annotation key prefixes that only another manager writes.
_FOREIGN_KEYS = (
    ("io.kubernetes.cri-o.", "cri-o"),
    ("io.podman.", "podman"),
    ("io.containers.", "podman"),
)
#: Bundle directories of containers/storage (podman, CRI-O, buildah):
#: ``.../overlay-containers/<id>/userdata``.
_FOREIGN_BUNDLES = (
    ("/var/lib/containers/", "containers-storage"),
    ("/run/containers/", "containers-storage"),
    ("/var/run/containers/", "containers-storage"),
    ("/overlay-containers/", "containers-storage"),
    ("/run/libpod/", "podman"),
)
#: containerd's task bundles (v2 shims; v1's linux runtime) and its CRI's annotations.
_CONTAINERD_BUNDLES = ("/io.containerd.runtime.v2.task/", "/io.containerd.runtime.v1.linux/")
_CONTAINERD_KEYS = ("io.kubernetes.cri.",)


def foreign_manager(labels: Mapping[str, str]) -> str | None:
    """The other manager a state's labels name, or None when they name none."""
    manager = labels.get(_MANAGER_ANNOTATION)
    if manager:
        return "podman" if manager == "libpod" else manager
    for key in labels:
        for prefix, who in _FOREIGN_KEYS:
            if key.startswith(prefix):
                return who
    bundle = labels.get("bundle", "")
    for part, who in _FOREIGN_BUNDLES:
        if part in bundle:
            return who
    return None


def containerd_marked(labels: Mapping[str, str]) -> bool:
    """The state's bundle is a containerd task bundle, or containerd's CRI annotated it."""
    bundle = labels.get("bundle", "")
    return any(part in bundle for part in _CONTAINERD_BUNDLES) or any(
        key.startswith(_CONTAINERD_KEYS) for key in labels
    )


def owner_of(labels: Mapping[str, str] | None, in_containerd_root: bool) -> str:
    """``containerd``, ``named_root``, ``foreign:<manager>`` or ``unknown``.

    ``labels`` None: the state could not be parsed (nothing to tell from).
    In containerd's root the location is the proof, unless the state names
    another manager. In a root the operator named, a state with neither a
    bundle nor any annotation tells nothing (``unknown``); one with them and no
    other manager's sign is the operator's to finish (``named_root``).
    """
    if labels is None:
        return UNKNOWN
    other = foreign_manager(labels)
    if other is not None:
        return FOREIGN + other
    if in_containerd_root or containerd_marked(labels):
        return CONTAINERD
    return NAMED if labels else UNKNOWN


def untouchable(owner: str) -> bool:
    """Whether the sweep must leave the state alone whatever its init does."""
    return owner == UNKNOWN or owner.startswith(FOREIGN)
