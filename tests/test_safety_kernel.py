"""Never more harm than the runtime it fronts (issue 11), each case against stock runc 1.1.5.

Each test runs the same setup twice where a stock control applies: once with
``runc`` alone, once through ``runc-guard`` in front of the same runc, and
asserts that runc-guard did no more harm (kills, removals, exit status) than
stock runc did. One line per case goes to pytest's terminal summary
("runc-guard safety: stock vs runc-guard"); docs/faults.md holds the table.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from labkit import prereq, stall
from labkit.kernel import (
    RUNC,
    RuncContainer,
    cgroup_mount_points,
    crafted_container,
    guard_is_waiting,
    make_bundle,
    procs,
    remove_tree,
    reported_events,
    script,
    unique,
    wait_for,
)
from labkit.scenario import guard_env
from runc_guard.delete.cgroupfs import RealCgroupFs

#: One line per case, shown in the terminal summary (see _SummaryPlugin).
SUMMARY: list[str] = []


class _SummaryPlugin:
    """Prints SUMMARY at the end of the run; registered by this module only (no conftest change)."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if SUMMARY:
            terminalreporter.section("runc-guard safety: stock vs runc-guard")
            for line in SUMMARY:
                terminalreporter.write_line(line)


@pytest.fixture(scope="module", autouse=True)
def _summary(request: pytest.FixtureRequest) -> None:
    manager = request.config.pluginmanager
    if not manager.has_plugin("runc-guard-safety-summary"):
        manager.register(_SummaryPlugin(), "runc-guard-safety-summary")


def _hierarchies() -> dict[str, str]:
    """Mount point by hierarchy name (``memory`` ..., ``unified`` for the v2 tree)."""
    return {os.path.basename(m): m for m in cgroup_mount_points()}


#: Hierarchies a test process can be moved into without setting anything up first
#: (a new v1 cpuset cgroup has no cpus/mems and refuses tasks).
MOVABLE = ("memory", "pids", "unified")


def move_into(pid: int, relative: str, hierarchies: tuple[str, ...] = MOVABLE) -> None:
    mounts = _hierarchies()
    for name in hierarchies:
        if name in mounts:
            with open(os.path.join(mounts[name], relative.strip("/"), "cgroup.procs"), "w") as f:
                f.write(str(pid))


def make_cgroup(relative: str, hierarchies: tuple[str, ...] | None = None) -> list[str]:
    """``relative`` in every hierarchy, or in ``hierarchies`` (as a service manager would make it)."""
    made = []
    for name, mount in sorted(_hierarchies().items()):
        if hierarchies is not None and name not in hierarchies:
            continue
        path = os.path.join(mount, relative.strip("/"))
        os.makedirs(path, exist_ok=True)
        made.append(path)
    return made


def remove_everywhere(relative: str) -> None:
    for mount in cgroup_mount_points():
        path = os.path.join(mount, relative.strip("/"))
        for d in _walk(path):
            for pid in procs(d):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        wait_for(lambda p=path: not any(procs(d) for d in _walk(p)), 5)  # type: ignore[misc]
        remove_tree(path)


def _walk(path: str) -> list[str]:
    return [d for d, _dirs, _files in os.walk(path)] if os.path.isdir(path) else []


