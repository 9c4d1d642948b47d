"""Compute the containerd config change that puts runc-guard in front of runc handlers.

Pure: texts in, texts out (``runc_guard.node.configure`` reads, backs up
and writes). tomlkit edits in place, so comments, ``SystemdCgroup``, other
runtimes and the file's own indentation survive; only the binary slot changes
(plus a whole handler table when one has to be created).

Which handlers: by default every handler the CRI plugin will have that runs a
runc-compatible binary -- the runc shims (``io.containerd.runc.v1/v2``, slot
``options.BinaryName``) and the legacy v1 runtime (``io.containerd.runtime.v1.linux``,
slot ``runtime_engine`` or ``options.Runtime``) -- whatever binary they run today,
plus ``runc`` itself (created if missing). ``requested`` narrows that to a list.
Every other handler (kata, gVisor, wasm shims) is listed with the reason it was
left alone.

Where a handler lives depends on containerd's config version:

- version 2 (containerd 1.6/1.7): plugin ``io.containerd.grpc.v1.cri``, handlers
  under ``containerd.runtimes``; version 1 (no ``version`` key): plugin ``cri``.
  containerd 1.x merges ``imports`` one *plugin* at a time: an imported file that
  mentions the CRI plugin replaces the main file's CRI section whole (verified
  with ``containerd config dump`` on 1.6.20). So the file to edit is the last one,
  in merge order, that defines the CRI plugin. A file that defines
  ``containerd.runtimes`` replaces containerd's built-in ``runc`` handler; one
  that does not keeps it. The deprecated ``default_runtime`` and
  ``untrusted_workload_runtime`` tables become the handlers ``default`` and
  ``untrusted`` when they have a ``runtime_type`` (containerd 1.6's CRI
  ``ValidatePluginConfig``), and ``default`` is then what a pod without a
  RuntimeClass runs.
- version 3 and later (containerd 2.x): plugin ``io.containerd.cri.v1.runtime``,
  same ``containerd.runtimes`` layout; imports merge deeply (a handler lives in
  the last file that defines it) and the built-in ``runc`` handler is always
  there (``config dump`` on 2.2.2 and 2.3.4). The legacy tables are ignored.

A handler whose binary already names another runc-compatible runtime (e.g.
``nvidia-container-runtime``) keeps that runtime: containerd runs runc-guard
through a per-handler name (``runc-guard-<handler>``, a symlink to runc-guard
next to it) and runc-guard's ``[runtimes]`` table maps that name to the old
binary (``Settings.runtime_for``). The chain becomes
shim -> runc-guard -> nvidia-container-runtime -> runc.

A handler configure creates copies the table of the default runc-shim handler
(``default_runtime_name``, else ``runc``): its ``SystemdCgroup`` above all, so a
pod that selects it keeps the node's cgroup driver.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError

from runc_guard.errors import ContainerdConfigError

#: The CRI plugin's id per config version (3 and later share the 2.x name).
CRI_PLUGIN = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
#: Shims that run a runc-compatible binary named by ``options.BinaryName``.
RUNC_SHIM_TYPES = ("io.containerd.runc.v2", "io.containerd.runc.v1")
#: containerd 1.x's v1 runtime: ``containerd-shim`` runs ``runtime_engine`` (or
#: ``options.Runtime``; empty: the ``linux`` plugin's ``runtime``, default runc).
LEGACY_V1 = "io.containerd.runtime.v1.linux"
FRONTABLE_TYPES = (*RUNC_SHIM_TYPES, LEGACY_V1)
NEW_HANDLER_TYPE = "io.containerd.runc.v2"
DEFAULT_HANDLERS = ("runc",)
#: Deprecated CRI tables and the handler containerd 1.x's CRI makes of each.
LEGACY_TABLES = {"default_runtime": "default", "untrusted_workload_runtime": "untrusted"}
#: The v1 runtime plugin whose ``runtime`` is the fallback binary, per config version.
LINUX_PLUGIN = {1: "linux", 2: "io.containerd.runtime.v1.linux"}
#: Per-handler invocation names: ``runc-guard-nvidia`` fronts handler ``nvidia``.
LINK_PREFIX = "runc-guard-"
BINARY_SLOT = ("options", "BinaryName")
#: Handler keys a created handler does not copy: they name another binary or v1 state.
_NOT_INHERITED = ("runtime_path", "runtime_engine", "runtime_root")
_HANDLER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


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
    binary_name: str  # the value in its binary slot ("": the fallback runs)
    table: tuple[str, ...] = ()  # keys of its table in ``file`` (() for a built-in)
    slot: tuple[str, ...] = BINARY_SLOT  # keys below ``table`` holding the binary
    legacy: str = ""  # "default_runtime"/"untrusted_workload_runtime" for a derived handler
    fallback: str = "runc"  # what the shim runs when the slot is empty
    builtin: bool = False  # containerd's own default, not written in any file

    @property
    def frontable(self) -> bool:
        return self.runtime_type in FRONTABLE_TYPES

    @property
    def runs(self) -> str:
        """The binary containerd's shim starts for this handler."""
        return self.binary_name or self.fallback


