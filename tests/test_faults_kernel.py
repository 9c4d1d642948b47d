"""Faults on the real kernel: nothing outside the container touched, nothing lost (issue 7).

Each test names the fault it injects; docs/faults.md lists them with their
results. Stand-in runtimes are small /bin/sh scripts, so the fault is
exactly the one intended; cgroups are real and made by ``crafted_container``.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from labkit.kernel import (
    RuncContainer,
    container_with_hold,
    crafted_container,
    exited,
    guard_is_waiting,
    procs,
    reported_events,
    script,
    wait_for,
)
from labkit.scenario import guard_env

pytestmark = pytest.mark.kernel


def delete(shim: str, root: str, cid: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shim, "--root", root, "delete", "--force", cid],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


def test_runtime_killed_by_signal_is_128_plus_n(shim_binary: str, workdir: str) -> None:
    """Fault: the runtime dies by SIGKILL. Reported as 137; state kept so no record is needed."""
    with crafted_container(workdir) as ctr:
        runtime = script(os.path.join(workdir, "rt"), "kill -9 $$")
        proc = delete(shim_binary, ctr.root, ctr.id, guard_env(workdir, RUNC_GUARD_RUNTIME=runtime))
        assert proc.returncode == 128 + signal.SIGKILL
        assert os.listdir(os.path.join(workdir, "pending")) == []  # the runtime still owns it


@pytest.mark.parametrize("status", [1, 3])
def test_runtime_failure_is_returned_unchanged(shim_binary: str, workdir: str, status: int) -> None:
    """Fault: the runtime exits non-zero and keeps its state. Its status and words come back as is,
    and runc-guard removes nothing: the container is still the runtime's. (Its host-PID straggler
    was SIGKILLed before the runtime ran, as runc's own destroy does: init was already dead.)"""
    with crafted_container(workdir) as ctr:
        inside = ctr.add_process()
        runtime = script(os.path.join(workdir, "rt"), f"echo 'runtime says no' >&2; exit {status}")
        proc = delete(shim_binary, ctr.root, ctr.id, guard_env(workdir, RUNC_GUARD_RUNTIME=runtime))
        assert proc.returncode == status
        assert "runtime says no" in proc.stderr
        assert all(os.path.isdir(d) for d in ctr.dirs)
        assert os.path.exists(ctr.state_path())
        assert wait_for(lambda: inside.poll() is not None, 5) and inside.returncode == -signal.SIGKILL
        assert os.listdir(os.path.join(workdir, "pending")) == []


def test_runtime_that_lost_state_but_left_cgroup_is_finished(shim_binary: str, workdir: str) -> None:
    """Fault: the runtime removes its state, exits 1, leaves the cgroups: runc-guard removes them
    and passes the runtime's status on; nothing is left to record."""
    with crafted_container(workdir) as ctr:
        ctr.add_process()
        runtime = ctr.runtime(status=1)
        proc = delete(shim_binary, ctr.root, ctr.id, guard_env(workdir, RUNC_GUARD_RUNTIME=runtime))
        assert proc.returncode == 1, proc.stderr
        assert not any(os.path.exists(d) for d in ctr.dirs)
        assert os.listdir(os.path.join(workdir, "pending")) == []


def test_no_kill_runs_the_runtime_first_then_keeps_the_record(shim_binary: str, workdir: str) -> None:
    """Fault: init dead, runc-guard may not kill (kill_stragglers = false) and the runtime kills nothing
    either: the runtime runs first (its own kill semantics apply), then the process keeps the cgroup busy
    past the deadline: exit 75 in time, the record stays for a retry or the sweep."""
    with crafted_container(workdir) as ctr:
        inside = ctr.add_process()
        marker = os.path.join(workdir, "runtime-ran")
        env = guard_env(
            workdir,
            RUNC_GUARD_RUNTIME=ctr.runtime(f"touch {marker}"),
            RUNC_GUARD_KILL_STRAGGLERS="false",
            RUNC_GUARD_DELETE_TIMEOUT="1",
        )
        started = time.monotonic()
        proc = delete(shim_binary, ctr.root, ctr.id, env)
        took = time.monotonic() - started
        assert proc.returncode == 75, proc.stderr
        # Without the deadline the busy cgroup would hold the delete until delete()'s 60 s timeout.
        assert took < 30, took
        assert "still in use" in proc.stderr and "does not exist" not in proc.stderr
        assert os.path.exists(marker)
        assert len(os.listdir(os.path.join(workdir, "pending"))) == 1
        assert inside.poll() is None