class Runc:
    """A detached runc container started by the test; removable whatever happened."""

    def __init__(
        self, workdir: str, cgroups_path: str, host_pid: bool, via: list[str] | None = None, cid: str = ""
    ) -> None:
        self.id = cid or unique("rgsafe")
        self.root = os.path.join(workdir, "runc-root")
        bundle = make_bundle(os.path.join(workdir, self.id), cgroups_path, "sleep 1000", host_pid=host_pid)
        with open(os.path.join(workdir, f"{self.id}.stderr"), "wb") as err:
            subprocess.run(
                [*(via or []), RUNC, "--root", self.root, "run", "-d", self.id],
                cwd=bundle,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                check=True,
                timeout=30,
            )
        self.paths: dict[str, str] = dict(self.state()["cgroup_paths"])
        #: False when the cgroups were made by the test (and hold its services): not ours to clean.
        self.own_dirs = True

    def state(self) -> dict[str, Any]:
        with open(os.path.join(self.root, self.id, "state.json")) as f:
            return json.load(f)  # type: ignore[no-any-return]

    def has_state(self) -> bool:
        return os.path.exists(os.path.join(self.root, self.id, "state.json"))

    def status(self) -> str:
        proc = subprocess.run(
            [RUNC, "--root", self.root, "state", self.id], capture_output=True, text=True, check=False
        )
        return str(json.loads(proc.stdout)["status"]) if proc.returncode == 0 else "gone"

    def dirs_left(self) -> list[str]:
        return sorted({p for p in self.paths.values() if p and os.path.isdir(p)})

    def destroy(self) -> None:
        subprocess.run(
            [RUNC, "--root", self.root, "delete", "--force", self.id],
            capture_output=True,
            check=False,
            timeout=30,
        )
        for path in set(self.paths.values()):
            # only the container's own dirs: a shared cgroup is the test's to clean
            if self.own_dirs and path and os.path.basename(path) == self.id and os.path.isdir(path):
                for pid in procs(path):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                wait_for(lambda p=path: not procs(p), 5)  # type: ignore[misc]
                remove_tree(path)


def delete(
    binary: str, ctr: Runc, env: dict[str, str] | None = None, *flags: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, "--root", ctr.root, *flags, "delete", "--force", ctr.id],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


