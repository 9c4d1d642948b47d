"""``configure containerd`` on the config shapes distributions ship, checked by containerd itself.

Each fixture under ``tests/fixtures/containerd/`` is a host root (see its README).
For every one: configure it, make containerd 1.6.20 (Debian 12), 1.7 (trixie) and 2.1 (sid)
read the result (``containerd --config F config dump``, no daemon) and find
runc-guard in front of exactly the handlers that run a runc-compatible binary,
run configure again (nothing may change), and revert (every byte of the tree
as before: no backup, record or directory left).

k3s and RKE2 read a template and write ``config.toml`` from it at start; the
test renders the fixture's template the way they would (its few actions
substituted) before asking containerd.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

import pytest
import tomlkit
from click.testing import CliRunner, Result

from labkit import prereq
from labkit import runtimes as lr
from runc_guard.cli import cli
from runc_guard.errors import EXIT_CONFIG, RuncGuardError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "containerd")
CRI_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "cri")
#: containerd builds: name -> how to find the binary (None: not installed here).
CONTAINERD_16 = "1.6.20"
CONTAINERD_17 = "1.7"
CONTAINERD_21 = "2.1"
#: What k3s substitutes for the actions the fixture templates use.
K3S_VALUES = {
    ".NodeConfig.Containerd.Opt": "/var/lib/rancher/k3s/agent/containerd",
    ".NodeConfig.SELinux": "false",
    ".NodeConfig.AgentConfig.PauseImage": "rancher/mirrored-pause:3.6",
    ".NodeConfig.AgentConfig.Snapshotter": "overlayfs",
    ".NodeConfig.AgentConfig.CNIBinDir": "/var/lib/rancher/k3s/data/current/bin",
    ".NodeConfig.AgentConfig.CNIConfDir": "/var/lib/rancher/k3s/agent/etc/cni/net.d",
    ".SystemdCgroup": "true",
}


@dataclass(frozen=True)
class Case:
    """A fixture: its config, the handlers configure must front, those it must leave."""

    config: str
    routed: frozenset[str]
    left: frozenset[str] = frozenset()
    version: int = 2
    template: str | None = None  # rendered into the config before containerd reads it
    refused: str = ""  # a fragment of the refusal message, when configure must refuse
    #: containerd builds that see other handlers than ``routed`` (with why)
    routed_by: dict[str, tuple[frozenset[str], str]] = field(default_factory=dict)


K3S = "var/lib/rancher/k3s/agent/etc/containerd"
RKE2 = "var/lib/rancher/rke2/agent/etc/containerd"
CASES = {
    "kind": Case("etc/containerd/config.toml", frozenset({"runc", "test-handler"}),
                 frozenset({"kata"})),
    "minikube-legacy": Case(
        "etc/containerd/config.toml", frozenset({"runc", "default"}), version=1,
        routed_by={
            CONTAINERD_21: (frozenset(), "2.1 reads a version 1 file's CRI section under "
                            "io.containerd.grpc.v1.cri and ignores its containerd table"),
        },
    ),
    "eks-nvidia-v2": Case("etc/containerd/config.toml", frozenset({"runc", "nvidia"})),
    "eks-nvidia-v3": Case("etc/containerd/config.toml", frozenset({"runc", "nvidia"}), version=3),
    "gpu-operator-dropin": Case("etc/containerd/config.toml",
                                frozenset({"runc", "nvidia", "nvidia-cdi"}), version=3),
    "k3s-v2-template": Case(f"{K3S}/config.toml", frozenset({"runc", "nvidia"}),
                            template=f"{K3S}/config.toml.tmpl"),
    "k3s-v3-dropin": Case(f"{K3S}/config.toml", frozenset({"runc", "nvidia", "nvidia-cdi"}),
                          frozenset({"kata-qemu"}), version=3),
    "k3s-v3-base-template": Case(f"{K3S}/config.toml", frozenset(), version=3,
                                 refused='extends {{ template "base" . }}'),
    "rke2-gpu-operator": Case(
        f"{RKE2}/config.toml",
        frozenset({"runc", "nvidia", "nvidia-cdi", "nvidia-experimental"}),
        template=f"{RKE2}/config.toml.tmpl",
    ),
}


def containerd_binary(build: str) -> str:
    """The build's containerd; one that cannot be had stops the test naming it (labkit.prereq)."""
    if build == CONTAINERD_16:
        found = shutil.which("containerd")
        prereq.require(found, "Debian 12's containerd 1.6.20 (make deps installs it)")
        return str(found)
    return lr.require(lr.CONTAINERD_17 if build == CONTAINERD_17 else lr.CONTAINERD_21)


def builds_for(case: Case) -> list[str]:
    """containerd 1.x reads config versions 1 and 2; 2.x reads all of them."""
    return [CONTAINERD_21] if case.version >= 3 else [CONTAINERD_16, CONTAINERD_17, CONTAINERD_21]