@dataclass(frozen=True)
class Fronting:
    """What configure does (or found done) for one handler."""

    handler: str
    file: str
    previous: str  # the binary slot before ("": the shim runs its fallback, runc)
    binary_name: str  # the slot after
    runtime: str  # what runc-guard runs for it ("": its default ``runtime`` setting)
    created: bool
    slot: tuple[str, ...] = BINARY_SLOT
    legacy: str = ""

    @property
    def changed(self) -> bool:
        return self.created or self.previous != self.binary_name

    @property
    def link(self) -> str | None:
        """Basename of the per-handler symlink this fronting needs, if any."""
        name = os.path.basename(self.binary_name)
        return name if name.startswith(LINK_PREFIX) else None


@dataclass(frozen=True)
class LeftAlone:
    """A handler configure does not front, and why (shown to the operator)."""

    handler: str
    runtime_type: str
    reason: str


@dataclass(frozen=True)
class Plan:
    """The whole change: new texts per file, handlers fronted and left, runtime mappings."""

    version: int
    edits: Mapping[str, tuple[str | None, str]]
    fronted: tuple[Fronting, ...]
    mappings: Mapping[str, str] = field(default_factory=dict)
    left: tuple[LeftAlone, ...] = ()
    default_handler: str = "runc"  # what a pod without a RuntimeClass runs
    notes: tuple[str, ...] = ()

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


def _containerd_keys(version: int) -> tuple[str, ...]:
    return ("plugins", plugin_name(version), "containerd")


def _runtimes_keys(version: int) -> tuple[str, ...]:
    return (*_containerd_keys(version), "runtimes")


def _slot_of(runtime_type: str, body: Mapping[str, Any]) -> tuple[str, ...]:
    """Where a handler names its binary: v1 runtime: options.Runtime or runtime_engine."""
    if runtime_type == LEGACY_V1:
        return ("options", "Runtime") if isinstance(body.get("options"), Mapping) else ("runtime_engine",)
    return BINARY_SLOT


def _linux_runtime(doc: Mapping[str, Any], version: int) -> str:
    """The v1 runtime plugin's ``runtime`` (what an empty ``runtime_engine`` runs)."""
    value = _plain(_get_path(doc, ("plugins", LINUX_PLUGIN.get(version, LINUX_PLUGIN[2]), "runtime")))
    return str(value) if isinstance(value, str) and value else "runc"


def _handler(
    name: str, body: Any, path: str, table: tuple[str, ...], version: int, doc: Mapping[str, Any],
    legacy: str = "",
) -> Handler:
    if not isinstance(body, Mapping):
        raise ContainerdConfigError(f"{path}: runtime handler {name!r} must be a table")
    runtime_type = str(_plain(body.get("runtime_type", "")) or "")
    slot = _slot_of(runtime_type, body)
    value = _plain(_get_path(body, slot))
    fallback = _linux_runtime(doc, version) if runtime_type == LEGACY_V1 else "runc"
    return Handler(name, path, runtime_type, str(value or ""), table, slot, legacy, fallback)


def file_handlers(doc: Mapping[str, Any], version: int, path: str) -> dict[str, Handler]:
    """Handlers defined in one file's ``containerd.runtimes`` (not the legacy tables)."""
    runtimes = _get_path(doc, _runtimes_keys(version))
    if runtimes is None:
        return {}
    if not isinstance(runtimes, Mapping):
        raise ContainerdConfigError(f"{path}: containerd.runtimes must be a table")
    keys = _runtimes_keys(version)
    return {
        str(name): _handler(str(name), body, path, (*keys, str(name)), version, doc)
        for name, body in runtimes.items()
    }