@contextlib.contextmanager
def service(relative: str) -> Iterator[subprocess.Popen[bytes]]:
    """A long-running process (a 'service') placed in ``relative``; stopped by its pid."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        move_into(proc.pid, relative)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# -- case 1: a cgroupsPath naming a shared, pre-existing cgroup --------------------------------


@pytest.mark.kernel
@pytest.mark.parametrize("variant", ["service_cgroup", "pre_existing_named_like_the_container"])
def test_shared_cgroup_is_never_killed_or_removed(shim_binary: str, workdir: str, variant: str) -> None:
    """Case 1: a container with its own PID namespace whose cgroupsPath names a cgroup where a service
    runs (another in a child cgroup). Stock runc kills neither service and leaves both directories;
    runc-guard steps aside (warning ``stepped_aside``) and ends exactly the same, same exit status."""
    results: dict[str, tuple[int, int, int]] = {}
    for who in ("stock", "runc-guard"):
        shared = f"/{unique('rgsafe-svc')}"
        try:
            cid = unique("rgsafe")
            # the service's own cgroup, or one named as the container will be, made before it
            ctr_relative = shared if variant == "service_cgroup" else f"{shared}/{cid}"
            make_cgroup(ctr_relative)
            # only where the service runs: a v1 devices cgroup with children refuses runc's
            # devices.deny ("invalid argument"), and a service manager makes no such child
            make_cgroup(f"{ctr_relative}/child", MOVABLE)
            with service(ctr_relative) as svc, service(f"{ctr_relative}/child") as svc_child:
                if variant != "service_cgroup":
                    time.sleep(1.2)  # older than the container's init by more than paths.CREATED_MARGIN
                ctr = Runc(workdir, ctr_relative, host_pid=False, cid=cid)
                ctr.own_dirs = False
                try:
                    assert ctr.status() == "running"
                    binary = RUNC if who == "stock" else shim_binary
                    env = None if who == "stock" else guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC)
                    proc = delete(binary, ctr, env)
                    assert "Traceback" not in proc.stderr
                    alive = sum(p.poll() is None for p in (svc, svc_child))
                    dirs = sum(
                        os.path.isdir(os.path.join(m, d.strip("/")))
                        for m in (_hierarchies()["memory"],)
                        for d in (ctr_relative, f"{ctr_relative}/child")
                    )
                    results[who] = (proc.returncode, alive, dirs)
                finally:
                    ctr.destroy()
        finally:
            remove_everywhere(shared)
    assert results["stock"][1:] == (2, 2), f"stock runc changed its behaviour: {results}"
    assert results["runc-guard"] == results["stock"], results
    entries = [e for e in reported_events(workdir) if e["event"] == "delete"]
    assert [(e["outcome"], e["level"]) for e in entries] == [("stepped_aside", "warning")]
    why = "is not named after container" if variant == "service_cgroup" else "existed before the container"
    assert why in entries[0]["reason"], entries[0]
    stock, guard = results["stock"], results["runc-guard"]
    SUMMARY.append(
        f"case 1 shared cgroup ({variant}): stock exit {stock[0]}, services alive {stock[1]}/2, "
        f"dirs {stock[2]}/2 | runc-guard exit {guard[0]}, alive {guard[1]}/2, dirs {guard[2]}/2, "
        "outcome stepped_aside"
    )


# -- case 2: --version / --help before the subcommand ----------------------------------------


@pytest.mark.kernel
@pytest.mark.parametrize("flag", ["--version", "-v", "--help", "-h"])
def test_version_or_help_flag_deletes_nothing(shim_binary: str, workdir: str, flag: str) -> None:
    """Case 2: ``<binary> --version delete ID`` on a running container prints what runc prints and does
    nothing: the container keeps running, its processes and cgroups untouched (stock identical)."""
    ctr = Runc(workdir, f"/{unique('rgsafe')}/ctr", host_pid=True)
    try:
        pids_before = sorted(procs(ctr.paths["memory"]))
        outputs = {}
        for who, binary in (("stock", RUNC), ("runc-guard", shim_binary)):
            env = None if who == "stock" else guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC)
            proc = subprocess.run(
                [binary, flag, "--root", ctr.root, "delete", ctr.id],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=30,
            )
            outputs[who] = (proc.returncode, proc.stdout)
            assert ctr.status() == "running"
            assert sorted(procs(ctr.paths["memory"])) == pids_before
            assert ctr.dirs_left() == sorted({p for p in ctr.paths.values() if p})
        assert outputs["runc-guard"] == outputs["stock"]
        assert not os.path.exists(os.path.join(workdir, "events.jsonl"))
        if flag == "--version":
            SUMMARY.append(
                f"case 2 `{flag} delete ID`: stock exit {outputs['stock'][0]}, container running | "
                f"runc-guard exit {outputs['runc-guard'][0]}, same stdout, container running, "
                "0 cgroups touched"
            )
    finally:
        parent = os.path.dirname(ctr.paths["memory"])
        ctr.destroy()
        remove_everywhere(parent[len(_hierarchies()["memory"]) :])


# -- case 4: a TOML syntax error under a non-default name --------------------------------------


class _FakeJournal:
    """A datagram socket where journald's would be: counts what the shim sends."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setblocking(False)

    def drain(self) -> list[str]:
        got = []
        while True:
            try:
                got.append(self.sock.recv(1 << 20).decode("utf-8", "replace"))
            except BlockingIOError:
                return got

    def close(self) -> None:
        self.sock.close()


def _recording(path: str, log: str) -> str:
    return script(path, f'echo "$(basename $0) $*" >> {log}')


def _runtime_and_plain_runc(tmp: str, name: str) -> tuple[str, str, Callable[[], list[str]]]:
    """A PATH directory with runtime ``name`` and a plain ``runc`` that must never be reached, both
    recording their calls: (the directory, the runtime's path, the calls so far)."""
    tools = os.path.join(tmp, "bin")
    os.makedirs(tools)
    calls = os.path.join(tmp, "calls")
    runtime = _recording(os.path.join(tools, name), calls)
    _recording(os.path.join(tools, "runc"), calls)

    def routed() -> list[str]:
        with contextlib.suppress(FileNotFoundError), open(calls) as f:
            return f.read().splitlines()
        return []

    return tools, runtime, routed


