"""What ``runc-guardctl doctor`` finds: the runtime that would run, settings, kernel, cgroup driver.

Per containerd handler (``handler_routes``): what a pod without a RuntimeClass and a
pod of each handler will run, so one command shows whether runc-guard is in front.
The CLI (``runc_guard.cli.doctor``) only prints what :func:`diagnose` returns.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Any

from runc_guard.delete.cgroupfs import cgroup_mounts
from runc_guard.errors import RuncGuardError
from runc_guard.runtime import installed_shim, resolve_runtime
from runc_guard.settings import config_path, load, load_settings, unmapped_problem

DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DEFAULT_RUNTIME_ROOT = "/run/containerd/runc"
#: The CRI plugin's name per containerd config version (2: containerd 1.x, 3: 2.x).
_CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def configured_drivers(text: str) -> dict[str, str]:
    """CRI runtime handler -> ``systemd``/``cgroupfs``, from its ``SystemdCgroup`` option.

    Only the main file is read (not ``imports``); containerd's default is
    ``SystemdCgroup = false``, i.e. the cgroupfs driver.
    """
    import tomlkit

    doc = tomlkit.parse(text).unwrap()
    version = doc.get("version", 1)
    plugin = _CRI_PLUGIN.get(version if isinstance(version, int) else 1, _CRI_PLUGIN[2])
    runtimes: Any = doc.get("plugins", {}).get(plugin, {}).get("containerd", {}).get("runtimes", {})
    drivers = {}
    if isinstance(runtimes, dict):
        for name, body in sorted(runtimes.items()):
            options = body.get("options", {}) if isinstance(body, dict) else {}
            systemd = isinstance(options, dict) and options.get("SystemdCgroup") is True
            drivers[str(name)] = "systemd" if systemd else "cgroupfs"
    return drivers


def cgroup_driver_report(containerd_config: str, runtime_root: str) -> tuple[dict[str, Any], list[str]]:
    """Which cgroup driver containers use: containerd's settings and what runc's states say."""
    from runc_guard.delete import systemd_scope

    problems: list[str] = []
    report: dict[str, Any] = {"systemd_pid1": systemd_scope.systemd_reachable()}
    try:
        with open(containerd_config) as f:
            report["containerd_handlers"] = configured_drivers(f.read())
    except FileNotFoundError:
        report["containerd_handlers"] = {}
    except (OSError, ValueError) as exc:
        problems.append(f"cannot read {containerd_config}: {exc}")
    in_use = systemd_scope.drivers_in_use(runtime_root)
    report["containers"] = {driver: len(ids) for driver, ids in sorted(in_use.items())}
    wants_systemd = in_use.get("systemd") or "systemd" in report.get("containerd_handlers", {}).values()
    if wants_systemd and not report["systemd_pid1"]:
        problems.append(
            "the systemd cgroup driver is configured or in use but systemd is not PID 1 here: "
            "scope units cannot be stopped or reset"
        )
    return report, problems


LAUNCHER, PYTHON_ENTRY = "launcher", "python entry"


def front_door(binary: str) -> str:
    """Which runc-guard ``binary`` is: the compiled launcher (an ELF) or the Python entry (a script).

    Both are complete BinaryNames; the Python entry costs an interpreter start on
    every runtime call (docs/launcher.md).
    """
    try:
        with open(binary, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        return f"unknown ({exc.strerror})"
    if head == b"\x7fELF":
        return LAUNCHER
    return PYTHON_ENTRY if head[:2] in (b"#!", b"PK") else "unknown (neither ELF nor a script)"


def handler_routes(containerd_config: str, invoked_shim: str) -> tuple[dict[str, Any], list[str]]:
    """Per CRI handler of the effective config (imports merged): what containerd will run.

    For a pod without a RuntimeClass (the default handler, a legacy
    ``default_runtime`` included) and for each handler: the shim type, the binary
    the shim starts and, when that is runc-guard, the runtime runc-guard runs
    behind it. The second value lists handlers that run a runc-compatible binary
    without runc-guard in front (warnings, not problems: fronting is opt-in).
    """
    from runc_guard.node import containerd_config as cc
    from runc_guard.node.configure import Host, config_set

    files = config_set(Host("/"), containerd_config)
    handlers, default = cc.effective_handlers(files)
    settings = load(os.environ)
    routes: dict[str, Any] = {}
    unguarded = []
    for name, h in sorted(handlers.items()):
        route: dict[str, Any] = {"runtime_type": h.runtime_type, "file": h.file or "(built in)"}
        if h.legacy:
            route["legacy_table"] = h.legacy
        if h.frontable:
            route["shim_runs"] = h.runs
            if cc.is_runc_guard(h.runs, invoked_shim):
                route["front_door"] = front_door(h.runs)
                invoked = os.path.basename(h.runs)
                unmapped = unmapped_problem(settings, invoked)
                if unmapped is not None:  # the shim fails such calls with 78: pods there cannot start
                    route["runc_guard_runs"] = "(none: unmapped, calls fail with exit 78)"
                    route["unmapped"] = unmapped
                    routes[name] = route
                    continue
                try:
                    route["runc_guard_runs"] = resolve_runtime(
                        settings.runtime_for(invoked), invoked_shim, os.environ)
                except (RuncGuardError, OSError, ValueError) as exc:
                    route["runc_guard_runs"] = f"(cannot resolve: {exc})"
            else:
                unguarded.append(name)
        else:
            route["shim_runs"] = None
        routes[name] = route
    report = {"config": containerd_config, "default_handler": default, "handlers": routes}
    warnings = [f"handler {name} runs {handlers[name].runs} without runc-guard in front "
                "(runc-guardctl configure containerd)" for name in unguarded]
    if default not in handlers:
        warnings.append(f"the default handler {default!r} is not defined: pods without a "
                        "RuntimeClass fail to start")
    return report, warnings


def route_lines(report: dict[str, Any]) -> list[str]:
    """The handler section of doctor's text output."""
    lines = [f"containerd:     {report['config']}; pods without a RuntimeClass run handler "
             f"{report['default_handler']}"]
    for name, route in report["handlers"].items():
        legacy = f" (legacy {route['legacy_table']})" if "legacy_table" in route else ""
        if route["shim_runs"] is None:
            chain = "not a runc shim: left to its own runtime"
        elif "runc_guard_runs" in route:
            chain = f"{route['shim_runs']} ({route.get('front_door', '?')}) -> {route['runc_guard_runs']}"
        else:
            chain = f"{route['shim_runs']} (no runc-guard)"
        lines.append(f"  handler {name}{legacy}: {route['runtime_type'] or '-'}: {chain}")
    return lines


