"""A pure cgroup v2 node in a VM: systemd PID 1, journald, kubelet's systemd driver, a CRI client.

One boot serves the module (``labkit.vm``): Debian 12's kernel 6.1 under TCG,
every controller on the unified tree, containerd 1.6.20 configured by
``runc-guardctl configure containerd`` on its own default config with
``SystemdCgroup = true``; handler ``stock`` runs Debian's runc 1.1.5 and
``runc`` runs runc-guard (from its .deb) in front of the same runc, in the same
boot. TCG runs guest programs 15-25x slower than the host: the deadlines are the
shipped ones, and where that changes what a case means the test prints it.

The cells (``labkit/vm_guest/scenarios.py``, figures in docs/vm.md): a teardown
held by throttled writeback (``io.max`` on the pod slice, a ``busybox dd`` in D
state for ~8 s) on Path A (``StopContainer`` with timeout 0) and Path B (init
and shim SIGKILLed), then ``runc-guardctl audit`` / ``sweep`` / ``metrics``; a
real memcg OOM restarted like CrashLoopBackOff; and v2's ``memory.reclaim`` on
kernel 6.1. containerd 2.1.9 with runc 1.3.6 and crun 1.28 run on the modern node,
Debian sid's own packages on its own kernel (``integration/test_vm_modern_node.py``);
this node upgraded in place to them is ``python -m bench.vm_cells --layout unified
--containerd 2.1 --runc 1.3``. The hybrid layout
(``systemd.unified_cgroup_hierarchy=0``) needs a boot of its own and does not
fit the module's CI budget: ``python -m bench.vm_cells --layout hybrid`` runs
its cells (docs/vm.md). Path B with a sibling container in the pod is
not in the module (two more minutes of TCG): ``python -m bench.vm_cells --layout
unified --path b+sibling``, its figures in docs/vm.md.

What the module needs is checked before the boot. The boot and the node check run on
Debian 12's own packages (containerd 1.6.20, runc 1.1.5). Every cell drives the
guest's CRI with ``labkit.cri_client`` (Debian 12 packages no crictl), whose stubs
the guest compiles from the CRI's ``api.proto`` (sid's ``golang-k8s-cri-api-dev``);
it comes from Debian's archive (``labkit.runtimes``): when it cannot be reached and
nothing is cached, those cells skip naming the package, or fail under ``CI=true``
(labkit.prereq), before anything boots for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from labkit import prereq, runtimes, vm

STOCK, GUARD = "stock", "runc"
HANDLERS = f"{STOCK},{GUARD}"
PAIR = (STOCK, GUARD)
#: Restarts per handler in the module's crash loop (bench/vm_crashloop.py runs the long one).
CRASH_RESTARTS = 2


@pytest.fixture(scope="module")
def cri() -> None:
    """The CRI's api.proto, which the guest compiles for labkit.cri_client: checked before the boot.

    A fixture that needs it names it before ``node`` (pytest sets up a fixture's
    arguments in order), so a machine without it never boots for a cell it skips.
    """
    runtimes.require(runtimes.CRI_API_PROTO)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vm.VM]:
    """The booted VM with containerd configured and the images imported; always powered off."""
    prereq.require_none(vm.missing())
    with vm.booted_vm(str(tmp_path_factory.mktemp("rgvm"))) as machine:
        machine.setup = machine.guest("setup.py", timeout=600)  # type: ignore[attr-defined]
        yield machine


def figure(record: Any, line: str) -> None:
    print(line)
    record("figure", line)


def cell(node: vm.VM, *args: str) -> dict[str, Any]:
    """One scenario for both handlers of ``args[1]``; a handler's exception in the guest fails the test."""
    result: dict[str, Any] = node.guest("scenarios.py", *args, timeout=1200)
    for handler in args[1].split(","):
        assert "error" not in result.get(handler, {}), json.dumps(result)[-4000:]
    return result