def test_broken_toml_routes_by_last_good_copy_or_fails(shim_binary: str, tmp_path: Any) -> None:
    """Case 4: after the settings file breaks (TOML syntax error), ``runc-guard-nvidia`` still reaches
    the nvidia-side runtime through the last good routing; the problem reaches the journal once per
    version of the file, not per call. With no last good copy the call fails with exit 78 and a clear
    line, and never reaches plain runc."""
    tmp = str(tmp_path)
    tools, nvidia, routed = _runtime_and_plain_runc(tmp, "nvidia-container-runtime")
    invoked = os.path.join(tools, "runc-guard-nvidia")
    os.symlink(shim_binary, invoked)
    config = os.path.join(tmp, "config.toml")
    journal = _FakeJournal(os.path.join(tmp, "journal.socket"))

    def env(cache: str) -> dict[str, str]:
        return {
            "PATH": f"{tools}:{os.environ['PATH']}",
            "RUNC_GUARD_CONFIG": config,
            "RUNC_GUARD_CACHE_DIR": os.path.join(tmp, cache),
            "RUNC_GUARD_JOURNAL_SOCKET": os.path.join(tmp, "journal.socket"),
        }

    def call(cache: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [invoked, "state", "ctr1"],
            capture_output=True,
            text=True,
            env=env(cache),
            check=False,
            timeout=30,
        )

    try:
        with open(config, "w") as f:
            f.write(f'runtime = "runc"\n[runtimes]\n"runc-guard-nvidia" = "{nvidia}"\n')
        assert call("cache").returncode == 0
        assert routed() == ["nvidia-container-runtime state ctr1"]
        with open(config, "w") as f:
            f.write('runtime = "runc"\n[runtimes\n"runc-guard-nvidia" = oops\n')
        for _ in range(3):
            proc = call("cache")
            assert (proc.returncode, proc.stderr) == (0, "")
        assert routed() == ["nvidia-container-runtime state ctr1"] * 4
        sent = [m for m in journal.drain() if "config_invalid" in m]
        assert len(sent) == 1 and "routing by its last good version" in sent[0]
        # A second broken version is a new problem: reported once more.
        with open(config, "a") as f:
            f.write("# still broken\n")
        assert call("cache").returncode == 0 and call("cache").returncode == 0
        assert len([m for m in journal.drain() if "config_invalid" in m]) == 1
        # A node that never saw a good version: no guess, a clear failure.
        fresh = call("fresh-cache")
        assert fresh.returncode == 78
        assert "no last good routing for 'runc-guard-nvidia'" in fresh.stderr
        assert fresh.stderr.count("\n") == 1 and "Traceback" not in fresh.stderr
        assert routed() == ["nvidia-container-runtime state ctr1"] * 6, "plain runc must never be reached"
    finally:
        journal.close()
    SUMMARY.append(
        "case 4 TOML syntax error as runc-guard-nvidia: stock n/a (nvidia's own runtime has no such file) | "
        "runc-guard routes 5/5 calls to nvidia by the last good copy, 1 journal entry per file version; "
        "no last good copy: exit 78, plain runc never reached"
    )


