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
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from labkit.kernel import FREEZER, container_with_hold, read_lines, wait_for


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
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