def legacy_handlers(doc: Mapping[str, Any], version: int, path: str) -> dict[str, Handler]:
    """The handlers containerd 1.x's CRI derives from ``default_runtime`` and friends."""
    if version >= 3:
        return {}
    found = {}
    for key, name in LEGACY_TABLES.items():
        table = (*_containerd_keys(version), key)
        body = _get_path(doc, table)
        if isinstance(body, Mapping) and _plain(body.get("runtime_type")):
            found[name] = _handler(name, body, path, table, version, doc, legacy=key)
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


def _ensure(container: Any, key: str, super_table: bool) -> Any:
    if key not in container:
        _add_table(container, key, tomlkit.table(super_table))
    node = container[key]
    if not isinstance(node, Mapping):
        raise ContainerdConfigError(f"{key} is a {type(_plain(node)).__name__}, expected a table")
    return node


def _trailing_trivia(container: Any) -> list[tuple[Any, Any]]:
    """Pop the comments and blank lines at the end of a table's body.

    tomlkit keeps a comment written above the *next* table as the tail of this
    one; a sub-table appended after it would separate the comment from the
    table it describes (kind's config has exactly that shape).
    """
    body = getattr(getattr(container, "value", container), "body", None)
    if not isinstance(body, list):
        return []
    tail: list[tuple[Any, Any]] = []
    while body and body[-1][0] is None and type(body[-1][1]).__name__ in ("Comment", "Whitespace"):
        tail.insert(0, body.pop())
    return tail


def _put(container: Any, key: str, value: Any) -> None:
    """``container[key] = value``, a new key going above the table's trailing comments."""
    if key in container or not isinstance(container, tomlkit.items.Table):
        container[key] = value
        return
    tail = _trailing_trivia(container)
    siblings = [item for k, item in container.value.body
                if k is not None and not isinstance(item, (tomlkit.items.Table, tomlkit.items.AoT))]
    container[key] = value
    added = container.value.item(key)
    if siblings and isinstance(added, tomlkit.items.Item) and not isinstance(added, tomlkit.items.Table):
        added.trivia.indent = siblings[-1].trivia.indent  # the file's own indentation
    container.value.body.extend(tail)


def _add_table(container: Any, key: str, table: Any) -> None:
    _put(container, key, table)


def _set_slot(
    doc: tomlkit.TOMLDocument, handler_keys: Sequence[str], slot: Sequence[str], value: str,
    template: Mapping[str, Any] | None,
) -> None:
    """Set ``handler.<slot>`` = value; a missing handler is created from ``template``."""
    node: Any = doc
    for key in handler_keys[:-1]:
        node = _ensure(node, key, super_table=True)
    name = handler_keys[-1]
    creating = name not in node and template is not None
    body = _ensure(node, name, super_table=False)
    if creating:
        inherited = dict(template or {})
        inherited.setdefault("runtime_type", NEW_HANDLER_TYPE)
        options = inherited.pop("options", None)
        for key, item in inherited.items():
            _put(body, key, item)
        if isinstance(options, Mapping):
            table = tomlkit.table()
            for key, item in options.items():
                table[key] = item
            _add_table(body, "options", table)
    for key in slot[:-1]:
        body = _ensure(body, key, super_table=False)
    _put(body, slot[-1], value)


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


@dataclass(frozen=True)
class Effective:
    """What containerd's CRI ends up with: handlers, the default, the file new handlers go to."""

    handlers: dict[str, Handler]
    default: str
    home: str  # path of the file a created handler is written to


def _default_name(doc: Mapping[str, Any], version: int) -> str | None:
    value = _plain(_get_path(doc, (*_containerd_keys(version), "default_runtime_name")))
    return str(value) if isinstance(value, str) and value else None