def test_last_good_routing_survives_a_reboot(shim_binary: str, python_entry: str, tmp_path: Any) -> None:
    """Issue 30 case 2: the last good routing is persistent (the state directory, not /run). A good
    file, one call, then a syntax error and /run emptied as a reboot does: ``runc-guard --version``
    (launcher and Python entry alike) still reaches the configured runtime, never plain runc. A node
    that never saw a good version refuses every name (exit 78, one line) instead of running runc."""
    tmp = str(tmp_path)
    tools, tracer, routed = _runtime_and_plain_runc(tmp, "gpu-runtime")
    config = os.path.join(tmp, "config.toml")
    run_dir = os.path.join(tmp, "run")  # the tmpfs a reboot empties
    env = {
        "PATH": f"{tools}:{os.environ['PATH']}",
        "RUNC_GUARD_CONFIG": config,
        "RUNC_GUARD_CACHE_DIR": run_dir,
        "RUNC_GUARD_STATE_DIR": os.path.join(tmp, "var-lib"),
        "RUNC_GUARD_JOURNAL_SOCKET": os.path.join(tmp, "no-journald"),
    }

    def call(binary: str, state: str = "var-lib") -> subprocess.CompletedProcess[str]:
        return subprocess.run([binary, "--version"], capture_output=True, text=True, check=False, timeout=30,
                              env={**env, "RUNC_GUARD_STATE_DIR": os.path.join(tmp, state)})

    with open(config, "w") as f:
        f.write(f'runtime = "{tracer}"\n')
    assert call(shim_binary).returncode == 0
    with open(config, "w") as f:
        f.write(f'runtime = "{tracer}\n')  # the closing quote lost
    state = os.stat(os.path.join(tmp, "var-lib"))
    assert (state.st_uid, state.st_mode & 0o777) == (0, 0o700)
    for binary in (shim_binary, python_entry, shim_binary):
        subprocess.run(["rm", "-rf", run_dir], check=True)  # the reboot
        proc = call(binary)
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert routed() == ["gpu-runtime --version"] * 4
    for binary in (shim_binary, python_entry):
        subprocess.run(["rm", "-rf", run_dir], check=True)
        fresh = call(binary, state="fresh-var-lib")
        assert fresh.returncode == 78 and fresh.stderr.count("\n") == 1, fresh.stderr
        assert "no last good routing for 'runc-guard" in fresh.stderr
    assert routed() == ["gpu-runtime --version"] * 4, "plain runc must never be reached"
    SUMMARY.append(
        "issue 30 case 2 broken settings file after a reboot: stock n/a | "
        "before: plain runc, exit 0, silent | "
        "now: 3/3 calls routed by the persistent last good copy; no copy: exit 78, one line, runc never run"
    )


# -- case 5: no cgroupsPath, a caller whose cgroups differ per hierarchy ----------------------


@pytest.mark.kernel
def test_no_cgroups_path_from_a_caller_split_across_hierarchies(shim_binary: str, workdir: str) -> None:
    """Case 5: without cgroupsPath runc puts the container below its caller's cgroup in each hierarchy;
    a caller in different cgroups per hierarchy gives paths that disagree. ``delete --force`` exits 0
    and leaves 0 directories, exactly as stock runc alone does."""
    results: dict[str, tuple[int, int]] = {}
    for who in ("stock", "runc-guard"):
        caller = f"/{unique('rgsafe-caller')}"
        make_cgroup(caller)
        # The caller moves itself into its own cgroup in memory and pids only, then execs runc.
        wrapper = script(
            os.path.join(workdir, f"wrapper-{who}"),
            "\n".join(f"echo $$ > {_hierarchies()[h]}{caller}/cgroup.procs" for h in ("memory", "pids"))
            + '\nexec "$@"',
        )
        ctr = None
        try:
            ctr = Runc(workdir, "", host_pid=True, via=[wrapper])
            relatives = {
                p[len(m) :]
                for p in ctr.paths.values()
                for m in cgroup_mount_points()
                if p.startswith(m + "/")
            }
            assert len(relatives) > 1, f"the paths must disagree across hierarchies: {ctr.paths}"
            binary = RUNC if who == "stock" else shim_binary
            env = None if who == "stock" else guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC)
            proc = delete(binary, ctr, env)
            assert "Traceback" not in proc.stderr
            results[who] = (proc.returncode, len(ctr.dirs_left()))
        finally:
            if ctr is not None:
                ctr.destroy()
            remove_everywhere(caller)
    assert results["stock"] == (0, 0), results
    assert results["runc-guard"] == results["stock"], results
    entries = [e for e in reported_events(workdir) if e["event"] == "delete"]
    assert [e["outcome"] for e in entries] == ["removed"] or [e["outcome"] for e in entries] == [
        "already_gone"
    ]
    stock, guard = results["stock"], results["runc-guard"]
    SUMMARY.append(
        f"case 5 no cgroupsPath, caller split across hierarchies: stock exit {stock[0]}, dirs {stock[1]} "
        f"| runc-guard exit {guard[0]}, dirs {guard[1]}"
    )


