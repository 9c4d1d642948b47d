"""``runc-guardctl configure containerd``: front containerd's runc handlers with runc-guard.

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
  containerd is restarted only with ``--restart``.

``--host-root`` lets a DaemonSet pod configure the node through a mount of its
root filesystem: paths are host paths, files are reached below that root.
"""

from __future__ import annotations

import contextlib
import difflib
import glob
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import click

from runc_guard.atomic import write_atomic
from runc_guard.node import k3s
from runc_guard.node.containerd_config import (
    ConfigFile,
    ContainerdConfigError,
    Plan,
    imports,
    parse,
    plan_fronting,
    runtime_mappings,
    with_runtime_mappings,
    without_runtime_mappings,
)
from runc_guard.settings import config_path
from runc_guard.shim.runtime import installed_shim

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


def _decode(data: bytes | None, path: str) -> str | None:
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
        text = _decode(host.read(path), path)
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


def _unified(path: str, before: str | None, after: str | None) -> str:
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
    settings_before = _decode(host.read(settings_path), settings_path)
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
        templates[path] = _decode(host.read(path), path)
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
            text = _decode(current, path) or ""
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



def _restart(command: str) -> None:
    click.echo(f"restarting containerd: {command}")
    result = subprocess.run(shlex.split(command), check=False)
    if result.returncode != 0:
        raise ContainerdConfigError(f"{command!r} exited {result.returncode}")


def _describe(plan: Plan) -> list[str]:
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


@click.group()
def configure() -> None:
    """Put runc-guard in front of a container manager's runtime."""


@configure.command("containerd")
@click.option("--config", "config", default=DEFAULT_CONTAINERD_CONFIG, show_default=True,
              help="containerd's config file (its imports are followed).")
@click.option("--dry-run", is_flag=True, help="Print the change as a diff; touch nothing.")
@click.option("--revert", "do_revert", is_flag=True,
              help="Restore every file exactly as it was before the first configure.")
@click.option("--force", is_flag=True,
              help="With --revert: restore even files edited since configure.")
@click.option("--runtime", "runtimes", multiple=True, metavar="NAME",
              help="Handler to front (repeatable). Default: runc plus every handler that "
                   "runs a runc-compatible binary (runc shim v1/v2, legacy v1 runtime), "
                   "whatever its BinaryName; other handlers are listed and left alone.")
@click.option("--binary", default=None, metavar="PATH",
              help="runc-guard as the host sees it. Default: the one next to this tool.")
@click.option("--settings", "settings_path", default=None, metavar="PATH",
              help="runc-guard's settings file for [runtimes]. Default: "
                   "$RUNC_GUARD_CONFIG or /etc/runc-guard/config.toml.")
@click.option("--config-version", type=click.Choice(["auto", "2", "3"]), default="auto",
              show_default=True,
              help="Layout for a missing or empty config (auto: from `containerd --version`).")
@click.option("--host-root", default="/", show_default=True, metavar="DIR",
              help="Where the host's / is mounted (DaemonSet installer).")
@click.option("--restart", is_flag=True, help="Restart containerd if the config changed.")
@click.option("--restart-command", default=None, metavar="CMD",
              help=f"Default: {DEFAULT_RESTART!r}; on k3s/RKE2 their own unit "
                   "(k3s, k3s-agent, rke2-server or rke2-agent).")
@click.option("--restart-via", default=None, metavar="PREFIX",
              help="Run the restart command through this command (the DaemonSet installer: "
                   "nsenter into the host's namespaces), keeping the k3s/RKE2 unit choice.")
def containerd(
    *, config: str, dry_run: bool, do_revert: bool, force: bool, runtimes: tuple[str, ...],
    binary: str | None, settings_path: str | None, config_version: str, host_root: str,
    restart: bool, restart_command: str | None, restart_via: str | None,
) -> None:
    """Set options.BinaryName of containerd's runc handlers to runc-guard.

    Handles config version 1-3 (containerd 1.6/1.7 and 2.x), a missing or empty
    file, imports, legacy default_runtime tables, and k3s/RKE2's generated config
    (the change goes to their drop-in directory or template, never the generated
    file). A handler that already ran another runtime (e.g.
    nvidia-container-runtime) gets a per-handler link runc-guard-<handler> and a
    [runtimes] entry, so runc-guard runs that runtime for it. Idempotent; keeps a
    timestamped backup; never restarts containerd unless --restart is given.
    """
    host = Host(os.path.abspath(host_root))
    config = os.path.abspath(config)
    if do_revert:
        if dry_run:
            state = load_state(host, config)
            click.echo(json.dumps(state, indent=2) if state else "nothing to revert")
            return
        had_record = load_state(host, config) is not None
        generated = detect_generated(host, config, _decode(host.read(config), config))
        for line in revert(host, config, force):
            click.echo(line)
        command = _via(restart_via, restart_command or restart_for(host, generated, restart))
        _report_restart(restart, command, changed=had_record)
        return
    binary = binary or installed_shim()
    settings_path = settings_path or config_path(os.environ)
    version = detect_config_version() if config_version == "auto" else int(config_version)
    change = compute_change(
        host=host, main=config, binary=binary, runtimes=runtimes,
        settings_path=settings_path, default_version=version,
    )
    for line in _describe(change.plan):
        click.echo(line)
    if dry_run:
        for path, (before, after) in change.plan.edits.items():
            click.echo(_unified(path, before, after), nl=False)
        if change.settings_changed:
            click.echo(_unified(settings_path, change.settings_before, change.settings_after),
                       nl=False)
        for link, target in change.links.items():
            click.echo(f"would link {link} -> {target}")
        click.echo("dry run: nothing written" if change.anything else "nothing to change")
        return
    if change.anything and not os.access(host.path(binary), os.X_OK):
        raise ContainerdConfigError(f"--binary {binary} is not an executable file on the host")
    if not change.anything:
        click.echo("containerd is already configured: nothing written, no restart needed")
        return
    command = _via(restart_via, restart_command or restart_for(host, change.generated, restart))
    for line in apply_change(host, config, change):
        click.echo(line)
    _report_restart(restart, command, changed=change.plan.changed)


def _via(prefix: str | None, command: str) -> str:
    """``command`` run through ``prefix`` (e.g. ``nsenter -t 1 ... --``), when one is given."""
    return f"{prefix} {command}" if prefix else command


def restart_for(host: Host, generated: k3s.Generated | None, restart: bool) -> str:
    """containerd's restart command: k3s and RKE2 run it inside their own unit."""
    if generated is None:
        return DEFAULT_RESTART
    units = k3s.unit_files(lambda p: os.path.exists(host.path(p)), generated.program)
    if len(units) == 1:
        return f"systemctl restart {units[0]}"
    if restart:
        raise ContainerdConfigError(
            f"{generated.program} embeds containerd: restart its unit, but found "
            f"{'both ' + ' and '.join(units) if units else 'none of ' + ', '.join(generated.units)}"
            ": name it with --restart-command"
        )
    return " or ".join(f"systemctl restart {u}" for u in (units or generated.units))


def _report_restart(restart: bool, command: str, changed: bool) -> None:
    if not changed:
        click.echo("containerd config unchanged: no restart needed")
    elif restart:
        _restart(command)
    else:
        click.echo(
            "containerd must be restarted to pick this up (it reads its config only at start; "
            f"running containers keep the runtime they started with): {command}, "
            "or re-run with --restart"
        )