# -- the kernel's features (what runc-guard relies on, and what degrades without each) --------


@dataclass(frozen=True)
class KernelFeature:
    """One kernel feature: since which Linux, what uses it, what happens without it."""

    name: str
    since: str
    used_for: str
    without: str


#: Found by reading the delete path and the node tools (os.pidfd_open, signal.pidfd_send_signal,
#: select.poll on cgroup.events, /proc/pressure, cgroup.stat) and what the runtimes use.
KERNEL_FEATURES = (
    KernelFeature(
        "pidfd_open", "5.3",
        "delete: wait for the runtime child's exit; pin a straggler before killing it",
        "stragglers are killed by pid after a start-time check (as runc does) and exits are polled",
    ),
    KernelFeature(
        "pidfd_send_signal", "5.1",
        "delete: signal a straggler through its pidfd (no recycled-pid race)",
        "as without pidfd_open: kill by pid after a start-time check",
    ),
    KernelFeature(
        "cgroup.events", "4.5 (cgroup v2 only)",
        "delete: wake the moment a cgroup empties (POLLPRI on populated 0)",
        "emptiness is polled every poll interval (cgroup v1 always works this way)",
    ),
    KernelFeature(
        "cgroup.kill", "5.14 (cgroup v2 only)",
        "not by runc-guard; crun kills a container through it",
        "the runtime signals every process itself; runc-guard is unaffected",
    ),
    KernelFeature(
        "cgroup.stat", "4.14 (cgroup v2 only)",
        "metrics: nr_dying_descendants, the cgroups the kernel has not freed yet",
        "no dying-cgroup gauge (v1: /proc/cgroups counts only)",
    ),
    KernelFeature(
        "memcg reclaim", "5.19 (v2 memory.reclaim; v1 a lowered memory.limit_in_bytes)",
        "delete: reclaim a container's empty memory cgroup before its rmdir, so the kernel frees it",
        "memory cgroups are removed with their page cache still charged and stay dying, as with the"
        " runtime alone (runc_guard_memcg_left_charged_total counts them)",
    ),
    KernelFeature(
        "PSI", "4.20 (CONFIG_PSI, not psi=0)",
        "sweep --pacing adaptive: /proc/pressure stall shares",
        "the pace follows the canary, rmdir latency and sys% only",
    ),
)


