"""The pure containerd config change: versions 1-3, imports, nvidia chains, idempotence.

Where containerd is installed, its own parser (``containerd --config F config
dump``, no daemon needed) must accept every result and show the BinaryName.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
from typing import Any

import pytest
import tomlkit

from labkit import prereq
from runc_guard.errors import EXIT_CONFIG, ContainerdConfigError
from runc_guard.node.containerd_config import (
    ConfigFile,
    plan_fronting,
    runtime_mappings,
    with_runtime_mappings,
    without_runtime_mappings,
)

GUARD = "/usr/bin/runc-guard"
CRI2 = "io.containerd.grpc.v1.cri"
CRI3 = "io.containerd.cri.v1.runtime"
CONTAINERD = shutil.which("containerd")
needs_containerd = prereq.needs(CONTAINERD, "containerd (make deps installs it)")

NVIDIA_V2 = f'''version = 2

[plugins."{CRI2}".containerd]
  default_runtime_name = "nvidia"

  # GPU pods: nvidia-container-runtime adds the GPU hooks, then runs runc.
  [plugins."{CRI2}".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI2}".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
      SystemdCgroup = true

  [plugins."{CRI2}".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."{CRI2}".containerd.runtimes.runc.options]
      SystemdCgroup = true  # keep me

  [plugins."{CRI2}".containerd.runtimes.kata]
    runtime_type = "io.containerd.kata.v2"
'''

V3 = f'''version = 3

[plugins."{CRI3}".containerd]
  default_runtime_name = "runc"

  [plugins."{CRI3}".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

    [plugins."{CRI3}".containerd.runtimes.runc.options]
      SystemdCgroup = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
'''


@pytest.fixture(scope="module")
def default_v2() -> str:
    """containerd 1.6's own default config (the file most nodes start from)."""
    prereq.require(CONTAINERD, "containerd (make deps installs it)")
    assert CONTAINERD is not None
    return subprocess.run(
        [CONTAINERD, "config", "default"], capture_output=True, text=True, check=True
    ).stdout


def dump(tmp_path: Any, files: dict[str, str], main: str = "config.toml") -> str:
    """containerd's view of a config set, as ``config dump`` prints it."""
    for name, text in files.items():
        path = os.path.join(tmp_path, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    assert CONTAINERD is not None
    return subprocess.run(
        [CONTAINERD, "--config", os.path.join(tmp_path, main), "config", "dump"],
        capture_output=True, text=True, check=True,
    ).stdout


def runtimes(text: str, plugin: str = CRI2) -> dict[str, Any]:
    return tomlkit.parse(text).unwrap()["plugins"][plugin]["containerd"]["runtimes"]  # type: ignore[no-any-return]


def one(text: str | None, **kw: Any) -> tuple[str, Any]:
    plan = plan_fronting([ConfigFile("/etc/containerd/config.toml", text)], GUARD, **kw)
    return plan.edits["/etc/containerd/config.toml"][1], plan


def changed_lines(before: str, after: str) -> list[str]:
    return [
        line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="")
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]


@needs_containerd
def test_default_16_config_changes_exactly_the_binaryname_line(default_v2: str) -> None:
    """On containerd 1.6.20's default config only the runc BinaryName line changes."""
    after, plan = one(default_v2)
    assert changed_lines(default_v2, after) == [
        '-            BinaryName = ""',
        f'+            BinaryName = "{GUARD}"',
    ]
    assert plan.version == 2
    assert [f.handler for f in plan.fronted] == ["runc"]
    assert plan.mappings == {}


@needs_containerd
def test_containerd_accepts_configured_default_config(default_v2: str, tmp_path: Any) -> None:
    """containerd's own parser reads the result and shows runc-guard as runc's BinaryName."""
    after, _ = one(default_v2)
    shown = runtimes(dump(tmp_path, {"config.toml": after}))
    assert shown["runc"]["options"]["BinaryName"] == GUARD
    assert shown["runc"]["runtime_type"] == "io.containerd.runc.v2"


@needs_containerd
def test_configuring_twice_is_a_no_op(default_v2: str) -> None:
    """Planning on an already configured file changes nothing."""
    after, _ = one(default_v2)
    again = plan_fronting([ConfigFile("/c.toml", after)], GUARD)
    assert not again.changed
    assert [f.changed for f in again.fronted] == [False]


def test_nvidia_handler_is_chained_through_a_per_handler_link() -> None:
    """A handler running nvidia-container-runtime gets runc-guard-nvidia and a [runtimes] entry."""
    after, plan = one(NVIDIA_V2)
    shown = runtimes(after)
    assert shown["nvidia"]["options"]["BinaryName"] == "/usr/bin/runc-guard-nvidia"
    assert shown["nvidia"]["options"]["SystemdCgroup"] is True
    assert shown["runc"]["options"]["BinaryName"] == GUARD
    assert "BinaryName" not in shown["kata"].get("options", {})
    assert plan.mappings == {"runc-guard-nvidia": "/usr/bin/nvidia-container-runtime"}
    assert plan.links == ("runc-guard-nvidia",)
    assert "# keep me" in after and "# GPU pods" in after


