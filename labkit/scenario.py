"""The incident in miniature, runnable in-process or inside a private mount namespace.

A host-PID busybox container with several children; some children are held in a
frozen v1 freezer (a pending SIGKILL cannot kill them); init is SIGKILLed so runc
sees the container Stopped (Path B); then ``<binary> delete --force`` runs while a
timer releases the hold after ``hold_seconds``. The result says how many cgroup
directories were left, the binary's exit status, stderr, the ``--log`` lines and
the pending records. ``python -m labkit.scenario`` runs it and prints JSON,
which is how the kernel tests run it under pure cgroup v2 (``unshare -m``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from labkit.kernel import (
    FREEZER,
    FreezerHold,
    RuncContainer,
    container_with_hold,
    procs,
    read_lines,
    unique,
    wait_for,
    wait_reported,
)

SANDBOX_TYPE = "io.kubernetes.cri.container-type"
SANDBOX_ID = "io.kubernetes.cri.sandbox-id"


def gone(pid: int) -> bool:
    """The process has exited (or is a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True


def pod_teardown(
    front: str, workdir: str, env: dict[str, str], settle: float, prefix: str = "rgtest"
) -> dict[str, object]:
    """A CRI pod's Path B through ``front``: the sandbox's delete timed, its sibling looked at later.

    A sandbox and one sibling (runc 1.1.5, host PID, CRI annotations, so runc's state
    labels carry them); both inits SIGKILLed while the sibling's 5 children are held
    in a frozen freezer for 5 s; ``front --root R delete --force <sandbox>`` is timed,
    as containerd's dead-shim cleanup runs it. ``settle`` s after the kill (or as soon
    as the sibling is gone): what is left of the sibling. Ids and cgroups start with ``prefix``.
    """
    sandbox_id, pod = unique(f"{prefix}-sb"), unique(prefix)
    sandbox = RuncContainer.start(workdir, children=1, parent=pod, cid=sandbox_id,
                                  annotations={SANDBOX_TYPE: "sandbox", SANDBOX_ID: sandbox_id})
    sibling = hold = None
    try:
        sibling = RuncContainer.start(workdir, children=5, parent=pod, cid=unique(f"{prefix}-ctr"),
                                      annotations={SANDBOX_TYPE: "container", SANDBOX_ID: sandbox_id})
        hold = FreezerHold.create()
        hold.hold(sibling.children())
        inits = [sandbox.init_pid(), sibling.init_pid()]
        for pid in inits:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: all(gone(p) for p in inits), 5)
        started = time.monotonic()
        done = subprocess.run([front, "--root", sandbox.root, "delete", "--force", sandbox_id],
                              capture_output=True, text=True, env=env, check=False, timeout=60)
        reply = time.monotonic() - started
        at_reply = {"sibling_dirs": len(sibling.cgroup_dirs()), "held": hold.pids == procs(hold.path)}
        time.sleep(max(0.0, killed + 5.0 - time.monotonic()))
        hold.release()
        state = os.path.join(sibling.root, sibling.id, "state.json")

        def sibling_gone() -> bool:
            return not sibling.cgroup_dirs() and not os.path.exists(state)

        wait_for(sibling_gone, max(0.0, killed + settle - time.monotonic()), 0.2)
        return {"status": done.returncode, "stderr": done.stderr, "reply_s": reply, "at_reply": at_reply,
                "sandbox_dirs": len(sandbox.cgroup_dirs()), "sibling_dirs": len(sibling.cgroup_dirs()),
                "sibling_state": os.path.exists(state), "settled_s": time.monotonic() - killed,
                "sibling_id": sibling.id, "sandbox_id": sandbox_id}
    finally:
        if hold is not None:
            hold.destroy()
        if sibling is not None:
            sibling.destroy()
        sandbox.destroy()


@contextlib.contextmanager
def every_slot_taken(cache_dir: str) -> Iterator[None]:
    """A crash storm's load: every delete slot held (flock), so a delete steps aside."""
    import fcntl

    from runc_guard.shim.startup import STORM_MARK, slots

    directory = os.path.join(cache_dir, "startup")
    os.makedirs(directory, exist_ok=True)
    fds = [os.open(os.path.join(directory, f"slot-{i}"), os.O_RDWR | os.O_CREAT, 0o600)
           for i in range(slots())]
    try:
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):  # the storm the deletes marked is over
            os.unlink(os.path.join(directory, STORM_MARK))