# -- case 7: a mount inside the cgroup, concurrent deletes, SIGINT ------------------------------


@pytest.mark.kernel
def test_walk_never_crosses_a_mount_point(shim_binary: str, workdir: str) -> None:
    """Case 7: a tmpfs mounted on a child directory of the container's memory cgroup is not a child
    cgroup: RealCgroupFs.children skips it and the delete neither enters nor removes it (an empty
    directory on that tmpfs survives); the container's cgroup stays busy, so exit 75 with a record."""
    with crafted_container(workdir) as ctr:
        memory = ctr.dir_in("memory")
        mnt = os.path.join(memory, "mnt")
        os.mkdir(mnt)  # a child cgroup, then covered by the mount
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "rgsafe", mnt], check=True)
        try:
            victim = os.path.join(mnt, "victim")
            os.mkdir(victim)
            assert mnt not in RealCgroupFs().children(memory)
            env = guard_env(workdir, RUNC_GUARD_RUNTIME=ctr.runtime(), RUNC_GUARD_DELETE_TIMEOUT="1")
            proc = subprocess.run(
                [shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=30,
            )
            assert os.path.isdir(victim), "the walk crossed into the mounted filesystem"
            assert proc.returncode == 75, proc.stderr
            assert "Traceback" not in proc.stderr
            assert len(os.listdir(os.path.join(workdir, "pending"))) == 1
        finally:
            subprocess.run(["umount", mnt], check=True)
    SUMMARY.append(
        f"case 7 tmpfs mounted inside the container's cgroup: runc-guard exit {proc.returncode}, "
        "the mount's contents untouched, record kept"
    )


@pytest.mark.kernel
def test_mount_inside_cgroup_against_stock_runc(shim_binary: str, workdir: str) -> None:
    """Case 7, stock control: runc 1.1.5's own RemovePath reads the directory and recurses into the
    tmpfs mounted on a child of the container's memory cgroup, removing an empty directory there,
    and exits 0 leaving 2 cgroup dirs. Through runc-guard the same runc does the same (runc-guard
    adds no harm of its own: the walk above shows it never enters the mount), then runc-guard says
    the cgroup is still in use: exit 75, record kept, instead of a silent leak."""
    results = {}
    for who in ("stock", "runc-guard"):
        ctr = RuncContainer.start(workdir, children=1)
        mnt = os.path.join(ctr.any_cgroup(), "mnt")
        mounted = False
        try:
            os.mkdir(mnt)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "rgsafe", mnt], check=True)
            mounted = True
            os.mkdir(os.path.join(mnt, "victim"))
            init = ctr.init_pid()
            os.kill(init, signal.SIGKILL)
            assert wait_for(lambda c=ctr, i=init: i not in c.pids(), 5)  # type: ignore[misc]
            binary = RUNC if who == "stock" else shim_binary
            env = guard_env(workdir, RUNC_GUARD_RUNTIME=RUNC, RUNC_GUARD_DELETE_TIMEOUT="1")
            proc = subprocess.run(
                [binary, "--root", ctr.root, "delete", "--force", ctr.id],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=30,
            )
            assert "Traceback" not in proc.stderr
            results[who] = (
                proc.returncode,
                os.path.isdir(os.path.join(mnt, "victim")),
                len(ctr.cgroup_dirs()),
            )
        finally:
            if mounted:
                subprocess.run(["umount", mnt], check=True)
            ctr.destroy()
    assert results["stock"] == (0, False, 2), results  # runc crossed the mount, and leaked silently
    assert results["runc-guard"] == (75, False, 2), results  # runc's harm, not more; reported
    assert len(os.listdir(os.path.join(workdir, "pending"))) == 1
    SUMMARY.append(
        "case 7 tmpfs mounted inside a real container's memory cgroup: stock runc exit 0, removed the "
        "dir inside the mount, 2 cgroup dirs left silently | runc-guard (same runc) exit 75, "
        "same removal by runc, 2 dirs left, record kept"
    )