def _effective(loaded: Sequence[_Loaded]) -> Effective:
    version = loaded[0].version
    defining = [item for item in loaded if defines_cri(item.doc, item.version)]
    home = defining[-1] if defining else loaded[0]
    if version < 3:  # 1.x: the last file naming the CRI plugin replaces the others' section
        handlers = file_handlers(home.doc, home.version, home.file.path)
        if _get_path(home.doc, _runtimes_keys(home.version)) is None:
            handlers["runc"] = Handler(
                "runc", home.file.path, NEW_HANDLER_TYPE, "",
                (*_runtimes_keys(home.version), "runc"), builtin=True,
            )
        default = _default_name(home.doc, home.version) or "runc"
        legacy = legacy_handlers(home.doc, home.version, home.file.path)
        handlers.update(legacy)
        if "default" in legacy:
            default = "default"
        return Effective(handlers, default, home.file.path)
    merged: dict[str, Handler] = {
        "runc": Handler("runc", home.file.path, NEW_HANDLER_TYPE, "",
                        (*_runtimes_keys(version), "runc"), builtin=True),
    }
    default = "runc"
    for item in loaded:  # 2.x: deep merge, later files win per key
        default = _default_name(item.doc, item.version) or default
        runtimes = _get_path(item.doc, _runtimes_keys(item.version))
        for name, h in file_handlers(item.doc, item.version, item.file.path).items():
            body = runtimes[name]
            old = merged.get(name)
            has_slot = _get_path(body, h.slot) is not None
            merged[name] = Handler(
                name, h.file, h.runtime_type or (old.runtime_type if old else ""),
                h.binary_name if has_slot or old is None else old.binary_name,
                h.table, h.slot,
            )
    return Effective(merged, default, home.file.path)


def effective_handlers(
    files: Sequence[ConfigFile], default_version: int = 2
) -> tuple[dict[str, Handler], str]:
    """Handlers containerd's CRI will have for this config set, and the default handler."""
    eff = _effective(_load(files, default_version))
    return eff.handlers, eff.default


def _handler_body(loaded: Sequence[_Loaded], h: Handler) -> dict[str, Any]:
    """A handler's table as plain data (merged over files for version 3)."""
    out: dict[str, Any] = {}
    for item in loaded:
        body = _plain(_get_path(item.doc, h.table)) if h.table else None
        if isinstance(body, dict) and (item.version >= 3 or item.file.path == h.file):
            for key, value in body.items():
                if key == "options" and isinstance(value, dict):
                    out.setdefault("options", {}).update(value)
                else:
                    out[key] = value
    return out


def inherited_template(loaded: Sequence[_Loaded], eff: Effective) -> dict[str, Any]:
    """What a created handler copies: the default runc-shim handler's table, minus its binary."""
    candidates = [eff.handlers.get(eff.default), eff.handlers.get("runc")]
    candidates += [h for _, h in sorted(eff.handlers.items()) if h.runtime_type in RUNC_SHIM_TYPES]
    for h in candidates:
        if h is None or h.runtime_type not in RUNC_SHIM_TYPES or h.builtin or not h.table:
            continue
        body = copy.deepcopy(_handler_body(loaded, h))
        for key in _NOT_INHERITED:
            body.pop(key, None)
        options = body.get("options")
        if isinstance(options, dict):
            options.pop("BinaryName", None)
            if not options:
                del body["options"]
        body["runtime_type"] = h.runtime_type
        return body
    return {}


def default_selection(handlers: Mapping[str, Handler], binary: str) -> list[str]:
    """``runc`` plus every handler that runs a runc-compatible binary, whatever it is."""
    chosen = list(DEFAULT_HANDLERS)
    for name, h in sorted(handlers.items()):
        if name not in chosen and h.frontable:
            chosen.append(name)
    return chosen


def why_left(h: Handler) -> str:
    if not h.runtime_type:
        return "no runtime_type: containerd cannot start it as it stands"
    return f"runtime_type {h.runtime_type} is not the runc shim: it has no runc binary to front"


def front_one(
    name: str, h: Handler | None, binary: str, known: Mapping[str, str], mappings: dict[str, str]
) -> Fronting:
    """What fronting one handler means: its new binary and what runc-guard runs behind it."""
    if h is not None and not h.frontable:
        raise ContainerdConfigError(
            f"handler {name!r} uses runtime_type {h.runtime_type!r}, not the runc shim: "
            "it has no BinaryName for runc-guard to take"
        )
    previous = h.binary_name if h else ""
    fallback = h.fallback if h else "runc"
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
        runtime = previous or ("" if fallback == "runc" else fallback)
    if runtime:
        link = link_name(name)
        target = os.path.join(os.path.dirname(binary), link)
        mappings[link] = runtime
    else:
        target = binary
    return Fronting(name, h.file if h else "", previous, target, runtime,
                    created=h is None or h.builtin, slot=h.slot if h else BINARY_SLOT,
                    legacy=h.legacy if h else "")


