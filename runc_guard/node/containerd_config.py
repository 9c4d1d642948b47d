"""Compute the containerd config change that puts runc-guard in front of runc handlers.

Pure: texts in, texts out (the CLI in ``runc_guard.cli.configure`` reads, backs up
and writes). tomlkit edits in place, so comments, ``SystemdCgroup``, other
runtimes and the file's own indentation survive; only ``options.BinaryName``
changes (plus ``runtime_type`` and ``version`` when a handler or the whole file
has to be created).

Where a handler lives depends on containerd's config version:

- version 2 (containerd 1.6/1.7): plugin ``io.containerd.grpc.v1.cri``, handlers
  under ``containerd.runtimes``; version 1 (no ``version`` key): plugin ``cri``.
  containerd 1.x merges ``imports`` one *plugin* at a time: an imported file that
  mentions the CRI plugin replaces the main file's CRI section whole (verified
  with ``containerd config dump`` on 1.6.20). So the file to edit is the last one,
  in merge order, that defines the CRI plugin.
- version 3 (containerd 2.x): plugin ``io.containerd.cri.v1.runtime``, same
  ``containerd.runtimes`` layout, and imports merge deeply: a handler lives in
  the last file that defines it.

A handler whose BinaryName already names another runc-compatible runtime (e.g.
``nvidia-container-runtime``) keeps that runtime: containerd runs runc-guard
through a per-handler name (``runc-guard-<handler>``, a symlink to runc-guard
next to it) and runc-guard's ``[runtimes]`` table maps that name to the old
BinaryName (``Settings.runtime_for``). The chain becomes
shim -> runc-guard -> nvidia-container-runtime -> runc.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from runc_guard.errors import ConfigError

#: The CRI plugin's id per config version (3 and later share the 2.x name).
CRI_PLUGIN = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
#: Shims that run a runc-compatible binary named by ``options.BinaryName``.
RUNC_SHIM_TYPES = ("io.containerd.runc.v2", "io.containerd.runc.v1")
NEW_HANDLER_TYPE = "io.containerd.runc.v2"
DEFAULT_HANDLERS = ("runc",)
#: Per-handler invocation names: ``runc-guard-nvidia`` fronts handler ``nvidia``.
LINK_PREFIX = "runc-guard-"
_HANDLER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class ContainerdConfigError(ConfigError):
    """A containerd config runc-guard cannot (or must not) change as asked."""


@dataclass(frozen=True)
class ConfigFile:
    """One file of containerd's config set; ``text`` is None when it does not exist."""

    path: str
    text: str | None


@dataclass(frozen=True)
class Handler:
    """A CRI runtime handler as containerd would see it after merging imports."""

    name: str
    file: str
    runtime_type: str
    binary_name: str


@dataclass(frozen=True)
class Fronting:
    """What configure does (or found done) for one handler."""

    handler: str
    file: str
    previous: str  # BinaryName before ("": the shim runs "runc" from PATH)
    binary_name: str  # BinaryName after
    runtime: str  # what runc-guard runs for it ("": its default ``runtime`` setting)
    created: bool

    @property
    def changed(self) -> bool:
        return self.created or self.previous != self.binary_name

    @property
    def link(self) -> str | None:
        """Basename of the per-handler symlink this fronting needs, if any."""
        name = os.path.basename(self.binary_name)
        return name if name.startswith(LINK_PREFIX) else None


@dataclass(frozen=True)
class Plan:
    """The whole change: new texts per file, handlers fronted, runtime mappings, links."""

    version: int
    edits: Mapping[str, tuple[str | None, str]]
    fronted: tuple[Fronting, ...]
    mappings: Mapping[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.edits)

    @property
    def links(self) -> tuple[str, ...]:
        return tuple(sorted({f.link for f in self.fronted if f.link}))


def parse(text: str, source: str) -> tomlkit.TOMLDocument:
    try:
        return tomlkit.parse(text)
    except TOMLKitError as exc:
        raise ContainerdConfigError(f"{source} is not valid TOML: {exc}") from exc


def is_blank(doc: Mapping[str, Any]) -> bool:
    """True for an empty or comment-only file (containerd then uses its defaults)."""
    return len(doc) == 0