def guard_env(workdir: str, **overrides: str) -> dict[str, str]:
    """Environment that points every runc-guard path at ``workdir``."""
    env = dict(os.environ)
    env.update(
        RUNC_GUARD_CONFIG=os.path.join(workdir, "config.toml"),
        RUNC_GUARD_CACHE_DIR=os.path.join(workdir, "cache"),
        RUNC_GUARD_PENDING_DIR=os.path.join(workdir, "pending"),
        RUNC_GUARD_LOG_FILE=os.path.join(workdir, "events.jsonl"),
        RUNC_GUARD_STATS_FILE=os.path.join(workdir, "stats.jsonl"),
        RUNC_GUARD_JOURNAL_SOCKET=os.path.join(workdir, "no-journald.socket"),
        # the reporter exits as soon as the spool is empty: a test waits for it (wait_reported)
        RUNC_GUARD_REPORTER_LINGER="0",
        # the finisher is on by default (60 s): a test about something else keeps it off, since a
        # detached finisher would outlive the test; the finisher's own tests turn it on
        RUNC_GUARD_FINISH_WINDOW="0",
    )
    env.update(overrides)
    return env


def run_leak_scenario(
    binary: str,
    workdir: str,
    hold_seconds: float,
    env: dict[str, str],
    children: int = 4,
    held: int = 2,
    nested: bool = True,
    freezer_root: str = FREEZER,
    v2_frozen_first: bool = False,
) -> dict[str, Any]:
    """Run one Path B delete through ``binary``; return what happened (nothing is asserted)."""
    log_path = os.path.join(workdir, "log.json")
    with container_with_hold(
        workdir, children, held, freezer_root, v2_frozen_first=v2_frozen_first
    ) as (ctr, hold):
        if nested:
            # a child cgroup made inside the container, as systemd-in-a-container would
            ctr.make_nested()
        init = ctr.init_pid()
        os.kill(init, signal.SIGKILL)
        wait_for(lambda: init not in ctr.pids(), 5)
        timer = threading.Timer(hold_seconds, hold.release)
        timer.start()
        started = time.monotonic()
        try:
            proc = subprocess.run(
                [
                    binary,
                    "--root",
                    ctr.root,
                    "--log",
                    log_path,
                    "--log-format",
                    "json",
                    "delete",
                    "--force",
                    ctr.id,
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
        finally:
            elapsed = time.monotonic() - started
            timer.cancel()
        left = ctr.cgroup_dirs()
        pending_dir = env.get("RUNC_GUARD_PENDING_DIR", "")
        pending = sorted(os.listdir(pending_dir)) if os.path.isdir(pending_dir) else []
        log_lines = read_lines(log_path)
        return {
            "container_id": ctr.id,
            "cgroup_relative": ctr.cgroup_relative,
            "exit_status": proc.returncode,
            "stderr": proc.stderr,
            "stdout": proc.stdout,
            "elapsed_s": round(elapsed, 3),
            "left": left,
            "pending": pending,
            "log_lines": log_lines,
            "state_exists": os.path.exists(os.path.join(ctr.root, ctr.id, "state.json")),
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--hold", type=float, default=1.5)
    parser.add_argument("--freezer-root", default=FREEZER)
    parser.add_argument("--delete-timeout", default="")
    parser.add_argument("--v2-frozen-first", action="store_true",
                        help="pure v2: freeze the held children in a cgroup2 child before the v1 hold")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rgtest-") as workdir:
        env = guard_env(workdir)
        if args.delete_timeout:
            env["RUNC_GUARD_DELETE_TIMEOUT"] = args.delete_timeout
        result = run_leak_scenario(
            args.binary, workdir, args.hold, env, freezer_root=args.freezer_root,
            v2_frozen_first=args.v2_frozen_first,
        )  # fmt: skip
        # The delete's detached reporter writes into workdir (the fallback file): let it finish
        # first, or it races the directory's removal (ENOTEMPTY) and leaves what it wrote behind.
        wait_reported(env["RUNC_GUARD_CACHE_DIR"], timeout=30)
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