def _probe(call: Any) -> tuple[bool | None, str]:
    """True when ``call()`` works, False on ENOSYS (no such syscall), None when refused otherwise."""
    import errno

    try:
        call()
    except OSError as exc:
        return (False if exc.errno == errno.ENOSYS else None), exc.strerror or str(exc)
    return True, ""


def _pidfd_open_self() -> None:
    os.close(os.pidfd_open(os.getpid()))


def _pidfd_send_signal_self() -> None:
    """Signal 0 to ourselves through a /proc/<pid> directory fd, which pidfd_send_signal also takes."""
    import signal

    fd = os.open(f"/proc/{os.getpid()}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        signal.pidfd_send_signal(fd, 0)
    finally:
        os.close(fd)


def _version(text: str) -> tuple[int, int] | None:
    """(major, minor) of ``5.14`` or ``6.1.0-18-amd64``; None when it is neither."""
    parts = text.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1].split("-")[0] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


def kernel_at_least(since: str, release: str) -> bool | None:
    """Whether ``release`` (uname -r) is at least the ``major.minor`` that ``since`` starts with."""
    want, have = _version(since.split(maxsplit=1)[0]), _version(release)
    return None if want is None or have is None else have >= want


def _v2_child(mounts: dict[str, str]) -> str | None:
    """A non-root cgroup of a cgroup2 mount (control files like cgroup.events are not on the root)."""
    for mount, fstype in sorted(mounts.items()):
        if fstype != "cgroup2":
            continue
        try:
            with os.scandir(mount) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        return entry.path
        except OSError:
            continue
    return None


def _memcg_reclaim(mounts: dict[str, str], release: str) -> tuple[bool | None, str]:
    """Can this kernel reclaim a memory cgroup on demand (delete.reclaim)? v1 always; v2 since 5.19."""
    for mount, fstype in sorted(mounts.items()):
        if fstype == "cgroup" and os.path.exists(os.path.join(mount, "memory.force_empty")):
            return True, (f"cgroup v1 memory in {mount} (reclaimed through a lowered memory.limit_in_bytes); "
                          "a cache too large for the reply is held aside and reclaimed after it when the "
                          "finisher is on")
    for mount, fstype in sorted(mounts.items()):
        if fstype != "cgroup2":
            continue
        try:
            with open(os.path.join(mount, "cgroup.controllers")) as f:
                controllers = f.read().split()
        except OSError:
            controllers = []
        if "memory" not in controllers:
            continue
        try:
            with os.scandir(mount) as it:
                child = next((e.path for e in it if e.is_dir(follow_symlinks=False)
                              and os.path.exists(os.path.join(e.path, "memory.current"))), None)
        except OSError:
            child = None
        # cgroup2 cannot rename a cgroup: what the reply's budget does not reclaim stays dying
        only = "cgroup2: within the reply only"
        if child is not None:
            return os.path.exists(os.path.join(child, "memory.reclaim")), f"in {child} ({only})"
        return kernel_at_least("5.19", release), f"by kernel version {release} ({only})"
    return False, "no memory controller mounted"


