"""The front door's cost: runc alone vs the launcher vs the Python entry, side by side.

CPU (wait4 rusage of the whole call) and wall medians per command, all three run
round-robin in one process on the same real container (labkit.kernel.RuncContainer),
with a real settings file routing to runc (so the launcher's routing cache is the
path measured, and the Python entry's marshal cache), plus the delete of an id nobody
knows. Target (issue 29): launcher - runc <= 1 ms, CPU and wall, for every command.

Run as root: ``python -m bench.launcher [--rounds N]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence

from bench.common import balanced_order, print_table, run_measured
from bench.passthrough import COMMANDS as PASSTHROUGH
from labkit.kernel import RuncContainer

#: The passthrough commands, plus the delete of a container nobody knows: containerd 1.6
#: sends one after every normal task delete, and the launcher execs the runtime for it.
COMMANDS = {**PASSTHROUGH, "delete (unknown id)": lambda c: ["--root", c.root, "delete", "--force", "gone"]}
#: A known container's delete that steps aside at start-up (a crash storm's common case): the id
#: has a state directory whose state.json runc refuses (exit 1), so every round is the same call;
#: ``delete_timeout = 0`` leaves no budget, so both front doors step aside at once (as with every
#: delete slot held) and pay only the record, the spool entry and the runtime.
ASIDE = "delete (stepped aside)"
ASIDE_ID = "rgbench-aside"


def measure(candidates: dict[str, Sequence[str]], rounds: int, env: dict[str, str]) -> dict[str, list]:
    """Every candidate ``rounds`` times in one carryover-balanced order (shared noise, and each
    follows each equally often: common.balanced_order); 3 warm-up runs each."""
    names = list(candidates)
    for name in names:
        for _ in range(3):
            run_measured(candidates[name], env)
    samples: dict[str, list] = {n: [] for n in names}
    for name in balanced_order(names, rounds):
        done = run_measured(candidates[name], env)
        if done.status not in (0, 1):
            raise RuntimeError(f"{candidates[name]} exited {done.status}")
        samples[name].append(done)
    return samples


def aside_settings(workdir: str, runc: str, env: dict[str, str]) -> dict[str, str]:
    """A settings file of its own for the stepped-aside delete: no budget, every path in ``workdir``,
    no finisher (it would re-run the refused delete in the background, beside the rounds)."""
    config = os.path.join(workdir, "aside.toml")
    with open(config, "w") as f:
        f.write(f'runtime = "{runc}"\ndelete_timeout = 0.0\nfinish_window = 0.0\n'
                f'log_file = "{workdir}/aside-events.jsonl"\njournal_socket = "{workdir}/no-journald"\n'
                f'pending_dir = "{workdir}/aside-pending"\nstats_file = "{workdir}/aside-stats.jsonl"\n')
    return {**env, "RUNC_GUARD_CONFIG": config, "RUNC_GUARD_CACHE_DIR": os.path.join(workdir, "aside-cache")}


def aside_call(ctr: RuncContainer) -> list[str]:
    os.makedirs(os.path.join(ctr.root, ASIDE_ID), exist_ok=True)
    with open(os.path.join(ctr.root, ASIDE_ID, "state.json"), "w") as f:
        f.write("{}")
    return ["--root", ctr.root, "delete", "--force", ASIDE_ID]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--commands", default=",".join(COMMANDS))
    args = parser.parse_args()
    bindir = os.path.dirname(sys.executable)
    launcher, entry = os.path.join(bindir, "runc-guard"), os.path.join(bindir, "runc-guard.py")
    runc = shutil.which("runc") or "/usr/sbin/runc"
    rows = []
    with tempfile.TemporaryDirectory(prefix="rgbench-") as workdir:
        env = dict(os.environ, RUNC_GUARD_CACHE_DIR=os.path.join(workdir, "cache"),
                   RUNC_GUARD_CONFIG=os.path.join(workdir, "config.toml"))
        for key in ("RUNC_GUARD_RUNTIME", "RUNC_GUARD_RUNTIMES", "RUNC_GUARD_STATE_DIR"):
            env.pop(key, None)
        with open(env["RUNC_GUARD_CONFIG"], "w") as f:
            f.write(f'runtime = "{runc}"\n')
        aside_env = aside_settings(workdir, runc, env)
        ctr = RuncContainer.start(workdir, children=1)
        try:
            for name in [*args.commands.split(","), ASIDE]:
                tail = COMMANDS[name](ctr) if name != ASIDE else aside_call(ctr)
                got = measure({"runc": [runc, *tail], "launcher": [launcher, *tail],
                               "python": [entry, *tail]}, args.rounds, env if name != ASIDE else aside_env)
                cpu = {k: statistics.median(m.cpu for m in v) * 1000 for k, v in got.items()}
                wall = {k: statistics.median(m.elapsed for m in v) * 1000 for k, v in got.items()}
                rows.append((name, cpu["runc"], cpu["launcher"], cpu["python"], cpu["launcher"] - cpu["runc"],
                             wall["runc"], wall["launcher"], wall["python"], wall["launcher"] - wall["runc"]))
        finally:
            ctr.destroy()
    print_table(
        f"Front door: medians of {args.rounds} interleaved rounds (ms; CPU = wait4 user+sys)",
        ["command", "CPU runc", "CPU launcher", "CPU python entry", "CPU launcher - runc",
         "wall runc", "wall launcher", "wall python entry", "wall launcher - runc"],
        rows,
    )
    worst = max(max(r[4], r[8]) for r in rows)
    print(f"\nworst launcher - runc = {worst:.2f} ms (target <= 1 ms, CPU and wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