def test_nvidia_chain_is_idempotent_with_its_mapping() -> None:
    """Re-running with the mapping in place is a no-op; without it, refusing beats guessing."""
    after, plan = one(NVIDIA_V2)
    again = plan_fronting([ConfigFile("/c.toml", after)], GUARD, mappings=plan.mappings)
    assert not again.changed
    nvidia = next(f for f in again.fronted if f.handler == "nvidia")
    assert nvidia.runtime == "/usr/bin/nvidia-container-runtime"
    with pytest.raises(ContainerdConfigError, match="no entry 'runc-guard-nvidia'"):
        plan_fronting([ConfigFile("/c.toml", after)], GUARD)


@needs_containerd
def test_containerd_accepts_nvidia_chain(tmp_path: Any) -> None:
    """containerd parses the chained config: both handlers point at runc-guard names."""
    after, _ = one(NVIDIA_V2)
    shown = runtimes(dump(tmp_path, {"config.toml": after}))
    assert shown["nvidia"]["options"]["BinaryName"] == "/usr/bin/runc-guard-nvidia"
    assert shown["runc"]["options"]["BinaryName"] == GUARD
    assert shown["runc"]["options"]["SystemdCgroup"] is True


def test_version_3_uses_the_2x_runtime_plugin() -> None:
    """Config version 3 is edited under io.containerd.cri.v1.runtime, formatting kept."""
    after, plan = one(V3)
    assert plan.version == 3
    parsed = tomlkit.parse(after).unwrap()
    options = parsed["plugins"][CRI3]["containerd"]["runtimes"]["runc"]["options"]
    assert options == {"SystemdCgroup": True, "BinaryName": GUARD}
    assert CRI2 not in parsed["plugins"]
    assert [line.replace(" ", "") for line in changed_lines(V3, after)] == [
        f'+BinaryName="{GUARD}"'
    ]