@pytest.fixture(scope="module")
def teardowns(cri: None, node: vm.VM) -> dict[str, dict[str, Any]]:
    """The throttled-teardown cells, run once; node tools after them (the sweep sees every leftover)."""
    cells = {
        # Shared PID namespace: init dies at once, the writer lingers (the incident's shape).
        "path-a": cell(node, "teardown", HANDLERS, "a", "pod"),
        # kubelet's default, own PID namespace: init waits in do_exit for the writer.
        "path-b": cell(node, "teardown", HANDLERS, "b", "container"),
        # runc 1.3.6 (cgroup.kill, state kept on failure) runs under containerd 2.1.9 on the modern
        # node (test_vm_modern_node.py); under 1.6.20 in `python -m bench.vm_cells --layout unified
        # --runc 1.3` (56 s more here than make test's budget holds).
    }
    ids = [c for result in cells.values() for h in result if isinstance(result[h], dict)
           for c in result[h]["ids"].values()]  # fmt: skip
    cells["tools"] = node.guest("scenarios.py", "node-tools", "-", *ids, timeout=900)
    return cells


def test_node_is_pure_v2_with_systemd_and_the_package(node: vm.VM, record_property: Any) -> None:
    """The guest is the node of today: cgroup2 with every controller, systemd PID 1, runc-guard's .deb."""
    out = node.run("sh", "-c", "stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers; "
                   "cat /proc/1/comm; systemctl is-active systemd-journald containerd; "
                   "dpkg-query -W -f '${Status}' runc-guard").stdout.split("\n")  # fmt: skip
    assert out[0] == "cgroup2fs", out
    assert {"cpu", "io", "memory", "pids"} <= set(out[1].split()), out
    assert out[2] == "systemd", out
    assert out[3:5] == ["active", "active"], out
    assert out[5] == "install ok installed", out
    handlers = node.setup["handlers"]  # type: ignore[attr-defined]
    assert handlers[GUARD] == {"binary": "/usr/bin/runc-guard", "systemd": True}, handlers
    assert handlers[STOCK] == {"binary": "/usr/sbin/runc", "systemd": True}, handlers
    figure(record_property, f"vm: booted in {node.boot_s:.0f} s (TCG, {node.smp} vCPU); disk "
           f"{'cached' if node.disk.build_s is None else f'built in {node.disk.build_s:.0f} s'}")  # fmt: skip


def row(name: str, result: dict[str, Any], pair: tuple[str, str] = PAIR, key: str = "after_removal") -> str:
    """``handler: container dirs/unit/state/bundle/records, journal outcomes`` for one cell."""
    parts = []
    for handler in pair:
        r = result[handler]
        for label, left in r[key].items():
            journal = [f"{d.get('outcome', d.get('event'))}/{d.get('exit_status', '-')}"
                       for d in r["deletes"][label]]  # fmt: skip
            parts.append(
                f"{handler} {label}: dirs {left['dirs']}, unit {left['unit']}, state {left['state']}, "
                f"bundle {left['bundle']}, records {left['records']}, journal {journal or '-'}"
            )
    stock, guard = pair
    return f"vm {name} (held {result[stock]['held_s']}/{result[guard]['held_s']} s): " + "; ".join(parts)


def overloaded(result: dict[str, Any], guard: str = GUARD) -> list[str]:
    """runc-guard's startup_overloaded entries: TCG spent containerd's budget before runc-guard ran."""
    return [label for label, entries in result[guard]["deletes"].items()
            if any(e.get("event") == "startup_overloaded" for e in entries)]  # fmt: skip