def test_hung_runtime_dies_with_runc_guard(shim_binary: str, workdir: str) -> None:
    """Fault: the runtime hangs and go-runc SIGKILLs runc-guard: the runtime dies too, record kept."""
    with crafted_container(workdir) as ctr:
        pidfile = os.path.join(workdir, "rt.pid")
        runtime = script(os.path.join(workdir, "rt"), f"echo $$ > {pidfile}; exec sleep 600")
        proc = subprocess.Popen(
            [shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
            env=guard_env(workdir, RUNC_GUARD_RUNTIME=runtime),
            stderr=subprocess.DEVNULL,
        )
        try:
            assert wait_for(lambda: os.path.exists(pidfile) and os.path.getsize(pidfile) > 0, 10)
            with open(pidfile) as f:
                runtime_pid = int(f.read())
            proc.kill()
            proc.wait()
            assert wait_for(lambda: not os.path.exists(f"/proc/{runtime_pid}"), 5), "runtime outlived us"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert len(os.listdir(os.path.join(workdir, "pending"))) == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signals_are_forwarded_to_the_runtime(shim_binary: str, workdir: str, sig: int) -> None:
    """Fault: SIGTERM/SIGINT/SIGHUP while the runtime runs: forwarded; its answer is our status."""
    with crafted_container(workdir) as ctr:
        got = os.path.join(workdir, "got")
        ready = os.path.join(workdir, "ready")
        body = (
            f"trap 'echo {int(sig)} > {got}; exit 7' {int(sig)}\n"
            f"touch {ready}\nwhile true; do sleep 0.05; done"
        )
        runtime = script(os.path.join(workdir, "rt"), body)
        proc = subprocess.Popen(
            [shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
            env=guard_env(workdir, RUNC_GUARD_RUNTIME=runtime),
        )
        try:
            assert wait_for(lambda: os.path.exists(ready), 10)
            proc.send_signal(sig)
            assert proc.wait(10) == 7
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with open(got) as f:
            assert int(f.read()) == int(sig)


def test_read_only_cgroupfs_fails_fast(shim_binary: str, workdir: str) -> None:
    """Fault: EROFS (memory hierarchy read-only in a private mount namespace): exit 74 at once."""
    with crafted_container(workdir) as ctr:
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=ctr.runtime(), RUNC_GUARD_DELETE_TIMEOUT="20")
        sh = (
            "mount --make-rprivate / && mount -o remount,bind,ro /sys/fs/cgroup/memory && "
            f"exec {shim_binary} --root {ctr.root} delete --force {ctr.id}"
        )
        started = time.monotonic()
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", sh],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=60,
        )
        elapsed = time.monotonic() - started
        assert proc.returncode == 74, proc.stderr
        assert "EROFS" in proc.stderr
        assert elapsed < 10, "EROFS must not be retried until the deadline"
        assert len(os.listdir(os.path.join(workdir, "pending"))) == 1


