"""The file work of ``runc-guardctl configure containerd``: read, back up, write, record, revert.

The change itself is computed purely in ``runc_guard.node.containerd_config``; this
module does the file work around it, carefully, because it edits the one file
a node cannot run pods without:

- before the first write of a file its exact bytes are kept as
  ``<file>.runc-guard-orig`` (or its absence is recorded), and every write is
  preceded by a timestamped ``<file>.runc-guard-<UTC>.bak``;
- writes are atomic (temp file in the same directory, fsync, rename, fsync dir)
  and keep the file's mode and owner;
- what was done is recorded in ``<config>.runc-guard.json`` so ``--revert`` can
  restore every file byte for byte and remove the per-handler links;
- nothing is written when nothing would change, so re-running is a no-op, and
  containerd is restarted only when asked (the CLI's ``--restart``).

A ``Host`` root lets a DaemonSet pod configure the node through a mount of its
root filesystem: paths are host paths, files are reached below that root.
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from runc_guard.atomic import write_atomic
from runc_guard.errors import ContainerdConfigError
from runc_guard.node import k3s
from runc_guard.node.containerd_config import (
    ConfigFile,
    Plan,
    imports,
    parse,
    plan_fronting,
    runtime_mappings,
    with_runtime_mappings,
    without_runtime_mappings,
)

DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DEFAULT_RESTART = "systemctl restart containerd"
STATE_SUFFIX = ".runc-guard.json"
ORIG_SUFFIX = ".runc-guard-orig"
STATE_VERSION = 1


@dataclass(frozen=True)
class Host:
    """Maps host paths to where this process reaches them (``/`` or a DaemonSet's mount)."""

    root: str

    def path(self, host_path: str) -> str:
        return os.path.join(self.root, host_path.lstrip("/")) if self.root != "/" else host_path

    def read(self, host_path: str) -> bytes | None:
        try:
            with open(self.path(host_path), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None


def decode_text(data: bytes | None, path: str) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContainerdConfigError(f"{path} is not UTF-8 text: {exc}") from exc


def _sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _backup(local: str) -> str | None:
    """A timestamped copy of the current file before it is replaced."""
    if not os.path.exists(local):
        return None
    backup = f"{local}.runc-guard-{_stamp()}.bak"
    n = 1
    while os.path.exists(backup):
        n += 1
        backup = f"{local}.runc-guard-{_stamp()}-{n}.bak"
    shutil.copy2(local, backup)
    return backup


def config_set(host: Host, main: str) -> list[ConfigFile]:
    """The main config and its imports (recursively, globbed), in containerd's merge order."""
    seen: set[str] = set()
    out: list[ConfigFile] = []

    def visit(path: str) -> None:
        if path in seen:
            return
        seen.add(path)
        text = decode_text(host.read(path), path)
        out.append(ConfigFile(path, text))
        if text is None:
            return
        for written in imports(parse(text, path), path):
            # containerd's resolveImports: a glob is expanded as written (relative to
            # its cwd, / for the service); a plain relative path is taken against the
            # importing file's directory.
            base = "/" if "*" in written else os.path.dirname(path)
            pattern = os.path.join(base, written)
            matches = sorted(glob.glob(host.path(pattern)))
            for match in matches:
                relative = os.path.relpath(match, host.root) if host.root != "/" else match
                visit(relative if relative.startswith("/") else "/" + relative)

    visit(main)
    return out


def detect_config_version(containerd: str = "containerd") -> int:
    """2 for containerd 1.x, 3 for 2.x (only used for a missing or empty config)."""
    try:
        out = subprocess.run(
            [containerd, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 2
    for word in out.split():
        head = word.lstrip("v").split(".", 1)[0]
        if head.isdigit() and "." in word:
            return 3 if int(head) >= 2 else 2
    return 2


def _state_path(main: str) -> str:
    return main + STATE_SUFFIX


def load_state(host: Host, main: str) -> dict[str, Any] | None:
    data = host.read(_state_path(main))
    if data is None:
        return None
    try:
        state = json.loads(data)
    except ValueError as exc:
        raise ContainerdConfigError(f"{_state_path(main)} is not valid JSON: {exc}") from exc
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ContainerdConfigError(f"{_state_path(main)}: unknown record format")
    return state


def unified_diff(path: str, before: str | None, after: str | None) -> str:
    return "".join(
        difflib.unified_diff(
            (before or "").splitlines(keepends=True), (after or "").splitlines(keepends=True),
            fromfile=f"a{path}" if before is not None else "/dev/null",
            tofile=f"b{path}" if after is not None else "/dev/null",
        )
    )


@dataclass
class Change:
    """Everything a configure run would do, computed before anything is written."""

    plan: Plan
    settings_path: str
    settings_before: str | None
    settings_after: str | None
    links: dict[str, str]  # host path of link -> target it must point to
    generated: k3s.Generated | None = None

    @property
    def settings_changed(self) -> bool:
        return self.settings_after is not None and self.settings_after != self.settings_before

    @property
    def anything(self) -> bool:
        return self.plan.changed or self.settings_changed or bool(self.links)


def compute_change(
    *, host: Host, main: str, binary: str, runtimes: tuple[str, ...], settings_path: str,
    default_version: int,
) -> Change:
    files = config_set(host, main)
    settings_before = decode_text(host.read(settings_path), settings_path)
    known = runtime_mappings(settings_before, settings_path)
    generated = detect_generated(host, main, files[0].text)
    if generated is not None:
        plan = k3s.plan_generated(generated, files, binary, runtimes or None, known)
    else:
        plan = plan_fronting(files, binary, runtimes or None, default_version, known)
    settings_after = (
        with_runtime_mappings(settings_before, plan.mappings, settings_path)
        if plan.mappings else None
    )
    links = {}
    for name in plan.links:
        link = os.path.join(os.path.dirname(binary), name)
        local = host.path(link)
        target = os.path.basename(binary)
        if not (os.path.islink(local) and os.readlink(local) == target):
            links[link] = target
    return Change(plan, settings_path, settings_before, settings_after, links, generated)


def detect_generated(host: Host, main: str, text: str | None) -> k3s.Generated | None:
    """k3s/RKE2's generated config (header, or a template next to it), else None."""
    templates = {}
    for version in (3, 2):
        path = k3s.template_path(main, version)
        templates[path] = decode_text(host.read(path), path)
    return k3s.detect(main, text, templates)


def _record_original(host: Host, state: dict[str, Any], path: str) -> None:
    """Keep the bytes from before runc-guard first touched ``path`` (once, never replaced)."""
    files = state.setdefault("files", {})
    if path in files:
        return
    local = host.path(path)
    existed = os.path.exists(local)
    original = path + ORIG_SUFFIX if existed else None
    if original is not None:
        shutil.copy2(local, host.path(original))
    files[path] = {"existed": existed, "original": original, "written_sha256": None}


def _make_dirs(host: Host, state: dict[str, Any], directory: str) -> None:
    """Create a drop-in directory (and parents), recording each one for --revert."""
    missing = []
    while not os.path.isdir(host.path(directory)):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        os.mkdir(host.path(path), 0o755)
        state.setdefault("dirs", []).append(path)


def _write(host: Host, state: dict[str, Any], path: str, text: str) -> str | None:
    _make_dirs(host, state, os.path.dirname(path))
    _record_original(host, state, path)
    local = host.path(path)
    backup = _backup(local)
    if backup is not None:
        state.setdefault("backups", []).append(
            os.path.join(os.path.dirname(path), os.path.basename(backup)))
    data = text.encode("utf-8")
    write_atomic(local, data, like=local if os.path.exists(local) else None)
    state["files"][path]["written_sha256"] = _sha256(data)
    return backup


def _save_state(host: Host, main: str, state: dict[str, Any]) -> None:
    blob = json.dumps(state, indent=2, sort_keys=True).encode() + b"\n"
    write_atomic(host.path(_state_path(main)), blob, 0o600)


def apply_change(host: Host, main: str, change: Change) -> list[str]:
    """Write the change; returns human-readable lines of what was done."""
    done: list[str] = []
    state = load_state(host, main) or {"version": STATE_VERSION, "files": {}, "links": []}
    state.setdefault("mappings", {})
    for path, (_before, after) in change.plan.edits.items():
        backup = _write(host, state, path, after)
        done.append(f"wrote {path}" + (f" (backup: {backup})" if backup else ""))
    if change.settings_changed and change.settings_after is not None:
        _write(host, state, change.settings_path, change.settings_after)
        state["settings"] = change.settings_path
        state["mappings"].update(change.plan.mappings)
        done.append(f"wrote {change.settings_path} [runtimes]")
    for link, target in change.links.items():
        local = host.path(link)
        if os.path.lexists(local):
            if not os.path.islink(local):
                raise ContainerdConfigError(f"{link} exists and is not a symlink: not replacing it")
            os.unlink(local)
        os.symlink(target, local)
        if link not in state["links"]:
            state["links"].append(link)
        done.append(f"linked {link} -> {target}")
    _save_state(host, main, state)
    return done


def revert(host: Host, main: str, force: bool) -> list[str]:
    """Put every file back exactly as it was before the first configure; remove the links."""
    state = load_state(host, main)
    if state is None:
        return [f"nothing to revert: no record {_state_path(main)}"]
    settings = state.get("settings")
    files: dict[str, dict[str, Any]] = state.get("files", {})
    changed_since = [
        p for p, rec in files.items()
        if p != settings and _sha256(host.read(p)) != rec.get("written_sha256")
    ]
    if changed_since and not force:
        raise ContainerdConfigError(
            "changed since runc-guard configured it: " + ", ".join(changed_since)
            + "; --revert --force restores the pre-configure file anyway (losing those changes)"
        )
    done = []
    for path, rec in files.items():
        local = host.path(path)
        current = host.read(path)
        if path == settings and _sha256(current) != rec.get("written_sha256"):
            # Edited by the operator since: take out only the entries configure added.
            text = decode_text(current, path) or ""
            after = without_runtime_mappings(text, state.get("mappings", {}), path)
            if after != text:
                write_atomic(local, after.encode(), like=local)
            done.append(f"removed runc-guard's [runtimes] entries from {path} (edited since)")
            continue
        if rec.get("existed"):
            original = host.path(rec["original"])
            with open(original, "rb") as f:
                data = f.read()
            write_atomic(local, data, like=original)
            os.unlink(original)
            done.append(f"restored {path} byte for byte")
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(local)
            done.append(f"removed {path} (it did not exist before)")
    for link in state.get("links", []):
        local = host.path(link)
        if os.path.islink(local):
            os.unlink(local)
            done.append(f"removed link {link}")
    for backup in state.get("backups", []):  # the originals are restored: copies are noise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(host.path(backup))
    for directory in reversed(state.get("dirs", [])):
        with contextlib.suppress(OSError):  # kept if something else put files there since
            os.rmdir(host.path(directory))
            done.append(f"removed directory {directory}")
    os.unlink(host.path(_state_path(main)))
    return done



def describe_plan(plan: Plan) -> list[str]:
    """One line per handler: routed, already routed, or left alone and why."""
    lines = []
    for f in plan.fronted:
        runs = f.runtime or "its `runtime` setting (default runc)"
        verb = "already routed" if not f.changed else ("routed (handler added)" if f.created
                                                       else "routed")
        what = "legacy " + f.legacy + ", " if f.legacy else ""
        lines.append(
            f"handler {f.handler}: {verb}: {what}{'.'.join(f.slot)} = {f.binary_name} "
            f"(was {f.previous or 'unset: runc'}; runc-guard runs {runs}) in {f.file}"
        )
    for left in plan.left:
        lines.append(f"handler {left.handler}: left alone: {left.reason}")
    lines.append(f"pods without a RuntimeClass run handler {plan.default_handler}")
    lines.extend(plan.notes)
    return lines