def check_path_b(result: dict[str, Any], pair: tuple[str, str], name: str, record: Any) -> None:
    """A Path B cell (init + shim SIGKILLed, ~7-8 s hold): stock keeps runc's state; runc-guard's outcome.

    runc's ``delete --force`` waits for the namespace's init, which waits in do_exit
    for the writer: containerd SIGKILLs the shim's delete at 5 s, and runc's state
    stays (the control). systemd's scope is gone for both once the writer exits
    (the systemd driver removes an empty transient scope's cgroup itself).
    """
    stock_h, guard_h = pair
    figure(record, row(name, result, pair))
    stock, guard = result[stock_h]["after_removal"]["work"], result[guard_h]["after_removal"]["work"]
    assert stock["state"] is True, result[stock_h]
    assert (stock["dirs"], stock["unit"]) == (0, "gone"), result[stock_h]
    assert (guard["dirs"], guard["unit"]) == (0, "gone"), result[guard_h]
    # runc-guard's pending record stays until the sweep (test_node_tools_* checks it is cleared).
    assert guard["records"] <= 1, result[guard_h]
    for handler in pair:
        sandbox = result[handler]["sandbox"]
        journal = [f"{d.get('outcome', d.get('event'))}/{d.get('exit_status', '-')}"
                   for d in sandbox["deletes"]]  # fmt: skip
        figure(record, f"vm {name} {handler} sandbox (pause, same dead shim): {sandbox['after_removal']}, "
               f"journal {journal or '-'}")  # fmt: skip
    if result[guard_h]["sandbox"]["after_removal"]["unit"] != "gone":
        figure(record, f"vm {name}: TCG: the pause outlives its pod: runc-guard stepped aside late at "
               "start-up (the runtime alone was killed at 5 s), or its deadline's kill of the live "
               "init did not reach it (docs/vm.md)")  # fmt: skip
    said = result[guard_h]["containerd"]["work"]
    entries = result[guard_h]["deletes"]["work"]
    if not entries:
        figure(record, f"vm {name}: TCG: containerd killed the shim's delete before runc-guard's "
               f"report reached the journal (no entry); containerd said {said[:2]}")  # fmt: skip
    elif overloaded(result, guard_h):
        figure(record, f"vm {name}: TCG: runc-guard started after most of containerd's 5 s budget was "
               "spent (startup_overloaded) and stepped aside: this cell measures the emulator")  # fmt: skip
    else:
        outcomes = {e.get("outcome") for e in entries}
        assert outcomes & {"deadline", "removed", "record_finished", "already_gone"}, entries
        for e in entries:
            # A deadline is runc-guard's own exit 75 (EX_TEMPFAIL), never a silent 0.
            if e.get("outcome") == "deadline":
                assert e.get("exit_status") == "75", entries


def test_path_a_throttled_teardown(teardowns: dict[str, dict[str, Any]], record_property: Any) -> None:
    """Path A, shared PID namespace, a writer in throttled writeback for ~8 s: runc-guard leaves nothing."""
    result = teardowns["path-a"]
    figure(record_property, row("path-a pid=pod", result))
    for handler in (STOCK, GUARD):
        assert result[handler]["io_max"].endswith("wbps=65536 riops=max wiops=max"), result[handler]
        r = result[handler]
        figure(record_property, f"vm path-a {handler}: StopContainer(timeout 0) returned after "
               f"{r['stop_s']} s (rc {r['stop_rc']}), the writer exited {r['held_s']} s after")  # fmt: skip
    guard = result[GUARD]["after_removal"]["work"]
    assert guard == {"dirs": 0, "unit": "gone", "state": False, "bundle": False, "records": 0}, result[GUARD]
    # journald is the system journal: every delete runc-guard ran is there under the container's id.
    assert result[GUARD]["deletes"]["work"], result[GUARD]


def test_path_b_dead_shim_throttled_teardown(teardowns: dict[str, Any], record_property: Any) -> None:
    """Path B, own PID ns, ~8 s teardown > containerd's 5 s: stock keeps runc's state, runc-guard reports."""
    check_path_b(teardowns["path-b"], PAIR, "path-b pid=container", record_property)


def test_node_tools_on_the_unified_tree(teardowns: dict[str, dict[str, Any]], record_property: Any) -> None:
    """audit reports what the cells left, sweep clears runc-guard's records, metrics count the deletes."""
    tools = teardowns["tools"]
    figure(record_property, f"vm audit before the sweep: rc {tools['audit_rc']}: {tools['audit'][:3]}")
    figure(record_property, f"vm sweep: rc {tools['sweep_rc']}: {tools['sweep'][:1]}")
    figure(record_property, f"vm audit after: rc {tools['audit_after_rc']}; metrics {tools['metrics']}")
    figure(record_property, f"vm scope units left: {len(tools['scope_units'])}")
    assert tools["sweep_rc"] == 0, tools
    assert tools["metrics_rc"] == 0, tools
    assert any(line.startswith("runc_guard_deletes_total") for line in tools["metrics"]), tools
    # The sibling cell's sibling may still run where TCG made runc-guard step aside (docs/vm.md).
    guard_ids = {teardowns[name][GUARD]["ids"]["work"] for name in ("path-a", "path-b")}
    for cid in guard_ids:
        left = tools["left"][cid]
        assert (left["dirs"], left["records"]) == (0, 0), (cid, left)


