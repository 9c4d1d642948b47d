"""A clean delete on the systemd cgroup driver: stock runc vs runc-guard, in the booted-systemd lab.

Inside the nspawn machine (labkit.systemd: systemd as PID 1, Debian's runc 1.1.5)
each round starts two containers with ``runc --systemd-cgroup run -d`` (own PID
namespace, a scope unit ``rgbench-<id>.scope`` in ``system.slice``), stops both
(SIGKILL to init; runc's state says stopped and systemd has collected the empty
scope), then times, interleaved: ``runc delete --force`` of one, ``runc-guard
delete --force`` of the other (fronting the same runc), and a bare ``python3 -c
pass``. runc-guard runs as the .deb installs it: ``python3 -IS`` with its package
byte-compiled (a copy of this checkout inside the machine). Wall time as go-runc
sees it (the child's exit), CPU from wait4's rusage, the detached reporter's CPU
excluded (it runs after the reply and serves many deletes; reporter_linger as shipped).

Run as root: ``python -m bench.systemd_delete [--rounds 12] [--guard-source CHECKOUT]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

from bench.common import print_table
from labkit import systemd as sd

#: Inside the machine: a writable copy of runc-guard, byte-compiled, and the bench's files.
INSIDE = "/var/tmp/rgbench"

LAUNCHER = """#!/usr/bin/python3 -IS
import sys
sys.path.append({where!r})
sys.path.append("/usr/lib/python3/dist-packages")
import _signal
_noted = []
for _signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
    _signal.signal(_signum, lambda signum, _frame: _noted.append(signum))
from runc_guard.shim.entry import main
sys.exit(main(_noted))
"""

#: Runs inside the machine with its python3; prints one JSON object of samples.
INNER = r'''
import json, os, resource, signal, subprocess, sys, time

INSIDE, ROOTFS, rounds, labels = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
root = os.path.join(INSIDE, "runc-root")
env = dict(os.environ, RUNC_GUARD_RUNTIME="runc", RUNC_GUARD_CONFIG=os.path.join(INSIDE, "none.toml"),
           RUNC_GUARD_CACHE_DIR=os.path.join(INSIDE, "cache"),
           RUNC_GUARD_PENDING_DIR=os.path.join(INSIDE, "pending"),
           RUNC_GUARD_STATS_FILE=os.path.join(INSIDE, "stats.jsonl"))

def bundle(cid):
    d = os.path.join(INSIDE, "b", cid)
    os.makedirs(d)
    subprocess.run(["runc", "spec"], cwd=d, check=True)
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c["process"]["terminal"] = False
    c["process"]["args"] = ["sleep", "1000"]
    c["root"] = {"path": ROOTFS, "readonly": True}
    c["linux"]["cgroupsPath"] = f"system.slice:rgbench:{cid}"
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    return d

def stopped(cid):
    d = bundle(cid)
    subprocess.run(["runc", "--root", root, "--systemd-cgroup", "run", "-d", cid], cwd=d, check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(root, cid, "state.json")) as f:
        pid = json.load(f)["init_process_pid"]
    os.kill(pid, signal.SIGKILL)
    unit = f"rgbench-{cid}.scope"
    for _ in range(500):
        out = subprocess.run(["runc", "--root", root, "state", cid], capture_output=True, text=True).stdout
        gone = not os.path.exists(os.path.join("/run/systemd/transient", unit))
        if '"status": "stopped"' in out and gone:
            return
        time.sleep(0.01)
    raise RuntimeError(f"{cid} did not stop")

def timed(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.returncode, wall * 1000, cpu * 1000, proc.stderr.decode()[-300:]

samples = {name: [] for name in ["stock", *labels, "bare"]}
failures = []
for i in range(rounds + 1):  # round 0 warms caches and is dropped
    ids = {name: f"{name}{i}-{os.getpid()}" for name in ["stock", *labels]}
    for cid in ids.values():
        stopped(cid)
    runs = [("stock", ["runc", "--root", root, "delete", "--force", ids["stock"]])]
    for n in labels:
        runs.append((n, [os.path.join(INSIDE, n, "runc-guard"), "--root", root, "delete", "--force", ids[n]]))
    runs.append(("bare", [sys.executable, "-c", "pass"]))
    for name, argv in runs:
        status, wall, cpu, err = timed(argv)
        if status != 0:
            failures.append((name, status, err))
        if i:
            samples[name].append((wall, cpu))
left = [u for u in os.listdir("/run/systemd/transient") if u.startswith("rgbench-")] \
    if os.path.isdir("/run/systemd/transient") else []
print(json.dumps({"samples": samples, "failures": failures, "units_left": left}))
'''


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--guard-source", metavar="LABEL=CHECKOUT", action="append", default=[],
                        help="a checkout whose runc_guard is measured too, e.g. before=/tmp/old (repeatable);"
                        " this checkout is always measured as 'guard'")
    args = parser.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources = {"guard": here, **dict(item.split("=", 1) for item in args.guard_source)}
    base = tempfile.mkdtemp(prefix="rg-bench-sd-")
    try:
        with sd.booted_machine(base) as machine:
            inside = machine.host_path(INSIDE)
            for label, checkout in sources.items():
                where = os.path.join(INSIDE, label)
                shutil.copytree(
                    os.path.join(checkout, "runc_guard"), machine.host_path(f"{where}/runc_guard"),
                    ignore=shutil.ignore_patterns("__pycache__"),
                )
                launcher = machine.host_path(f"{where}/runc-guard")
                with open(launcher, "w") as f:
                    f.write(LAUNCHER.format(where=where))
                os.chmod(launcher, 0o755)
                machine.run("python3", "-m", "compileall", "-q", f"{where}/runc_guard")
            with open(os.path.join(inside, "inner.py"), "w") as f:
                f.write(INNER)
            done = machine.run(
                "python3", os.path.join(INSIDE, "inner.py"), INSIDE, sd.ROOTFS, str(args.rounds),
                ",".join(sources), timeout=900,
            )
            result = json.loads(done.stdout)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    samples = result["samples"]
    rows = []
    bare = _median([w for w, _ in samples["bare"]])
    stock = _median([w for w, _ in samples["stock"]])
    for name in ("stock", *sources, "bare"):
        wall = [w for w, _ in samples[name]]
        cpu = [c for _, c in samples[name]]
        rows.append([name, f"{_median(wall):.1f}", f"{sorted(wall)[int(len(wall) * 0.9) - 1]:.1f}",
                     f"{_median(wall) - stock:+.1f}", f"{_median(wall) / bare:.2f}", f"{_median(cpu):.1f}"])
    print_table(f"systemd driver, clean delete of a stopped container, {args.rounds} interleaved rounds",
                ["run", "p50 ms", "p90 ms", "over runc ms", "x bare python", "CPU ms (p50)"], rows)
    print(f"failures: {result['failures'] or 'none'}; scope units left: {result['units_left'] or 'none'}")


if __name__ == "__main__":
    main()