@pytest.mark.kernel
def test_concurrent_deletes_keep_the_record_while_busy(shim_binary: str, workdir: str) -> None:
    """Case 7: two deletes of one id while its cgroup stays busy: both give the same verdict (75 at the
    deadline) and exactly one record remains; once the process is gone a retry finishes it."""
    with crafted_container(workdir) as ctr:
        inside = ctr.add_process()
        env = guard_env(
            workdir,
            RUNC_GUARD_RUNTIME=ctr.runtime(),
            RUNC_GUARD_KILL_STRAGGLERS="false",
            RUNC_GUARD_DELETE_TIMEOUT="1",
        )
        argv = [shim_binary, "--root", ctr.root, "delete", "--force", ctr.id]
        with ThreadPoolExecutor(2) as pool:
            results = list(
                pool.map(
                    lambda _: subprocess.run(
                        argv, capture_output=True, text=True, env=env, check=False, timeout=30
                    ),
                    range(2),
                )
            )
        assert [r.returncode for r in results] == [75, 75], [r.stderr for r in results]
        assert all("Traceback" not in r.stderr for r in results)
        pending = os.path.join(workdir, "pending")
        assert len(os.listdir(pending)) == 1
        assert inside.poll() is None
        inside.kill()
        inside.wait()
        retry = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=30)
        assert retry.returncode == 0, retry.stderr
        assert os.listdir(pending) == [] and not any(os.path.exists(d) for d in ctr.dirs)
    SUMMARY.append(
        "case 7 two concurrent deletes of one busy id: runc-guard 75/75, exactly 1 record kept; "
        "the retry after the process exited: exit 0, 0 dirs, 0 records"
    )