def render_k3s(template: str) -> str:
    """What k3s writes from a fixture template: its actions substituted, control lines dropped."""
    out = []
    for raw in template.split("\n"):
        if re.fullmatch(r"\s*\{\{-?\s*(if .*|end)\s*-?\}\}\s*", raw):
            continue
        line = raw
        for expr, value in K3S_VALUES.items():
            line = re.sub(r"\{\{-?\s*" + re.escape(expr) + r"\s*-?\}\}", value, line)
        assert "{{" not in line, f"render_k3s cannot render {line!r}"
        out.append(line)
    return "\n".join(out)


class Tree:
    """A fixture copied into a temporary host root, with runc-guard and its settings."""

    def __init__(self, name: str, root: str, shim: str) -> None:
        self.case = CASES[name]
        self.root = root
        shutil.copytree(os.path.join(FIXTURES, name), root, dirs_exist_ok=True)
        for path in self.files():
            with open(path) as f:
                text = f.read()
            if "@ROOT@" in text:
                with open(path, "w") as f:
                    f.write(text.replace("@ROOT@", root))
        self.binary = os.path.join(root, "usr/local/bin/runc-guard")
        os.makedirs(os.path.dirname(self.binary))
        shutil.copy2(shim, self.binary)
        self.settings = os.path.join(root, "etc/runc-guard/config.toml")
        self.config = os.path.join(root, self.case.config)

    def files(self) -> list[str]:
        return sorted(os.path.join(d, n) for d, _, names in os.walk(self.root) for n in names)

    def snapshot(self) -> dict[str, bytes]:
        """Every file and link below the root, by bytes (links by target)."""
        out = {}
        for path in self.files():
            if os.path.islink(path):
                out[path] = ("-> " + os.readlink(path)).encode()
            else:
                with open(path, "rb") as f:
                    out[path] = f.read()
        for d, dirs, _ in os.walk(self.root):
            for name in dirs:
                out[os.path.join(d, name) + "/"] = b""
        return out

    def run(self, *args: str, code: int = 0) -> Result:
        result = CliRunner().invoke(cli, [
            "configure", "containerd", "--config", self.config, "--binary", self.binary,
            "--settings", self.settings, "--restart-command", "true", *args,
        ])
        exit_code = result.exit_code
        if isinstance(result.exception, RuncGuardError):
            exit_code = result.exception.exit_code
        assert exit_code == code, f"exit {exit_code}\n{result.output}\n{result.exception!r}"
        return result

    def effective_config(self) -> str:
        """The config containerd reads: k3s/RKE2 first render their template into it."""
        if self.case.template is None:
            return self.config
        with open(os.path.join(self.root, self.case.template)) as f:
            rendered = render_k3s(f.read())
        path = self.config + ".rendered"
        with open(path, "w") as f:
            f.write(rendered)
        return path


def dump(binary: str, config: str) -> dict[str, Any]:
    out = subprocess.run([binary, "--config", config, "config", "dump"], capture_output=True,
                         text=True, check=True, timeout=60)
    return tomlkit.parse(out.stdout).unwrap()


def fronted_in_dump(doc: dict[str, Any], guard_dir: str) -> dict[str, str]:
    """handler -> the binary containerd will start for it, for every CRI handler in a dump.

    containerd 1.6's CRI turns a ``default_runtime`` with a runtime_type into the
    handler ``default`` (its v1 shim runs ``runtime_engine``).
    """
    plugins = doc.get("plugins", {})
    found: dict[str, str] = {}
    for plugin in CRI_PLUGINS:
        ctd = plugins.get(plugin, {}).get("containerd", {})
        for name, body in ctd.get("runtimes", {}).items():
            options = body.get("options") or {}
            found[name] = options.get("BinaryName") or options.get("Runtime") or body.get(
                "runtime_engine") or ""
        legacy = ctd.get("default_runtime") or {}
        if legacy.get("runtime_type"):
            options = legacy.get("options") or {}
            found["default"] = options.get("Runtime") or legacy.get("runtime_engine") or ""
    del guard_dir
    return found