def test_frozen_v1_freezer_hits_deadline_without_busy_loop(shim_binary: str, workdir: str) -> None:
    """Fault: the container's own v1 freezer is FROZEN: SIGKILL stays pending; exit 75, few wake-ups."""
    with crafted_container(workdir) as ctr:
        ctr.add_process(("memory", "unified", "freezer"))
        with open(os.path.join(ctr.dir_in("freezer"), "freezer.state"), "w") as f:
            f.write("FROZEN")
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=ctr.runtime(), RUNC_GUARD_DELETE_TIMEOUT="1.5")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = delete(shim_binary, ctr.root, ctr.id, env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert proc.returncode == 75, proc.stderr
        (entry,) = [e for e in reported_events(workdir) if e["event"] == "delete"]
        # woken by cgroup.events or every 250 ms at most: a busy loop would make thousands of attempts
        assert entry["attempts"] < 40, entry
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        assert cpu < 1.0, "waiting 1.5 s must not burn a CPU"


def test_frozen_v2_cgroup_is_killed_and_removed(shim_binary: str, workdir: str) -> None:
    """Fault: cgroup.freeze 1 on the v2 cgroup: fatal signals thaw on v2, so it finishes cleanly."""
    with crafted_container(workdir) as ctr:
        inside = ctr.add_process(("memory", "unified"))
        with open(os.path.join(ctr.dir_in("unified"), "cgroup.freeze"), "w") as f:
            f.write("1")
        proc = delete(shim_binary, ctr.root, ctr.id, guard_env(workdir, RUNC_GUARD_RUNTIME=ctr.runtime()))
        assert proc.returncode == 0, proc.stderr
        assert wait_for(lambda: inside.poll() is not None, 5)
        assert not any(os.path.exists(d) for d in ctr.dirs)


def test_two_deletes_of_one_container(shim_binary: str, workdir: str) -> None:
    """Fault: the shim and a retry delete the same id at once: 0 left, no spurious runc-guard error."""
    ctr = RuncContainer.start(workdir, children=3)
    try:
        os.kill(ctr.init_pid(), signal.SIGKILL)
        env = guard_env(workdir)
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: delete(shim_binary, ctr.root, ctr.id, env), range(2)))
        assert wait_for(lambda: not ctr.cgroup_dirs(), 5)
        assert 0 in [r.returncode for r in results]
        for r in results:
            assert "Traceback" not in r.stderr
            # the loser may only get runc's own answer, which containerd treats as success
            assert r.returncode == 0 or "does not exist" in r.stderr, r.stderr
        assert os.listdir(os.path.join(workdir, "pending")) == []
    finally:
        ctr.destroy()


def test_fifty_concurrent_deletes(shim_binary: str, workdir: str) -> None:
    """Fault: 50 deletes of different containers at once: 0 leaks, 0 crashes."""
    containers: list[RuncContainer] = []
    try:
        for _ in range(50):
            containers.append(RuncContainer.start(workdir, children=1))
        for ctr in containers:
            os.kill(ctr.init_pid(), signal.SIGKILL)
        # 50 interpreters starting at once on a small machine can take seconds: the deadline
        # counts from process start, and this test is about concurrency, not the deadline.
        env = guard_env(workdir, RUNC_GUARD_DELETE_TIMEOUT="15")
        with ThreadPoolExecutor(50) as pool:
            results = list(pool.map(lambda c: delete(shim_binary, c.root, c.id, env), containers))
        assert [r.returncode for r in results] == [0] * 50, [r.stderr for r in results if r.returncode]
        assert [c for c in containers if c.cgroup_dirs()] == []
        assert os.listdir(os.path.join(workdir, "pending")) == []
    finally:
        for ctr in containers:
            ctr.destroy()


def test_unwritable_pending_dir_still_deletes(shim_binary: str, workdir: str) -> None:
    """Fault: pending_dir cannot be created: the delete still happens and says why it could not record."""
    blocker = os.path.join(workdir, "blocker")
    open(blocker, "w").close()
    with crafted_container(workdir) as ctr:
        env = guard_env(
            workdir, RUNC_GUARD_RUNTIME=ctr.runtime(), RUNC_GUARD_PENDING_DIR=os.path.join(blocker, "pending")
        )
        proc = delete(shim_binary, ctr.root, ctr.id, env)
        assert proc.returncode == 0
        assert "cannot record pending cgroups" in proc.stderr
        assert not any(os.path.exists(d) for d in ctr.dirs)