def test_oom_crash_loop(cri: None, node: vm.VM, record_property: Any) -> None:
    """Real memcg OOM kills, restarted at CrashLoopBackOff's 1 s floor: runc-guard leaves nothing."""
    result = cell(node, "crash-loop", HANDLERS, str(CRASH_RESTARTS), "900", "container")
    ids = [c for h in (STOCK, GUARD) for c in result[h]["ids"]]
    tools: dict[str, Any] = node.guest("scenarios.py", "node-tools", "-", *ids, timeout=900)
    for handler in (STOCK, GUARD):
        r = result[handler]
        figure(record_property, (
            f"vm oom crash loop {handler}: {r['restarts']} restarts, {r['oom_kills']} oom_kill, "
            f"{r['per_restart_s']} s each (TCG); exits {r['exits']}; left dirs {r['dirs']}, "
            f"units {r['units_left']}, states {r['states']}, records {r['records']}; journal {r['outcomes']}"
        ))  # fmt: skip
        # Real kernel OOM kills, one per attempt at least (memory.events of the pod slice).
        assert r["restarts"] == CRASH_RESTARTS, r
        assert r["oom_kills"] >= r["restarts"], r
    if any(k.startswith("deadline/") for k in result[GUARD]["outcomes"]):
        figure(record_property, "vm oom crash loop: TCG: some runc-guard deletes hit their deadline (the "
               "runtime child outlived the shipped budget under emulation); CRI's retry or the sweep "
               "finished them")  # fmt: skip
    guard = result[GUARD]
    assert (guard["dirs"], guard["units_left"]) == (0, 0), guard
    after = [tools["left"][c] for c in guard["ids"]]
    assert [(a["dirs"], a["state"], a["records"]) for a in after] == [(0, False, 0)] * len(after), after
    # journald is the system journal: every container runc-guard deleted has its entries there.
    assert guard["journal_silent"] == 0, guard


#: Ten memory cgroups under one parent per front, each charged with 1 MiB of a file that outlives
#: it (written by a process inside, as a container's log in a volume), then removed: stock removes
#: them as they are, runc-guard reclaims each first (runc_guard.delete.reclaim, as its delete does).
_RECLAIM = (
    "import sys, time; from runc_guard.delete.reclaim import reclaim;"
    " r = reclaim(sys.argv[1], time.monotonic() + 1);"
    " print('reclaimed', r.method, r.before, r.after, r.skipped or '-')"
)
_MEMCG_CELL = r"""
set -eu
reclaim=$1
top=/sys/fs/cgroup/rgvm-memcg-$$
mkdir "$top"; echo +memory > "$top/cgroup.subtree_control"
mkdir -p /var/tmp/rgvm-volume
for front in stock guard; do
  mkdir "$top/$front"; echo +memory > "$top/$front/cgroup.subtree_control"
  for i in 1 2 3 4 5 6 7 8 9 10; do
    cg="$top/$front/c$i"; mkdir "$cg"
    out=/var/tmp/rgvm-volume/$front-$i
    sh -c "echo \$\$ > $cg/cgroup.procs; exec dd if=/dev/zero of=$out bs=1M count=1 status=none"
    if [ "$front" = guard ]; then python3 -c "$reclaim" "$cg"; fi
    rmdir "$cg"
  done
done
sleep 2
for front in stock guard; do echo "$front $(grep nr_dying_descendants "$top/$front/cgroup.stat")"; done
rm -rf /var/tmp/rgvm-volume
rmdir "$top/stock" "$top/guard" "$top" 2>/dev/null || echo "parents left dying"
"""


def test_memory_reclaim_frees_memcgs_on_v2(node: vm.VM, record_property: Any) -> None:
    """cgroup v2's memory.reclaim (kernel 6.1) before each rmdir: the memcgs are freed, where the
    same ten removed without it stay dying (nr_dying_descendants of their own parent)."""
    out = node.run("sh", "-c", _MEMCG_CELL, "memcg", _RECLAIM, timeout=600).stdout.splitlines()
    dying = {line.split()[0]: int(line.split()[-1]) for line in out if line.startswith(("stock ", "guard "))}
    reclaimed = [line.split() for line in out if line.startswith("reclaimed ")]
    figure(record_property, f"v2 memcgs, 10 x 1 MiB each: dying after rmdir stock {dying['stock']},"
                            f" with memory.reclaim first {dying['guard']}; {reclaimed[:1]}")  # fmt: skip
    assert len(reclaimed) == 10 and all(r[1] == "reclaim" and int(r[2]) >= 1 << 20 for r in reclaimed), out
    assert dying["stock"] >= 8, f"the control: charged memcgs stay dying ({out})"
    assert dying["guard"] <= 2, out