def config_version(doc: Mapping[str, Any], source: str) -> int:
    """containerd's rule: no ``version`` key means version 1."""
    value = doc.get("version", 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ContainerdConfigError(f"{source}: version must be a positive integer, got {value!r}")
    return int(value)


def plugin_name(version: int) -> str:
    return CRI_PLUGIN[min(version, 3)]


def imports(doc: Mapping[str, Any], source: str) -> list[str]:
    """The file's ``imports`` patterns, as written (the caller resolves and globs them)."""
    value = doc.get("imports", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ContainerdConfigError(f"{source}: imports must be a list of paths")
    return [str(v) for v in value]


def _plain(value: Any) -> Any:
    unwrap = getattr(value, "unwrap", None)
    return unwrap() if callable(unwrap) else value


def _get_path(doc: Mapping[str, Any], keys: Sequence[str]) -> Any:
    node: Any = doc
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def _runtimes_keys(version: int) -> tuple[str, ...]:
    return ("plugins", plugin_name(version), "containerd", "runtimes")


def file_handlers(doc: Mapping[str, Any], version: int, path: str) -> dict[str, Handler]:
    """Handlers defined in one file."""
    runtimes = _plain(_get_path(doc, _runtimes_keys(version)))
    if runtimes is None:
        return {}
    if not isinstance(runtimes, dict):
        raise ContainerdConfigError(f"{path}: containerd.runtimes must be a table")
    found = {}
    for name, body in runtimes.items():
        if not isinstance(body, dict):
            raise ContainerdConfigError(f"{path}: runtime handler {name!r} must be a table")
        options = body.get("options") or {}
        binary = options.get("BinaryName", "") if isinstance(options, dict) else ""
        found[name] = Handler(name, path, str(body.get("runtime_type", "")), str(binary or ""))
    return found


def defines_cri(doc: Mapping[str, Any], version: int) -> bool:
    return _get_path(doc, ("plugins", plugin_name(version))) is not None


def is_runc_guard(binary_name: str, binary: str) -> bool:
    """Whether a BinaryName is runc-guard (this install, another path, or a per-handler link)."""
    base = os.path.basename(binary_name)
    return bool(binary_name) and (
        binary_name == binary or base == os.path.basename(binary) or base.startswith(LINK_PREFIX)
    )


def link_name(handler: str) -> str:
    if not _HANDLER_NAME.match(handler):
        raise ContainerdConfigError(
            f"runtime handler name {handler!r} cannot name a file: use letters, digits, . _ -"
        )
    return LINK_PREFIX + handler


def _table(super_table: bool) -> Any:
    return tomlkit.table(super_table)


def _ensure(container: Any, key: str, super_table: bool) -> Any:
    if key not in container:
        container[key] = _table(super_table)
    node = container[key]
    if not isinstance(node, Mapping):
        raise ContainerdConfigError(f"{key} is a {type(_plain(node)).__name__}, expected a table")
    return node


def _set_binary_name(
    doc: tomlkit.TOMLDocument, version: int, handler: str, binary_name: str, create: bool
) -> None:
    node: Any = doc
    for key in _runtimes_keys(version):
        node = _ensure(node, key, super_table=True)
    body = _ensure(node, handler, super_table=False)
    if create and "runtime_type" not in body:
        body["runtime_type"] = NEW_HANDLER_TYPE
    options = _ensure(body, "options", super_table=False)
    options["BinaryName"] = binary_name


def _new_document(version: int) -> tomlkit.TOMLDocument:
    doc = tomlkit.document()
    doc.add(tomlkit.comment("containerd config written by runc-guardctl configure containerd"))
    doc["version"] = version
    return doc


@dataclass
class _Loaded:
    file: ConfigFile
    doc: tomlkit.TOMLDocument
    version: int
    blank: bool


def _load(files: Sequence[ConfigFile], default_version: int) -> list[_Loaded]:
    loaded = []
    main_version = default_version
    for index, f in enumerate(files):
        doc = parse(f.text or "", f.path)
        blank = is_blank(doc)
        inherits = blank or (index > 0 and "version" not in doc)
        version = main_version if inherits else config_version(doc, f.path)
        if index == 0:
            main_version = version
        loaded.append(_Loaded(f, doc, version, blank))
    return loaded


def _effective_handlers(loaded: Sequence[_Loaded]) -> tuple[dict[str, Handler], _Loaded]:
    """Handlers containerd would end up with, and the file a new handler belongs in."""
    version = loaded[0].version
    defining = [item for item in loaded if defines_cri(item.doc, item.version)]
    home = defining[-1] if defining else loaded[0]
    if version < 3:  # 1.x: the last file naming the CRI plugin replaces the others' section
        return file_handlers(home.doc, home.version, home.file.path), home
    merged: dict[str, Handler] = {}
    for item in loaded:  # 2.x: deep merge, later files win per key
        for name, h in file_handlers(item.doc, item.version, item.file.path).items():
            old = merged.get(name)
            merged[name] = Handler(
                name, h.file, h.runtime_type or (old.runtime_type if old else ""),
                h.binary_name or (old.binary_name if old else ""),
            )
    return merged, home


def default_selection(handlers: Mapping[str, Handler], binary: str) -> list[str]:
    """``runc`` plus every runc-shim handler whose BinaryName is another runtime (or us)."""
    chosen = list(DEFAULT_HANDLERS)
    for name, h in sorted(handlers.items()):
        if name in chosen or h.runtime_type not in RUNC_SHIM_TYPES:
            continue
        if h.binary_name:
            chosen.append(name)
    return chosen


def plan_fronting(
    files: Sequence[ConfigFile],
    binary: str,
    requested: Sequence[str] | None = None,
    default_version: int = 2,
    mappings: Mapping[str, str] | None = None,
) -> Plan:
    """The change that fronts ``requested`` handlers (default: see ``default_selection``).

    ``files`` is the main config followed by its imports in containerd's merge
    order. ``mappings`` is runc-guard's current ``[runtimes]`` table: it tells
    which runtime an existing per-handler link already fronts, so re-running is
    a no-op rather than a loss of the nvidia chain.
    """
    if not binary.startswith("/"):
        raise ContainerdConfigError(f"--binary must be an absolute path, got {binary!r}")
    known = dict(mappings or {})
    loaded = _load(files, default_version)
    version = loaded[0].version
    handlers, home = _effective_handlers(loaded)
    names = list(dict.fromkeys(requested)) if requested else default_selection(handlers, binary)
    by_path = {item.file.path: item for item in loaded}
    fronted: list[Fronting] = []
    new_mappings: dict[str, str] = {}
    touched: set[str] = set()
    for name in names:
        h = handlers.get(name)
        if h is not None and h.runtime_type and h.runtime_type not in RUNC_SHIM_TYPES:
            raise ContainerdConfigError(
                f"handler {name!r} uses runtime_type {h.runtime_type!r}, not the runc shim: "
                "it has no BinaryName for runc-guard to take"
            )
        previous = h.binary_name if h else ""
        if previous and is_runc_guard(previous, binary):
            base = os.path.basename(previous)
            if base.startswith(LINK_PREFIX):
                if base not in known:
                    raise ContainerdConfigError(
                        f"handler {name!r} runs {previous} but runc-guard's [runtimes] has no "
                        f"entry {base!r}: cannot tell which runtime it fronted"
                    )
                runtime = known[base]
            else:
                runtime = ""
        else:
            runtime = previous
        if runtime:
            link = link_name(name)
            target = os.path.join(os.path.dirname(binary), link)
            new_mappings[link] = runtime
        else:
            target = binary
        item = by_path[h.file] if h else home
        fronting = Fronting(name, item.file.path, previous, target, runtime, created=h is None)
        fronted.append(fronting)
        if fronting.changed:
            if item.blank and item.file.path not in touched:
                if (item.file.text or "").strip():
                    item.doc["version"] = version  # comment-only: keep the comments
                else:
                    item.doc = _new_document(version)
            _set_binary_name(item.doc, item.version, name, target, create=h is None)
            touched.add(item.file.path)
    edits = {}
    for item in loaded:
        if item.file.path in touched:
            after = item.doc.as_string()
            if after != (item.file.text or ""):
                edits[item.file.path] = (item.file.text, after)
    return Plan(version, edits, tuple(fronted), new_mappings)


def with_runtime_mappings(text: str | None, mappings: Mapping[str, str], source: str) -> str:
    """runc-guard's settings text with ``[runtimes]`` entries added/updated (comments kept)."""
    doc = parse(text or "", source)
    if not mappings:
        return doc.as_string()
    if "runtimes" not in doc:
        doc.add(tomlkit.nl())
        doc.add(tomlkit.comment("Added by runc-guardctl configure containerd: the runtime each"))
        doc.add(tomlkit.comment("per-handler name (a symlink to runc-guard) runs."))
        doc["runtimes"] = tomlkit.table()
    table = doc["runtimes"]
    if not isinstance(table, Mapping):
        raise ContainerdConfigError(f"{source}: runtimes must be a table")
    for name, runtime in sorted(mappings.items()):
        if _plain(table.get(name)) != runtime:
            table[name] = runtime  # type: ignore[index]
    return doc.as_string()


def without_runtime_mappings(text: str, mappings: Mapping[str, str], source: str) -> str:
    """Remove the ``[runtimes]`` entries configure added, if they still hold its values."""
    doc = parse(text, source)
    table = doc.get("runtimes")
    if not isinstance(table, Mapping):
        return doc.as_string()
    for name, runtime in mappings.items():
        if _plain(table.get(name)) == runtime:
            del table[name]  # type: ignore[attr-defined]
    if len(table) == 0:
        del doc["runtimes"]
    return doc.as_string()


def runtime_mappings(text: str | None, source: str) -> dict[str, str]:
    """The ``[runtimes]`` table of runc-guard's settings text."""
    table = _plain(parse(text or "", source).get("runtimes", {}))
    if not isinstance(table, dict):
        raise ContainerdConfigError(f"{source}: runtimes must be a table")
    return {str(k): str(v) for k, v in table.items()}
