"""A deleted container's memory cgroup is reclaimed before its rmdir, on the real kernel (issue 32).

Each lifecycle is a real runc 1.1.5 host-PID container that writes 1 MiB to a
host directory bind-mounted into it (a log in a volume that outlives the
container, as an ``emptyDir`` outlives restarts), whose init is then killed
(the dead-shim path) and deleted with ``delete --force``: by stock runc alone,
then through runc-guard. What stays charged to a removed memory cgroup keeps
it dying; those charges also stay in its parent's hierarchical usage, so the
test reads its own parent cgroup (hermetic: not the node's /proc/cgroups,
which the other worker's tests move).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator

import pytest

from labkit.kernel import RUNC, make_bundle, procs, remove_tree, unique, wait_for
from labkit.scenario import guard_env

pytestmark = pytest.mark.kernel

MEMORY = "/sys/fs/cgroup/memory"
LIFECYCLES = 10
MIB = 1 << 20


def _usage(path: str) -> int:
    with open(os.path.join(path, "memory.usage_in_bytes")) as f:
        return int(f.read())


@pytest.fixture
def parents() -> Iterator[list[str]]:
    """Parent cgroups (v1 memory) for each front's containers; removed after, dying children and all."""
    if not os.path.isdir(MEMORY):
        pytest.skip("no cgroup v1 memory hierarchy (a pure v2 host: the VM lab covers memory.reclaim)")
    made: list[str] = []
    yield made
    for name in made:
        for mount in os.listdir("/sys/fs/cgroup"):
            remove_tree(os.path.join("/sys/fs/cgroup", mount, name))


def _lifecycle(workdir: str, parent: str, volume: str, delete: list[str], env: dict[str, str]) -> int:
    """One container: write 1 MiB into the volume, die (init SIGKILLed), deleted by ``delete``."""
    cid = unique("rgtest-memcg")
    directory = os.path.join(workdir, cid)
    script = f"dd if=/dev/zero of=/volume/{cid}.log bs=1M count=1 2>/dev/null; exec sleep 1000"
    bundle = make_bundle(directory, f"/{parent}/{cid}", script)
    os.symlink("busybox", os.path.join(bundle, "rootfs", "bin", "dd"))
    os.makedirs(os.path.join(bundle, "rootfs", "volume"))
    with open(os.path.join(bundle, "config.json")) as f:
        config = json.load(f)
    config["mounts"].append({"destination": "/volume", "type": "bind", "source": volume,
                             "options": ["rbind", "rw"]})  # fmt: skip
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(config, f)
    root = os.path.join(workdir, "runc-root")
    cgroup = os.path.join(MEMORY, parent, cid)
    try:
        quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        subprocess.run([RUNC, "--root", root, "run", "-d", cid], cwd=bundle, check=True, timeout=30, **quiet)
        log = os.path.join(volume, f"{cid}.log")
        assert wait_for(lambda: os.path.exists(log) and os.path.getsize(log) == MIB, 10)
        with open(os.path.join(root, cid, "state.json")) as f:
            init = int(json.load(f)["init_process_pid"])
        os.kill(init, signal.SIGKILL)
        assert wait_for(lambda: not procs(cgroup), 10)
        done = subprocess.run([*delete, "--root", root, "delete", "--force", cid], capture_output=True,
                              text=True, env=env, check=False, timeout=60)  # fmt: skip
        return done.returncode
    finally:
        for pid in procs(cgroup):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run([RUNC, "--root", root, "delete", "--force", cid], capture_output=True, check=False)


def test_a_deleted_containers_memcg_keeps_no_page_cache(
    shim_binary: str, workdir: str, tmp_path: os.PathLike[str], parents: list[str]
) -> None:
    """Stock runc 1.1.5 removes each memory cgroup with its 1 MiB of the volume's page cache still
    charged (the control: ~10 MiB stay charged below the parent, ten dying memcgs). Through runc-guard
    the same ten deletes exit 0 and leave no page cache charged: reclaimed before the rmdir."""
    volume = str(tmp_path)
    charged = {}
    for front in ("stock", "guard"):
        parent = unique(f"rgtest-memcg-{front}")
        parents.append(parent)
        os.mkdir(os.path.join(MEMORY, parent))
        env = guard_env(workdir) if front == "guard" else dict(os.environ)
        delete = [shim_binary] if front == "guard" else [RUNC]
        statuses = [_lifecycle(workdir, parent, volume, delete, env) for _ in range(LIFECYCLES)]
        assert statuses == [0] * LIFECYCLES, (front, statuses)
        charged[front] = _usage(os.path.join(MEMORY, parent))
    print(f"\n{LIFECYCLES} lifecycles x 1 MiB: charged below the parent after the deletes: "
          f"stock {charged['stock'] >> 10} KiB, runc-guard {charged['guard'] >> 10} KiB")
    assert charged["stock"] >= LIFECYCLES * MIB * 0.9, "the control: stock leaves the page cache charged"
    assert charged["guard"] < LIFECYCLES * MIB * 0.25, charged
    with open(os.path.join(workdir, "stats.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) == LIFECYCLES and all(line["reclaimed_kb"] >= 900 for line in lines), lines
    assert all(line["memcg_left"] == 0 for line in lines), lines
