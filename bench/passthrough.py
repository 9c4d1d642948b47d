"""Passthrough cost: ``runc-guard <cmd>`` vs ``runc <cmd>`` vs a bare ``python -c pass``.

Target (issue 2/6): (runc-guard - runc) / bare interpreter <= 1.3 for every
command, goal 1.1. Run as root: ``python -m bench.passthrough [--rounds N]``.
Extra shim binaries (the .deb's /usr/bin/runc-guard, the single-file build) are
measured too when they exist, each against the interpreter that runs it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence

from bench.common import interleaved, median_ms, own_cache, print_table
from labkit.kernel import RuncContainer

COMMANDS: dict[str, Callable[[RuncContainer], list[str]]] = {
    "--version": lambda c: ["--version"],
    "state": lambda c: ["--root", c.root, "state", c.id],
    "list": lambda c: ["--root", c.root, "list"],
    "ps": lambda c: ["--root", c.root, "ps", c.id],
    # the lab rootfs has only the busybox applets sh, sleep and cat (no `true`)
    "exec": lambda c: ["--root", c.root, "exec", c.id, "sleep", "0"],
}


def shims(extra: Sequence[str] = ()) -> dict[str, tuple[str, str]]:
    """name -> (shim binary, interpreter that runs it); ``extra``: NAME=PATH[@PYTHON] items."""
    found = {"venv": (os.path.join(os.path.dirname(sys.executable), "runc-guard"), sys.executable)}
    for item in extra:
        name, _, rest = item.partition("=")
        path, _, python = rest.partition("@")
        found[name] = (path, python or "/usr/bin/python3")
    if os.path.exists("/usr/bin/runc-guard"):
        found["deb"] = ("/usr/bin/runc-guard", "/usr/bin/python3")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for pyz in ("dist/runc-guard.pyz", "dist/runc-guard"):  # make single-file's output
        path = os.path.join(repo, pyz)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            found["single-file"] = (path, "/usr/bin/python3")
            break
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--commands", default=",".join(COMMANDS))
    parser.add_argument("--extra-shim", action="append", default=[], metavar="NAME=PATH[@PYTHON]",
                        help="another build to measure, e.g. an extracted .deb or a pyz elsewhere "
                             "(bare interpreter: PYTHON, default /usr/bin/python3)")
    args = parser.parse_args()
    runc = shutil.which("runc") or "/usr/sbin/runc"
    rows = []
    with tempfile.TemporaryDirectory(prefix="rgbench-") as workdir:
        env = dict(os.environ, RUNC_GUARD_CACHE_DIR=os.path.join(workdir, "cache"),
                   RUNC_GUARD_CONFIG=os.path.join(workdir, "config.toml"))
        with open(env["RUNC_GUARD_CONFIG"], "w") as f:
            f.write('runtime = "runc"\n')  # a real settings file: the cache path is measured
        ctr = RuncContainer.start(workdir, children=1)
        try:
            builds = shims(args.extra_shim)
            for name in args.commands.split(","):
                tail = COMMANDS[name](ctr)
                # One interleaved group per command: runc, every build and every bare
                # interpreter share the same rounds, so they share the same noise.
                candidates: dict[str, Sequence[str]] = {"runc": [runc, *tail]}
                for python in {python for _shim, python in builds.values()}:
                    candidates[f"bare:{python}"] = [python, "-c", "pass"]
                for shim_name, (shim, _python) in builds.items():
                    candidates[f"guard:{shim_name}"] = [shim, *tail]
                envs = {f"guard:{n}": own_cache(env, workdir, n) for n in builds}
                samples = interleaved(candidates, args.rounds, env, envs)
                plain = median_ms(samples["runc"])
                for shim_name, (_shim, python) in builds.items():
                    bare = median_ms(samples[f"bare:{python}"])
                    guard = median_ms(samples[f"guard:{shim_name}"])
                    rows.append((name, shim_name, bare, plain, guard, guard - plain,
                                 (guard - plain) / bare))
        finally:
            ctr.destroy()
    print_table(
        f"Passthrough: medians of {args.rounds} interleaved rounds (ms)",
        ["command", "shim", "bare python", "runc", "runc-guard", "overhead", "overhead / bare"],
        rows,
    )
    worst = max(r[-1] for r in rows)
    print(f"\nworst overhead/bare = {worst:.2f} (target <= 1.3, goal 1.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
