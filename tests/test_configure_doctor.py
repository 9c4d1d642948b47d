"""``doctor`` shows, per containerd handler, what a pod will run: before and after configure."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from click.testing import CliRunner

from runc_guard.cli import cli
from tests.test_configure_fixtures import Tree


def doctor(config: str, settings: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["doctor", "--containerd-config", config, "--format", "json"],
                                env={"RUNC_GUARD_CONFIG": settings})
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_doctor_lists_every_handler_and_the_default(tmp_path: Any, shim_binary: str) -> None:
    """kind: runc and test-handler run plain runc (warned), kata is not a runc shim."""
    tree = Tree("kind", str(tmp_path / "root"), shim_binary)
    report = doctor(tree.config, tree.settings)
    routes = report["containerd_routes"]
    assert routes["default_handler"] == "runc"
    assert routes["handlers"]["kata"]["shim_runs"] is None
    assert routes["handlers"]["test-handler"]["shim_runs"] == "runc"
    assert sorted(w.split()[1] for w in report["warnings"]) == ["runc", "test-handler"]


def test_doctor_follows_the_chain_after_configure(tmp_path: Any, shim_binary: str) -> None:
    """After configure each runc handler's shim runs runc-guard, which runs the resolved runc."""
    tree = Tree("kind", str(tmp_path / "root"), shim_binary)
    tree.run()
    report = doctor(tree.config, tree.settings)
    for name in ("runc", "test-handler"):
        route = report["containerd_routes"]["handlers"][name]
        assert route["shim_runs"] == tree.binary
        assert os.path.basename(route["runc_guard_runs"]) == "runc", route
    assert report["warnings"] == []


@pytest.mark.parametrize("name", ["minikube-legacy"])
def test_doctor_names_the_legacy_default(name: str, tmp_path: Any, shim_binary: str) -> None:
    """A legacy default_runtime is the handler a pod without a RuntimeClass runs: doctor says so."""
    tree = Tree(name, str(tmp_path / "root"), shim_binary)
    routes = doctor(tree.config, tree.settings)["containerd_routes"]
    assert routes["default_handler"] == "default"
    assert routes["handlers"]["default"]["legacy_table"] == "default_runtime"
    tree.run()
    routes = doctor(tree.config, tree.settings)["containerd_routes"]
    assert routes["handlers"]["default"]["shim_runs"] == tree.binary


def test_doctor_names_a_handler_whose_link_lost_its_mapping(tmp_path: Any, shim_binary: str) -> None:
    """After configure, the settings file goes (an operator's cleanup, a config management run): each
    handler behind a runc-guard-<handler> link now fails with 78 instead of reaching plain runc, and
    doctor says so as a problem naming the handler."""
    tree = Tree("eks-nvidia-v2", str(tmp_path / "root"), shim_binary)
    tree.run()
    with open(tree.settings) as f:
        assert "runc-guard-nvidia" in f.read()
    os.unlink(tree.settings)
    report = doctor(tree.config, tree.settings)
    unmapped = {n: r for n, r in report["containerd_routes"]["handlers"].items() if "unmapped" in r}
    assert unmapped, report["containerd_routes"]
    for name, route in unmapped.items():
        assert "exit 78" in route["runc_guard_runs"]
        assert any(p.startswith(f"handler {name}: invoked as") for p in report["problems"])


def test_doctor_says_which_front_door_containerd_runs(
    tmp_path: Any, shim_binary: str, python_entry: str
) -> None:
    """The launcher (ELF) or the Python entry (a script): per handler and for the installed shim."""
    from runc_guard.node.doctor import LAUNCHER, PYTHON_ENTRY, front_door

    assert (front_door(shim_binary), front_door(python_entry)) == (LAUNCHER, PYTHON_ENTRY)
    assert front_door(str(tmp_path / "absent")).startswith("unknown")
    tree = Tree("kind", str(tmp_path / "root"), shim_binary)
    tree.run()
    report = doctor(tree.config, tree.settings)
    assert report["containerd_routes"]["handlers"]["runc"]["front_door"] == LAUNCHER
    assert "front_door" in report  # the runc-guard beside this runc-guardctl (none beside pytest)