@pytest.mark.parametrize(("text", "version", "plugin"), [
    (None, 2, CRI2), ("", 2, CRI2), ("\n\n", 3, CRI3), (None, 3, CRI3),
])
def test_missing_or_empty_file_gets_a_complete_handler(
    text: str | None, version: int, plugin: str
) -> None:
    """A missing/empty file gets a version header and a runc handler with its runtime_type."""
    after, plan = one(text, default_version=version)
    parsed = tomlkit.parse(after).unwrap()
    assert parsed["version"] == version
    runc = parsed["plugins"][plugin]["containerd"]["runtimes"]["runc"]
    assert runc == {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": GUARD}}
    assert plan.fronted[0].created


@needs_containerd
def test_containerd_accepts_a_created_file(tmp_path: Any) -> None:
    """The file written for an empty config is a valid containerd 1.6 config with runtime_type."""
    after, _ = one("")
    shown = runtimes(dump(tmp_path, {"config.toml": after}))
    assert shown["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert shown["runc"]["options"]["BinaryName"] == GUARD


def test_comment_only_file_keeps_its_comments() -> None:
    """A file of comments is 'empty' to containerd, but its comments stay."""
    after, _ = one("# managed by ansible\n")
    assert after.startswith("# managed by ansible\n")
    assert tomlkit.parse(after)["version"] == 2


def test_version_1_file_uses_the_cri_short_name() -> None:
    """A file without ``version`` (containerd's version 1) is edited under plugins.cri."""
    after, plan = one('[plugins.cri.containerd]\n  snapshotter = "overlayfs"\n')
    assert plan.version == 1
    assert runtimes(after, "cri")["runc"]["options"]["BinaryName"] == GUARD


def test_inline_and_dotted_handlers_are_edited_in_place() -> None:
    """Handlers written as inline tables or dotted keys keep their other options."""
    inline = (f'version = 2\n[plugins."{CRI2}".containerd.runtimes]\n'
              'runc = { runtime_type = "io.containerd.runc.v2", options = { SystemdCgroup = true } }\n')
    dotted = (f'version = 2\n[plugins."{CRI2}".containerd]\n'
              '  runtimes.runc.runtime_type = "io.containerd.runc.v2"\n'
              '  runtimes.runc.options.SystemdCgroup = true\n')
    for text in (inline, dotted):
        after, _ = one(text)
        assert runtimes(after)["runc"] == {
            "runtime_type": "io.containerd.runc.v2",
            "options": {"SystemdCgroup": True, "BinaryName": GUARD},
        }


def test_requested_handler_is_created_and_others_left_alone() -> None:
    """--runtime names exactly the handlers to front; a missing one is created."""
    after, plan = one(NVIDIA_V2, requested=["runc-guard"])
    shown = runtimes(after)
    assert shown["runc-guard"] == {  # a copy of the default handler (nvidia): its driver too
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": GUARD},
    }
    assert shown["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert "BinaryName" not in shown["runc"]["options"]
    assert [f.handler for f in plan.fronted] == ["runc-guard"]


def test_non_runc_handler_is_refused() -> None:
    """A kata (or other non-runc-shim) handler has no BinaryName slot: refused, exit 78."""
    with pytest.raises(ContainerdConfigError, match="kata") as info:
        one(NVIDIA_V2, requested=["kata"])
    assert info.value.exit_code == EXIT_CONFIG


def test_handler_names_that_cannot_name_a_link_are_refused() -> None:
    """A chained handler's name becomes a file name, so '/' or '..' are refused."""
    text = NVIDIA_V2.replace("runtimes.nvidia", 'runtimes."a/b"')
    with pytest.raises(ContainerdConfigError, match="cannot name a file"):
        one(text)


def test_invalid_toml_is_a_config_error() -> None:
    """Unparseable input names the file and exits 78."""
    with pytest.raises(ContainerdConfigError, match="not valid TOML"):
        one("version = = 2")


def test_relative_binary_is_refused() -> None:
    """BinaryName must be absolute: the shim's PATH is not the operator's."""
    with pytest.raises(ContainerdConfigError, match="absolute"):
        plan_fronting([ConfigFile("/c.toml", "")], "runc-guard")


IMPORTED_NVIDIA = NVIDIA_V2.replace("version = 2\n", "")


def test_v2_imports_edit_the_file_that_owns_the_cri_section() -> None:
    """containerd 1.x lets the last file naming the CRI plugin win: that file is edited."""
    main = 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
    plan = plan_fronting(
        [ConfigFile("/etc/containerd/config.toml", main),
         ConfigFile("/etc/containerd/conf.d/10-gpu.toml", IMPORTED_NVIDIA)],
        GUARD,
    )
    assert list(plan.edits) == ["/etc/containerd/conf.d/10-gpu.toml"]
    assert {f.handler for f in plan.fronted} == {"runc", "nvidia"}


@needs_containerd
def test_containerd_sees_the_change_made_in_an_imported_file(tmp_path: Any) -> None:
    """Through containerd's own import merge, the imported handlers show runc-guard."""
    base = str(tmp_path)
    main = f'version = 2\nimports = ["{base}/conf.d/*.toml"]\n'
    plan = plan_fronting(
        [ConfigFile(f"{base}/config.toml", main),
         ConfigFile(f"{base}/conf.d/10-gpu.toml", IMPORTED_NVIDIA)],
        GUARD,
    )
    after = plan.edits[f"{base}/conf.d/10-gpu.toml"][1]
    shown = runtimes(dump(tmp_path, {"config.toml": main, "conf.d/10-gpu.toml": after}))
    assert shown["nvidia"]["options"]["BinaryName"] == "/usr/bin/runc-guard-nvidia"
    assert shown["runc"]["options"]["BinaryName"] == GUARD


def test_v3_imports_edit_each_handler_where_it_is_defined() -> None:
    """containerd 2.x merges deeply: a handler is edited in the last file defining it."""
    drop_in = (f'version = 3\n[plugins."{CRI3}".containerd.runtimes.nvidia]\n'
               'runtime_type = "io.containerd.runc.v2"\n'
               f'[plugins."{CRI3}".containerd.runtimes.nvidia.options]\n'
               'BinaryName = "/usr/bin/nvidia-container-runtime"\n')
    main = V3.replace("version = 3\n", 'version = 3\nimports = ["conf.d/*.toml"]\n')
    plan = plan_fronting(
        [ConfigFile("/etc/containerd/config.toml", main),
         ConfigFile("/etc/containerd/conf.d/gpu.toml", drop_in)],
        GUARD,
    )
    assert sorted(plan.edits) == ["/etc/containerd/conf.d/gpu.toml", "/etc/containerd/config.toml"]
    gpu = runtimes(plan.edits["/etc/containerd/conf.d/gpu.toml"][1], CRI3)
    assert gpu["nvidia"]["options"]["BinaryName"] == "/usr/bin/runc-guard-nvidia"
    assert "runc" not in gpu


def test_runtime_mappings_round_trip_keeps_the_settings_file() -> None:
    """Adding then removing configure's [runtimes] entries gives the original text back."""
    original = "# runc-guard settings\ndelete_timeout = 3.0  # seconds\n"
    mapping = {"runc-guard-nvidia": "/usr/bin/nvidia-container-runtime"}
    added = with_runtime_mappings(original, mapping, "s.toml")
    assert runtime_mappings(added, "s.toml") == mapping
    assert "# seconds" in added
    assert without_runtime_mappings(added, mapping, "s.toml") .rstrip("\n# ").startswith(
        original.rstrip("\n")
    )
    assert runtime_mappings(without_runtime_mappings(added, mapping, "s.toml"), "s.toml") == {}


def test_removing_mappings_spares_entries_the_operator_changed() -> None:
    """An entry whose value was changed by hand is not configure's to remove."""
    text = '[runtimes]\nrunc-guard-nvidia = "/opt/nvidia/runtime"\n'
    kept = without_runtime_mappings(
        text, {"runc-guard-nvidia": "/usr/bin/nvidia-container-runtime"}, "s.toml"
    )
    assert runtime_mappings(kept, "s.toml") == {"runc-guard-nvidia": "/opt/nvidia/runtime"}