def kernel_report(
    mounts: dict[str, str], pressure_dir: str = "/proc/pressure", release: str | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each feature runc-guard relies on, probed on this kernel; and one warning per missing one.

    ``present`` is True, False, or None (cannot tell: no cgroup2 mounted, or a
    probe refused by a seccomp filter). Missing features degrade, never stop,
    runc-guard: they are warnings, not problems (doctor's exit status is unchanged).
    """
    release = os.uname().release if release is None else release
    child = _v2_child(mounts)
    has_v2 = "cgroup2" in mounts.values()
    found: dict[str, tuple[bool | None, str]] = {
        "pidfd_open": _probe(_pidfd_open_self),
        "pidfd_send_signal": _probe(_pidfd_send_signal_self),
        "PSI": (os.path.exists(os.path.join(pressure_dir, "cpu")), ""),
        "memcg reclaim": _memcg_reclaim(mounts, release),
    }
    for feature in KERNEL_FEATURES:
        if feature.name.startswith("cgroup."):
            if not has_v2:
                found[feature.name] = (False, "no cgroup2 mounted")
            elif child is not None:
                found[feature.name] = (os.path.exists(os.path.join(child, feature.name)), f"in {child}")
            else:  # only the root cgroup, which has none of the per-cgroup files: tell by version
                by_version = kernel_at_least(feature.since, release)
                found[feature.name] = (by_version, f"by kernel version {release}")
    features: list[dict[str, Any]] = []
    warnings: list[str] = []
    for feature in KERNEL_FEATURES:
        state, detail = found[feature.name]
        entry = {"name": feature.name, "since": feature.since, "present": state,
                 "used_for": feature.used_for, "without": feature.without}
        if detail:
            entry["detail"] = detail
        features.append(entry)
        if state is not True:
            what = "missing" if state is False else "cannot tell"
            warnings.append(f"kernel: {feature.name} {what} (Linux {feature.since}): {feature.without}")
    return features, warnings


def memcg_reparenting(mounts: dict[str, str], cache_dir: str | None) -> dict[str, Any]:
    """Does this kernel free a removed memory cgroup's page cache itself (Linux 7.x), or keep the memcg
    dying (every LTS kernel)? Told by a probe memcg (node.memcg_probe) as root, once per boot: its
    answer is cached for the deletes, and read from there after. Not root: the cached answer, if any."""
    from runc_guard.delete.reclaim import PROBE_FILE, kernel_reparents
    from runc_guard.node.memcg_probe import describe, ensure_probed, probe

    if os.geteuid() != 0:
        cached = kernel_reparents(os.path.join(cache_dir, PROBE_FILE)) if cache_dir else None
        answer, how = cached, "not root: no probe (the cached answer, if any)"
    elif cache_dir:
        answer, how = ensure_probed(cache_dir, mounts)
    else:
        answer, how = probe(mounts)
    return {"reparents": answer, "how": how, "meaning": describe(answer)}


# -- end of the kernel's features ----------------------------------------------------------------


def diagnose(
    invoked_as: str,
    containerd_config: str = DEFAULT_CONTAINERD_CONFIG,
    runtime_root: str = DEFAULT_RUNTIME_ROOT,
) -> tuple[dict[str, Any], list[str]]:
    """Facts about this node's runc-guard and a list of problems found (empty when healthy)."""
    problems: list[str] = []
    report: dict[str, Any] = {"config_file": config_path(os.environ), "invoked_as": invoked_as,
                              "front_door": front_door(installed_shim())}
    try:
        settings = load_settings()
        report["settings"] = settings.as_dict()
        report["settings_source"] = settings.source
    except RuncGuardError as exc:
        problems.append(str(exc))
        settings = None
    unmapped = unmapped_problem(load(os.environ), invoked_as)
    if unmapped is not None:
        problems.append(f"routing: {unmapped} (such calls fail with exit 78)")
    try:
        name = load(os.environ).runtime_for(invoked_as)
        runtime = resolve_runtime(name, installed_shim(), os.environ)
        report["runtime"] = runtime
        version = subprocess.run(
            [runtime, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        report["runtime_version"] = version.stdout.splitlines()[0] if version.stdout else ""
    except (RuncGuardError, OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
        problems.append(f"runtime: {exc}")
    mounts = cgroup_mounts()
    report["cgroup_mounts"] = mounts
    if not mounts:
        problems.append("no cgroup filesystem is mounted")
    if settings is not None:
        report["journald"] = os.path.exists(settings.journal_socket)
    try:
        routes, warnings = handler_routes(containerd_config, installed_shim())
        report["containerd_routes"] = routes
        report["warnings"] = warnings
        problems.extend(
            f"handler {name}: {route['unmapped']}"
            for name, route in routes["handlers"].items()
            if "unmapped" in route
        )
    except (RuncGuardError, OSError, ValueError) as exc:
        problems.append(f"cannot read containerd's config {containerd_config}: {exc}")
    driver, driver_problems = cgroup_driver_report(containerd_config, runtime_root)
    report["cgroup_driver"] = driver
    problems.extend(driver_problems)
    report["kernel"], kernel_warnings = kernel_report(mounts)
    report["warnings"] = [*report.get("warnings", []), *kernel_warnings]
    report["memcg_reparenting"] = memcg_reparenting(mounts, settings.cache_dir if settings else None)
    report["problems"] = problems
    return report, problems