@pytest.mark.kernel
def test_sigint_mid_wait_prints_no_traceback(shim_binary: str, workdir: str) -> None:
    """Case 7: SIGINT while the delete waits for the cgroups: exit 130, a one-line reason, no
    traceback, the record kept, nothing killed (kill_stragglers=false)."""
    with crafted_container(workdir) as ctr:
        straggler = ctr.add_process()
        env = guard_env(
            workdir,
            RUNC_GUARD_RUNTIME=ctr.runtime(),
            RUNC_GUARD_KILL_STRAGGLERS="false",
            RUNC_GUARD_DELETE_TIMEOUT="20",
        )
        proc = subprocess.Popen(
            [shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            pending = os.path.join(workdir, "pending")
            assert wait_for(lambda: os.path.isdir(pending) and bool(os.listdir(pending)), 10)
            assert wait_for(lambda: guard_is_waiting(proc.pid), 10, 0.005)
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert proc.returncode == 128 + signal.SIGINT
        assert err.count("\n") == 1 and "interrupted by SIGINT" in err
        assert straggler.poll() is None
        assert len(os.listdir(pending)) == 1
    SUMMARY.append(f"case 7 SIGINT mid-wait: runc-guard exit {proc.returncode}, no traceback, record kept")


def _installed(module: str) -> str:
    """The installed (non-editable) source file the shim imports, e.g. ``runc_guard/shim/entry.py``."""
    import sysconfig

    return os.path.join(sysconfig.get_paths()["purelib"], module)


def sigint_while_importing(shim: str, module: str, tmp: str) -> subprocess.CompletedProcess[str]:
    """Run a delete whose import of ``module`` stalls 2 s (strace delays its first stat), SIGINT it then.

    Deterministic where a timed SIGINT is not: the window between the interpreter's start and
    runc-guard's handlers is ~30 ms on this machine and moves with load.
    """
    root = os.path.join(tmp, "root")
    os.makedirs(os.path.join(root, "c1"), exist_ok=True)
    with open(os.path.join(root, "c1", "state.json"), "w") as f:
        # a dead init (no pid can be above PID_MAX_LIMIT) and no cgroups: the delete path, no kernel
        json.dump(
            {"id": "c1", "init_process_pid": (4 << 20) + 7, "init_process_start": 1, "cgroup_paths": {}}, f
        )
    env = {
        **os.environ,
        "RUNC_GUARD_RUNTIME": script(os.path.join(tmp, "rt"), "exec sleep 5"),
        "RUNC_GUARD_CONFIG": os.path.join(tmp, "none.toml"),
        "RUNC_GUARD_CACHE_DIR": os.path.join(tmp, "cache"),
        "RUNC_GUARD_PENDING_DIR": os.path.join(tmp, "pending"),
        "RUNC_GUARD_LOG_FILE": os.path.join(tmp, "events.jsonl"),
        "RUNC_GUARD_REPORTER_LINGER": "0",
        "RUNC_GUARD_STATS_FILE": os.path.join(tmp, "stats.jsonl"),
        "RUNC_GUARD_JOURNAL_SOCKET": os.path.join(tmp, "no-journald"),
    }
    argv = [
        STRACE, "-o", "/dev/null", "-P", _installed(module), "-e", "inject=all:delay_enter=2000000:when=1",
        shim, "--root", root, "delete", "--force", "c1",
    ]  # fmt: skip
    with stall.traced(argv, stderr=subprocess.PIPE, env=env, preexec_fn=_default_sigint) as proc:
        tracee = stall.tracee(proc.pid, shim)
        assert stall.held_in_a_syscall(tracee), f"the import of {module} never stalled under strace"
        masks = _signal_masks(tracee)
        os.kill(tracee, signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(argv, proc.returncode, masks, err)


def _default_sigint() -> None:
    """SIGINT at its default in the child, as containerd starts a runtime: a suite started in the
    background (bash ignores SIGINT for an ``&`` job) would pass SIG_IGN on, and runc-guard rightly
    leaves an ignored signal ignored (measured: SigIgn 0x1001007, then exit 75 in both cases)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_masks(pid: int) -> str:
    """The tracee's blocked, ignored and caught signals when the SIGINT is sent (/proc/<pid>/status):
    a failure says whether the signal could have reached the note-only handler at all."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        return " ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
    return "(status unreadable)"


STRACE = stall.STRACE
needs_strace = prereq.needs(os.access(STRACE, os.X_OK), f"{STRACE} (apt-get install strace)")


@needs_strace
def test_sigint_while_the_delete_path_loads_prints_no_traceback(python_entry: str, tmp_path: Any) -> None:
    """Case 7: SIGINT right after the delete starts (while ``runc_guard.delete.run`` is imported): the
    shim's note-only handler holds it, the delete honours it first thing: exit 130, one line, no
    traceback, the runtime never ran."""
    proc = sigint_while_importing(python_entry, "runc_guard/delete/run.py", str(tmp_path))
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
    assert proc.returncode == 128 + signal.SIGINT, (proc.stderr, proc.stdout)
    assert proc.stderr.count("\n") == 1 and "interrupted by SIGINT" in proc.stderr
    SUMMARY.append(
        f"case 7 SIGINT while the delete path loads: runc-guard exit {proc.returncode}, no traceback"
    )


@needs_strace
def test_sigint_while_the_shim_loads_prints_no_traceback(python_entry: str, tmp_path: Any) -> None:
    """Case 7: SIGINT while the shim itself is imported (right after exec): no traceback, exit 130."""
    proc = sigint_while_importing(python_entry, "runc_guard/shim/entry.py", str(tmp_path))
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
    assert proc.returncode == 128 + signal.SIGINT, (proc.stderr, proc.stdout)
