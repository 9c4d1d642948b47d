"""Through runc-guard, containerd and its callers see exactly what stock runc gives them."""

from __future__ import annotations

import re

import pytest

from labkit import containerd as cl

pytestmark = pytest.mark.kernel


def _normal(text: str, task_id: str) -> str:
    """Drop what differs between two equal runs: the task id and runc's log timestamps."""
    text = text.replace(task_id, "<id>")
    return re.sub(r'time="[^"]*" ', "", text)


def _ctr_session(lab: cl.Containerd, ns: str, task: cl.Task) -> list[tuple[object, ...]]:
    """Every ctr call that reaches the runtime, as (call, exit code, stdout, stderr)."""
    seen: list[tuple[object, ...]] = []

    def call(*args: str) -> str:
        proc = lab.ctr(ns, *args, check=False)
        seen.append((args[:2], proc.returncode, _normal(proc.stdout, task.id),
                     _normal(proc.stderr, task.id)))
        return proc.stdout

    listed = call("task", "ps", task.id)
    # PIDs differ between two tasks; they must be exactly the task's processes.
    pids = sorted(int(line.split()[0]) for line in listed.splitlines()[1:])
    assert pids == sorted(task.pids())
    # ctr pads its columns to the widest PID: a 4- and a 5-digit PID give different headers.
    header = " ".join(listed.splitlines()[0].split())
    seen[-1] = (*seen[-1][:2], header, len(pids), seen[-1][3])
    call("task", "exec", "--exec-id", "e1", task.id, "/bin/sh", "-c",
         "echo out; echo err >&2; exit 7")
    call("task", "exec", "--exec-id", "e2", task.id, "/nonexistent")
    call("task", "pause", task.id)
    seen.append(("status", task.status()))
    call("task", "pause", task.id)
    call("task", "exec", "--exec-id", "e3", task.id, "/bin/true")
    call("task", "resume", task.id)
    seen.append(("status", task.status()))
    call("task", "resume", task.id)
    metrics = lab.ctr(ns, "task", "metrics", task.id).stdout.split("METRIC", 1)[1]
    seen.append(("metrics", [line.split()[0] for line in metrics.splitlines()[1:] if line]))
    return seen


def test_ctr_task_calls_match_stock_runc(ctd: cl.Containerd, ns: str) -> None:
    """ps, exec (exit codes, stdout, stderr), pause/resume and metrics: same as stock runc."""
    stock = _ctr_session(ctd, ns, cl.run_task(ctd, ns, cl.STOCK_RUNC))
    guarded = _ctr_session(ctd, ns, cl.run_task(ctd, ns, cl.guard_binary()))
    assert guarded == stock
    # The failing calls really failed, with the runtime's reasons.
    assert [s[1] for s in stock if s[0] == ("task", "exec")] == [7, 1, 1]
    assert ("status", "PAUSED") in stock


def test_direct_runtime_calls_match_stock_runc(ctd: cl.Containerd, ns: str) -> None:
    """Against the shim's runc root: state/ps output and failing calls' exit codes are identical."""
    task = cl.run_task(ctd, ns, cl.guard_binary())
    root = f"{cl.RUNC_ROOT}/{ns}"
    calls = [
        ["state", task.id],
        ["ps", "--format", "json", task.id],
        ["state", "rgctd-missing"],
        ["delete", "rgctd-missing"],
        ["delete", "--force", "rgctd-missing"],
        ["kill", "rgctd-missing", "KILL"],
        ["pause", "rgctd-missing"],
        ["kill", task.id, "NOSUCHSIGNAL"],
        ["no-such-command"],
    ]
    results: dict[str, list[tuple[str, int, str, str]]] = {}
    for binary in (cl.STOCK_RUNC, cl.guard_binary()):
        results[binary] = []
        for args in calls:
            proc = cl.in_namespace(ctd, [binary, "--root", root, *args])
            results[binary].append(
                (args[0], proc.returncode, proc.stdout, _normal(proc.stderr, task.id))
            )
    assert results[cl.guard_binary()] == results[cl.STOCK_RUNC]
    # runc's own codes: 1 for errors, 0 for delete --force of nothing, 3 for usage.
    assert [r[1] for r in results[cl.STOCK_RUNC]] == [0, 0, 1, 1, 0, 1, 1, 1, 3]
    assert '"status": "running"' in results[cl.STOCK_RUNC][0][2]