def test_full_disk_pending_dir_still_deletes(shim_binary: str, workdir: str) -> None:
    """Fault: ENOSPC on the pending dir (a full 64 KiB tmpfs): the delete still happens."""
    mnt = os.path.join(workdir, "small")
    os.mkdir(mnt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt], check=True)
    try:
        os.mkdir(os.path.join(mnt, "pending"))
        fd = os.open(os.path.join(mnt, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass  # ENOSPC: the disk is full now
        finally:
            os.close(fd)
        with crafted_container(workdir) as ctr:
            env = guard_env(
                workdir, RUNC_GUARD_RUNTIME=ctr.runtime(), RUNC_GUARD_PENDING_DIR=os.path.join(mnt, "pending")
            )
            proc = delete(shim_binary, ctr.root, ctr.id, env)
            assert proc.returncode == 0
            assert "No space left on device" in proc.stderr
            assert not any(os.path.exists(d) for d in ctr.dirs)
    finally:
        subprocess.run(["umount", mnt], check=True)


@pytest.mark.parametrize("mode", ["absent", "refusing", "full"])
def test_journald_trouble_never_blocks_delete(shim_binary: str, workdir: str, mode: str) -> None:
    """Fault: journald absent, its socket refusing, or not reading: delete succeeds, entry in the file."""
    path = os.path.join(workdir, "journal.socket")
    holder = None
    if mode in ("refusing", "full"):
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        holder.bind(path)
        if mode == "refusing":
            holder.close()  # the socket file stays; nobody is behind it
            holder = None
        else:
            holder.setblocking(False)
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                while True:
                    sender.sendto(b"x" * 4096, socket.MSG_DONTWAIT, path)
            except BlockingIOError:
                pass
            finally:
                sender.close()
    try:
        with crafted_container(workdir) as ctr:
            env = guard_env(workdir, RUNC_GUARD_RUNTIME=ctr.runtime(), RUNC_GUARD_JOURNAL_SOCKET=path)
            started = time.monotonic()
            proc = delete(shim_binary, ctr.root, ctr.id, env)
            assert proc.returncode == 0, proc.stderr
            assert time.monotonic() - started < 10
            events = reported_events(workdir)
            assert [e["outcome"] for e in events if e["event"] == "delete"] == ["removed"]
    finally:
        if holder is not None:
            holder.close()


def test_bad_settings_on_delete_never_change_its_end(shim_binary: str, workdir: str) -> None:
    """Fault: a typo'd key in the settings file: the delete ends as without it (exit 0, cgroups
    removed); the problem is logged once per version of the file, not by every delete."""
    with open(guard_env(workdir)["RUNC_GUARD_CONFIG"], "w") as f:
        f.write("delete_timout = 5\n")
    for _ in range(2):
        with crafted_container(workdir) as ctr:
            env = guard_env(workdir, RUNC_GUARD_RUNTIME=ctr.runtime())
            proc = delete(shim_binary, ctr.root, ctr.id, env)
            assert (proc.returncode, proc.stderr) == (0, "")
            assert not any(os.path.exists(d) for d in ctr.dirs)
    events = reported_events(workdir)
    problems = [e for e in events if e["event"] == "config_invalid"]
    assert len(problems) == 1 and "delete_timout" in problems[0]["reason"]
    assert [e["outcome"] for e in events if e["event"] == "delete"] == ["removed", "removed"]


def test_sigkill_mid_wait_then_retry_finishes(shim_binary: str, workdir: str) -> None:
    """Fault: runc-guard SIGKILLed mid-wait (go-runc): record and state survive; a retry finishes."""
    with container_with_hold(workdir, children=3, held=2) as (ctr, hold):
        os.kill(ctr.init_pid(), signal.SIGKILL)
        env = guard_env(workdir, RUNC_GUARD_DELETE_TIMEOUT="60")
        proc = subprocess.Popen([shim_binary, "--root", ctr.root, "delete", "--force", ctr.id], env=env)
        try:
            # init is dead, so runc-guard waits for the held pids *before* runc runs: its record is
            # written first, then it waits (runc's state stays until the cgroups are empty)
            pending_dir = os.path.join(workdir, "pending")
            assert wait_for(lambda: os.path.isdir(pending_dir) and bool(os.listdir(pending_dir)), 20)
            assert wait_for(lambda: guard_is_waiting(proc.pid), 10, 0.005)
            proc.kill()
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        pending = os.path.join(workdir, "pending")
        assert len(os.listdir(pending)) == 1
        assert ctr.cgroup_dirs(), "the held processes must still pin the cgroups here"
        hold.release()
        assert wait_for(lambda: not any(procs(d) for d in ctr.cgroup_dirs()), 10)
        # runc never ran, so its state is still there: containerd's retry (the normal path)
        # deletes again, and this time the cgroups are empty before runc runs.
        retry = subprocess.run([shim_binary, "--root", ctr.root, "delete", "--force", ctr.id],
                               capture_output=True, text=True, env=env, check=False, timeout=60)
        assert retry.returncode == 0, retry.stderr
        assert ctr.cgroup_dirs() == []
        assert not os.path.exists(os.path.join(ctr.root, ctr.id))
        assert os.listdir(pending) == []


def test_blocking_runtime_is_stopped_at_the_deadline(shim_binary: str, workdir: str) -> None:
    """Fault: the runtime's own delete blocks (runc 1.1.5 polls a dying init for up to 10 s):
    the deadline covers it; SIGTERM, then SIGKILL; exit 75 in time, record kept, reason given."""
    with crafted_container(workdir) as ctr:
        pidfile = os.path.join(workdir, "runtime.pid")
        blocking = ctr.runtime(f"echo $$ > {pidfile}; exec sleep 120")
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=blocking, RUNC_GUARD_DELETE_TIMEOUT="1.5")
        started = time.monotonic()
        proc = delete(shim_binary, ctr.root, ctr.id, env)
        elapsed = time.monotonic() - started
        assert proc.returncode == 75, proc.stderr
        # The outcome: the runtime is gone when runc-guard returns (stopped, not left behind).
        with open(pidfile) as f:
            runtime_pid = int(f.read())
        assert wait_for(lambda: not os.path.exists(f"/proc/{runtime_pid}"), 5), "the runtime outlived us"
        # A bound far from both the 1.5 s deadline and the runtime's own 120 s.
        assert elapsed < 30, elapsed
        assert "delete still running after" in proc.stderr and "does not exist" not in proc.stderr
        assert len(os.listdir(os.path.join(workdir, "pending"))) == 1


@pytest.mark.parametrize("force", [True, False])
def test_a_runtime_stopped_at_the_deadline_leaves_no_running_container(
    shim_binary: str, workdir: str, force: bool
) -> None:
    """Fault: the runtime has not reached its kill of a running container when the deadline
    comes (a node so loaded that runc barely started; seen in the VM lab under emulation:
    a pod's pause kept running after containerd forgot the pod). With ``--force`` runc-guard
    kills the container's init itself before it stops the runtime, as --force asked the
    runtime to; without ``--force`` (a delete that must fail on a running container) it
    kills nothing. Either way exit 75 with the record kept."""
    ctr = RuncContainer.start(workdir, children=1)
    try:
        init = ctr.init_pid()
        # Stopped (SIGTERM) while it waits, it takes its sleep along: nothing outlives the test.
        slow = script(os.path.join(workdir, "slow-runc"),
                      f"trap 'kill $!; exit 143' TERM\nsleep 30 & wait $!\nexec {ctr.runc} \"$@\"")
        env = guard_env(workdir, RUNC_GUARD_RUNTIME=slow, RUNC_GUARD_DELETE_TIMEOUT="1")
        argv = [shim_binary, "--root", ctr.root, "delete", *(["--force"] if force else []), ctr.id]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=60)
        assert proc.returncode == 75, proc.stderr
        assert "delete still running after" in proc.stderr
        assert len(os.listdir(os.path.join(workdir, "pending"))) == 1
        (entry,) = [e for e in reported_events(workdir) if e.get("event") == "delete"]
        if force:
            assert wait_for(lambda: exited(init), 5), "the container's init outlived a delete --force"
            assert entry["init_killed_at_deadline"] == init
        else:
            assert not exited(init), "a plain delete killed the init"
            assert "init_killed_at_deadline" not in entry
    finally:
        ctr.destroy()


@pytest.mark.parametrize("helped", [True, False, None])
def test_the_runtime_gets_a_grace_to_finish_after_the_deadline_kill(
    workdir: str, helped: bool | None
) -> None:
    """run_runtime_child: when ``at_deadline`` did the runtime's remaining work (True), a runtime
    that then ends by itself within FINISH_GRACE keeps its own status; otherwise (False, or the
    hook raised: None) it is stopped, and reaped."""
    from runc_guard.delete.runtime_child import run_runtime_child

    done = os.path.join(workdir, "init-killed")
    runtime = script(os.path.join(workdir, "rt"),
                     f"trap 'exit 143' TERM\nwhile [ ! -e {done} ]; do sleep 0.02; done\nexit 0")

    def at_deadline() -> bool:
        if helped is None:
            raise PermissionError(1, "a kill the kernel refused")
        if helped:
            open(done, "w").close()
        return helped

    run = run_runtime_child(runtime, [], time.monotonic() + 0.5, at_deadline=at_deadline)
    if helped:
        assert (run.status, run.timed_out) == (0, False)
    else:
        assert run.timed_out and run.status in (143, 128 + signal.SIGKILL)
