"""Delete of a clean container: ``runc-guard delete --force`` vs stock ``runc delete --force``.

Clean means nothing to wait for: a container with its own pid namespace whose
init was SIGKILLed, so every process is gone before the delete starts (containerd's
Path B when the teardown is quick). Each round makes two such containers and
deletes one through each binary, in rotating order, so the machine's noise hits
both alike. Target: at most 25 ms over runc (p50 and p90) until containerd has
the status, and at most 40 ms of runc-guard's own CPU per delete, its detached
reporters included (the bench is their subreaper, so they are counted). The import cost of the
delete path is measured separately: ``python -c "import runc_guard.delete.run"`` vs
``import runc_guard.shim.entry`` (the passthrough path) vs a bare ``python -c pass``,
interleaved, plus the heaviest imports from ``-X importtime``.

Run as root: ``python -m bench.delete_clean [--rounds N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from bench.common import (
    PREFIX,
    balanced_order,
    interleaved,
    median_ms,
    own_cache,
    percentile_ms,
    print_table,
    reap_orphans,
    remove_everywhere,
    run_like_go_runc,
    subreaper,
)
from labkit.kernel import BUSYBOX, RUNC, procs, wait_for
from labkit.scenario import guard_env

CGROUP_PROBE = ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class CleanContainers:
    """Stopped runc containers (own pid namespace, init killed) under one ``rgbench-`` parent."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.root = os.path.join(workdir, "runc-root")
        self.parent = f"{PREFIX}-del-{uuid.uuid4().hex[:8]}"
        self.rootfs = os.path.join(workdir, "rootfs")
        os.makedirs(os.path.join(self.rootfs, "bin"))
        shutil.copy2(BUSYBOX, os.path.join(self.rootfs, "bin", "busybox"))
        for applet in ("sh", "sleep"):
            os.symlink("busybox", os.path.join(self.rootfs, "bin", applet))
        for d in ("proc", "dev", "sys", "tmp"):
            os.makedirs(os.path.join(self.rootfs, d))
        subprocess.run([RUNC, "spec"], cwd=workdir, check=True)
        with open(os.path.join(workdir, "config.json")) as f:
            self.template = json.load(f)
        self.ids: list[str] = []

    def _cgroup(self, cid: str) -> str:
        for top in CGROUP_PROBE:
            path = os.path.join(top, self.parent, cid)
            if os.path.isdir(path):
                return path
        return ""

    def dirs_left(self, cid: str) -> int:
        from labkit.kernel import dirs_named

        return len(dirs_named(f"{self.parent}/{cid}"))

    def make_stopped(self) -> str:
        """A container whose init (and so every process) was SIGKILLed: runc sees it Stopped."""
        cid = f"{PREFIX}-{uuid.uuid4().hex[:10]}"
        bundle = os.path.join(self.workdir, cid)
        os.makedirs(bundle)
        config = json.loads(json.dumps(self.template))
        config["root"] = {"path": self.rootfs, "readonly": True}
        config["process"]["terminal"] = False
        config["process"]["args"] = ["sleep", "1000"]
        config["linux"]["cgroupsPath"] = f"/{self.parent}/{cid}"
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump(config, f)
        self.ids.append(cid)
        subprocess.run([RUNC, "--root", self.root, "run", "-d", cid], cwd=bundle, check=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, timeout=30)
        with open(os.path.join(self.root, cid, "state.json")) as f:
            init = json.load(f)["init_process_pid"]
        os.kill(init, signal.SIGKILL)
        if not wait_for(lambda: not procs(self._cgroup(cid)), 10, 0.005):
            raise RuntimeError(f"{cid}: processes did not exit")
        return cid

    def destroy(self) -> None:
        """Whatever happened: delete every container we made, then remove our parent cgroup."""
        for cid in self.ids:
            path = self._cgroup(cid)
            for pid in procs(path) if path else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if os.path.exists(os.path.join(self.root, cid)):
                subprocess.run([RUNC, "--root", self.root, "delete", "--force", cid],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                               timeout=30)
        remove_everywhere(self.parent)


class Series:
    """One binary's deletes: wall times (until status and closed pipes) and CPU of every process."""

    def __init__(self) -> None:
        self.elapsed: list[float] = []
        #: The delete process and its waited-for children (the runtime).
        self.cpu: list[float] = []
        #: Detached reporters reaped after this binary's deletes (runc-guard only).
        self.reporters = 0
        self.reporter_cpu = 0.0


def delete_rounds(rounds: int, binaries: dict[str, str], workdir: str,
                  pending_dir: str | None = None, isolated: bool = False) -> dict[str, Series]:
    """Rotating rounds of deletes (one per binary); returns samples, reports any leak or failure.

    ``isolated``: after each delete wait for its reporter to finish (linger 0), so every delete
    pays a whole reporter; else reporters linger (the default) and serve the next deletes too.
    """
    env = guard_env(workdir)
    if isolated:
        env["RUNC_GUARD_REPORTER_LINGER"] = "0"
    else:
        del env["RUNC_GUARD_REPORTER_LINGER"]  # the default, as on a node
    if pending_dir:
        env["RUNC_GUARD_PENDING_DIR"] = pending_dir
    with open(env["RUNC_GUARD_CONFIG"], "w") as f:
        f.write('runtime = "runc"\n')
    containers = CleanContainers(workdir)
    names = list(binaries)
    series = {n: Series() for n in names}
    leaks = dict.fromkeys(names, 0)
    failures = dict.fromkeys(names, 0)
    try:
        # Two runs each only warm the caches; then one carryover-balanced order (common.balanced_order).
        warm = [name for _ in range(2) for name in names]
        for i, name in enumerate(warm + balanced_order(names, rounds)):
            cid = containers.make_stopped()
            subreaper(True)
            run = run_like_go_runc([binaries[name], "--root", containers.root, "--log",
                                    os.path.join(workdir, f"{cid}.log.json"), "--log-format", "json",
                                    "delete", "--force", cid], own_cache(env, workdir, name))
            subreaper(False)
            if isolated:
                count, cpu = reap_orphans()
            else:
                count, cpu = 0, 0.0
            if i < len(warm):
                continue
            series[name].elapsed.append(run.elapsed)
            series[name].cpu.append(run.cpu)
            series[name].reporters += count
            series[name].reporter_cpu += cpu
            failures[name] += run.status != 0
            leaks[name] += containers.dirs_left(cid) > 0
    finally:
        containers.destroy()
    if not isolated:
        # Lingering reporters served every runc-guard build's deletes of the run: their CPU is
        # shared out per delete (the count is shown on each runc-guard row).
        count, cpu = reap_orphans()
        guards = [n for n in names if n != "runc"]
        deletes = sum(len(series[n].cpu) for n in guards)
        for name in guards:
            series[name].reporters = count
            series[name].reporter_cpu = cpu * len(series[name].cpu) / deletes if deletes else 0.0
    print(f"\nclean deletes: non-zero exits {failures}, containers with cgroup dirs left {leaks}")
    return series