def plan_fronting(
    files: Sequence[ConfigFile],
    binary: str,
    requested: Sequence[str] | None = None,
    default_version: int = 2,
    mappings: Mapping[str, str] | None = None,
    overlay: str | None = None,
    readonly: Sequence[str] = (),
) -> Plan:
    """The change that fronts ``requested`` handlers (default: see ``default_selection``).

    ``files`` is the main config followed by its imports in containerd's merge
    order. ``mappings`` is runc-guard's current ``[runtimes]`` table: it tells
    which runtime an existing per-handler link already fronts, so re-running is
    a no-op rather than a loss of the nvidia chain. ``overlay`` (version 3
    only, a path in ``files``) receives every change as a partial table instead
    of editing the file that defines the handler: for a file another program
    regenerates (``readonly``), deep merge makes that the only durable place.
    """
    if not binary.startswith("/"):
        raise ContainerdConfigError(f"--binary must be an absolute path, got {binary!r}")
    known = dict(mappings or {})
    loaded = _load(files, default_version)
    version = loaded[0].version
    eff = _effective(loaded)
    handlers = eff.handlers
    names = list(dict.fromkeys(requested)) if requested else default_selection(handlers, binary)
    by_path = {item.file.path: item for item in loaded}
    if overlay is not None and (overlay not in by_path or version < 3):
        raise ContainerdConfigError(f"{overlay}: an overlay needs a version 3 config importing it")
    template = inherited_template(loaded, eff)
    fronted: list[Fronting] = []
    new_mappings: dict[str, str] = {}
    touched: set[str] = set()
    for name in names:
        fronting = front_one(name, handlers.get(name), binary, known, new_mappings)
        h = handlers.get(name)
        item = by_path[overlay or (h.file if h is not None and h.file in by_path else eff.home)]
        if item.file.path in readonly:
            raise ContainerdConfigError(f"{item.file.path} is regenerated by another program")
        fronting = dataclasses.replace(fronting, file=item.file.path)
        fronted.append(fronting)
        if not fronting.changed:
            continue
        if item.blank and item.file.path not in touched:
            if (item.file.text or "").strip():
                item.doc["version"] = version  # comment-only: keep the comments
            else:
                item.doc = _new_document(version)
        # A handler that exists (in a file, or containerd's built-in runc) keeps what it
        # has: an overlay only needs the slot (deep merge), a built-in only its type.
        # Only a handler containerd does not have at all copies the default's table.
        use = template if h is None else (None if overlay is not None and not h.builtin else {})
        table = h.table if h and h.table else (*_runtimes_keys(item.version), name)
        _set_slot(item.doc, table, fronting.slot, fronting.binary_name, use)
        touched.add(item.file.path)
    edits = {}
    for item in loaded:
        if item.file.path in touched:
            after = item.doc.as_string()
            if after != (item.file.text or ""):
                edits[item.file.path] = (item.file.text, after)
    left = tuple(
        LeftAlone(name, h.runtime_type, why_left(h) if not h.frontable else "not asked for (--runtime)")
        for name, h in sorted(handlers.items()) if name not in names
    )
    notes: tuple[str, ...] = ()
    if version == 1 and any(h.legacy for h in handlers.values()):
        notes = ("a version 1 file: containerd 2.x ignores its legacy default_runtime (2.2 its "
                 "whole containerd table); on containerd 2 run `containerd config migrate` first",)
    plan = Plan(version, edits, tuple(fronted), new_mappings, left, eff.default, notes)
    _check(files, plan, default_version)
    return plan


def _check(files: Sequence[ConfigFile], plan: Plan, default_version: int) -> None:
    """Re-read the result as containerd would: every fronted handler must name its target."""
    after = [ConfigFile(f.path, plan.edits[f.path][1] if f.path in plan.edits else f.text)
             for f in files]
    handlers = _effective(_load(after, default_version)).handlers
    lost = [f.handler for f in plan.fronted
            if handlers.get(f.handler) is None or handlers[f.handler].binary_name != f.binary_name]
    if lost:
        raise ContainerdConfigError(
            "after the change containerd would still not run runc-guard for handler(s) "
            + ", ".join(lost) + ": a file later in the imports order overrides them"
        )


def with_runtime_mappings(text: str | None, mappings: Mapping[str, str], source: str) -> str:
    """runc-guard's settings text with ``[runtimes]`` entries added/updated (comments kept)."""
    doc = parse(text or "", source)
    if not mappings:
        return doc.as_string()
    if "runtimes" not in doc:
        if len(doc.body):  # a new file must not start with a blank line
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