def routed(found: dict[str, str], guard_dir: str) -> set[str]:
    return {name for name, binary in found.items()
            if os.path.dirname(binary) == guard_dir
            and os.path.basename(binary).startswith("runc-guard")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture_round_trip(name: str, tmp_path: Any, shim_binary: str) -> None:
    """Configure fronts exactly the runc-compatible handlers, twice is a no-op, revert is exact."""
    tree = Tree(name, str(tmp_path / "root"), shim_binary)
    case = tree.case
    original = tree.snapshot()
    if case.refused:
        result = tree.run(code=EXIT_CONFIG)
        assert case.refused in str(result.exception), result.exception
        assert tree.snapshot() == original
        return
    out = tree.run().output
    for handler in case.routed:
        assert f"handler {handler}: routed" in out, out
    for handler in case.left:
        assert f"handler {handler}: left alone" in out, out
    configured = tree.snapshot()
    assert "already configured" in tree.run().output
    assert tree.snapshot() == configured
    guard_dir = os.path.dirname(tree.binary)
    for build in builds_for(case):
        binary = containerd_binary(build)
        found = fronted_in_dump(dump(binary, tree.effective_config()), guard_dir)
        expected = case.routed_by.get(build, (case.routed, ""))[0]
        assert routed(found, guard_dir) == set(expected), (build, found)
    rendered = tree.config + ".rendered"
    if os.path.exists(rendered):
        os.unlink(rendered)
    tree.run("--revert")
    assert tree.snapshot() == original


def test_created_handler_copies_the_default_handlers_driver(tmp_path: Any, shim_binary: str) -> None:
    """EKS on 1.6 has no runc: the one configure adds copies nvidia's SystemdCgroup."""
    tree = Tree("eks-nvidia-v2", str(tmp_path / "root"), shim_binary)
    tree.run()
    with open(tree.config) as f:
        runc = tomlkit.parse(f.read()).unwrap()["plugins"]["io.containerd.grpc.v1.cri"][
            "containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"SystemdCgroup": True, "BinaryName": tree.binary}
    assert runc["privileged_without_host_devices"] is False


def test_kind_comment_stays_above_its_table(tmp_path: Any, shim_binary: str) -> None:
    """The options table added to test-handler does not separate kata's comment from kata."""
    tree = Tree("kind", str(tmp_path / "root"), shim_binary)
    tree.run()
    with open(tree.config) as f:
        text = f.read()
    assert "# Not a runc shim: must be left alone.\n[plugins." in text
    assert "# The handler name the RuntimeClass e2e tests expect: same settings as runc.\n[plugins" in text


def test_settings_file_starts_with_its_comment(tmp_path: Any, shim_binary: str) -> None:
    """A settings file configure creates does not start with a blank line."""
    tree = Tree("eks-nvidia-v2", str(tmp_path / "root"), shim_binary)
    tree.run()
    with open(tree.settings) as f:
        assert f.read().startswith("# Added by runc-guardctl")


def test_k3s_restart_names_its_unit(tmp_path: Any, shim_binary: str) -> None:
    """On k3s the restart hint is k3s's own unit, found among the node's unit files."""
    tree = Tree("k3s-v3-dropin", str(tmp_path / "root"), shim_binary)
    with open(tree.config) as f:  # the DaemonSet sees host paths in imports
        text = f.read().replace(tree.root + "/", "/")
    with open(tree.config, "w") as f:
        f.write(text)
    os.makedirs(os.path.join(tree.root, "etc/systemd/system"))
    with open(os.path.join(tree.root, "etc/systemd/system/k3s-agent.service"), "w") as f:
        f.write("[Service]\n")
    result = CliRunner().invoke(cli, [
        "configure", "containerd", "--host-root", tree.root,
        "--config", "/" + tree.case.config, "--binary", "/usr/local/bin/runc-guard",
        "--settings", "/etc/runc-guard/config.toml", "--dry-run",
    ])
    assert result.exit_code == 0, result.output
    assert "99-runc-guard.toml" in result.output
    result = CliRunner().invoke(cli, [
        "configure", "containerd", "--host-root", tree.root,
        "--config", "/" + tree.case.config, "--binary", "/usr/local/bin/runc-guard",
        "--settings", "/etc/runc-guard/config.toml",
    ])
    assert "systemctl restart k3s-agent" in result.output, result.output


def test_k3s_template_loop_is_refused_unless_narrowed(tmp_path: Any, shim_binary: str) -> None:
    """A handler rendered by a {{range}} cannot be edited: refused, naming it and --runtime."""
    tree = Tree("k3s-v2-template", str(tmp_path / "root"), shim_binary)
    template = os.path.join(tree.root, tree.case.template or "")
    with open(template) as f:
        text = f.read()
    head = text.index('[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]')
    loop = ('{{range $k, $v := .ExtraRuntimes}}\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."{{$k}}"]\n'
            '  runtime_type = "{{$v.RuntimeType}}"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."{{$k}}".options]\n'
            '  BinaryName = "{{$v.BinaryName}}"\n{{end}}\n')
    with open(template, "w") as f:
        f.write(text[:head] + loop)
    before = tree.snapshot()
    result = tree.run(code=EXIT_CONFIG)
    assert "nvidia are not written literally" in str(result.exception)
    assert tree.snapshot() == before
    tree.run("--runtime", "runc")
    with open(template) as f:
        assert f'  BinaryName = "{tree.binary}"' in f.read()