def importtime_top(python: str, module: str, count: int = 8) -> list[tuple[str, float]]:
    """The heaviest top-level imports (cumulative ms) below ``module`` from ``-X importtime``."""
    proc = subprocess.run([python, "-P", "-X", "importtime", "-c", f"import {module}"],
                          capture_output=True, text=True, check=True)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, raw = line.split("|")
        name = raw[1:]
        depth = (len(name) - len(name.lstrip())) // 2
        if depth == 1:  # what the module imports directly
            rows.append((name.strip(), int(cumulative) / 1000))
    return sorted(rows, key=lambda r: -r[1])[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--import-rounds", type=int, default=60)
    parser.add_argument("--extra", action="append", default=[], metavar="NAME=PATH",
                        help="another runc-guard build to compare (e.g. a prototype)")
    parser.add_argument("--isolated", action="store_true",
                        help="wait for each delete's reporter before the next (every delete pays one)")
    parser.add_argument("--pending-on-disk", action="store_true",
                        help="keep pending records on this machine's disk instead of a tmpfs")
    args = parser.parse_args()
    python = sys.executable
    binaries = {"runc": RUNC, "runc-guard (venv)": os.path.join(os.path.dirname(python), "runc-guard")}
    if os.path.exists("/usr/bin/runc-guard"):
        binaries["runc-guard (deb)"] = "/usr/bin/runc-guard"
    binaries.update(item.split("=", 1) for item in args.extra)
    # The pending record is fsynced (file and directory). On a node /run is a tmpfs,
    # where that is free; on this machine /run and /tmp are ext4, so by default the
    # record goes to a tmpfs (/dev/shm) like production; --pending-on-disk shows the cost.
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}-") as workdir, \
            tempfile.TemporaryDirectory(prefix=f"{PREFIX}-", dir="/dev/shm") as shm:
        started = time.monotonic()
        pending = None if args.pending_on_disk else os.path.join(shm, "pending")
        runs = delete_rounds(args.rounds, binaries, workdir, pending, args.isolated)
    runc = runs["runc"]
    rows = []
    for name, r in runs.items():
        cpu_ms = median_ms(r.cpu)
        reporter_ms = r.reporter_cpu * 1000 / len(r.cpu) if r.cpu else 0.0
        rows.append((name, median_ms(r.elapsed), percentile_ms(r.elapsed, 90),
                     median_ms(r.elapsed) - median_ms(runc.elapsed),
                     percentile_ms(r.elapsed, 90) - percentile_ms(runc.elapsed, 90),
                     cpu_ms, r.reporters, reporter_ms, cpu_ms + reporter_ms - median_ms(runc.cpu)))
    mode = "each delete's reporter waited for (linger 0)" if args.isolated else "reporters linger (default)"
    print_table(
        f"Delete of a clean container: {args.rounds} interleaved rounds, {mode}; pending records on "
        f"{'disk (ext4)' if args.pending_on_disk else 'tmpfs'}. Wall ms until the status and closed "
        "pipes (as go-runc waits); CPU ms: the delete process with its runtime child (p50), reporters "
        "(sum / deletes), and runc-guard's own (both, over runc's p50)",
        ["binary", "p50", "p90", "over runc p50", "over runc p90", "CPU p50", "reporter processes",
         "reporter CPU/delete", "own CPU/delete"],
        rows,
    )
    worst = max(row[3] for row in rows if row[0] != "runc")
    print(f"\nworst delete overhead = {worst:.1f} ms (target <= 25 ms); {time.monotonic() - started:.0f} s")

    imports = interleaved(
        {
            "bare": [python, "-P", "-c", "pass"],
            "shim": [python, "-P", "-c", "import runc_guard.shim.entry"],
            "delete": [python, "-P", "-c", "import runc_guard.delete.run"],
        },
        args.import_rounds,
    )
    bare = median_ms(imports["bare"])
    print_table(
        f"Import cost: medians of {args.import_rounds} interleaved interpreter starts (ms)",
        ["python -c", "p50", "over bare"],
        [
            ("pass", bare, 0.0),
            ("import runc_guard.shim.entry (passthrough)", median_ms(imports["shim"]),
             median_ms(imports["shim"]) - bare),
            ("import runc_guard.delete.run", median_ms(imports["delete"]),
             median_ms(imports["delete"]) - bare),
        ],
    )
    print_table("Heaviest imports of the delete path (-X importtime, one run, cumulative ms)",
                ["module", "ms"], importtime_top(python, "runc_guard.delete.run"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
