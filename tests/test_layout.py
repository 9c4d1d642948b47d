"""The package's rooms keep their rules: what each program may load, checked in fresh interpreters.

``shim`` runs on every runtime call (stdlib only, nothing of the delete, node or
CLI code); ``delete`` runs once per container on containerd's critical path
(never the shim above it, the node tools or the CLI, and none of the heavy
libraries before it has replied); ``cli`` parses and prints, reaching the kernel
through ``node``; the shared leaves (the invocation, the deadline, the runtime's
lookup among them) stand below all of them.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil
import subprocess
import sys

import pytest

import runc_guard

PACKAGE = os.path.dirname(runc_guard.__file__)
SHARED_LEAVES = (
    "atomic", "cjson", "deadline", "errors", "invocation", "journal", "overload", "procinfo", "reporter",
    "routes", "runtime", "settings", "spool", "values",
)  # fmt: skip
#: Loaded only after the delete has replied (the reporter) or never by it: each costs
#: milliseconds of start-up on containerd's critical path (docs/benchmarks.md).
NOT_BEFORE_THE_REPLY = (
    "structlog", "tenacity", "psutil", "click", "prometheus_client", "asyncio", "dataclasses",
    "typing", "subprocess", "hashlib", "datetime", "tomllib",
    # the stdlib's own heavy ones (docs/benchmarks.md, "Clean delete"): json loads re and enum,
    # signal builds enums, contextlib and re load collections and functools
    "json", "re", "enum", "contextlib", "collections", "functools", "signal", "fnmatch",
    # a memcg held for the finisher is rare: its module (and binascii) load only then, ~0.8 ms
    "runc_guard.delete.memcg_hold", "binascii",
)  # fmt: skip


def modules_of(subpackage: str) -> list[str]:
    path = os.path.join(PACKAGE, subpackage)
    return [f"runc_guard.{subpackage}.{m.name}" for m in pkgutil.iter_modules([path])]


def loaded_after_import(module: str) -> list[str]:
    """Every module a fresh interpreter holds after ``import module`` (away from the source tree)."""
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                         cwd="/")  # fmt: skip
    return list(json.loads(out.stdout))


def third_party(names: list[str]) -> list[str]:
    """Top-level names that are neither the stdlib, runc-guard, nor there before any import
    (``__main__``, and what the interpreter's site loads, e.g. a venv's .pth hooks)."""
    baseline = set(loaded_at_start()) | {"__main__"}
    tops = {n.split(".")[0] for n in names if n not in baseline}
    return sorted(tops - set(sys.stdlib_module_names) - {"runc_guard"})


def loaded_at_start() -> list[str]:
    return loaded_after_import("sys")


@pytest.mark.parametrize("module", ["runc_guard.shim", *modules_of("shim")])
def test_shim_loads_only_the_stdlib_and_shared_leaves(module: str) -> None:
    """Importing any part of the shim loads no third-party module and nothing of delete, node or cli."""
    loaded = loaded_after_import(module)
    assert third_party(loaded) == []
    ours = [n for n in loaded if n.startswith("runc_guard.")]
    assert not [n for n in ours if n.split(".")[1] in ("delete", "node", "cli")], ours


@pytest.mark.parametrize("module", modules_of("delete"))
def test_delete_never_loads_node_or_cli(module: str) -> None:
    """The delete path loads nothing of the node tools or the CLI."""
    loaded = loaded_after_import(module)
    assert not [n for n in loaded if n.startswith(("runc_guard.node", "runc_guard.cli"))]


def test_delete_path_before_the_reply_is_light() -> None:
    """What the shim and the delete load before replying: none of the libraries that cost
    milliseconds each."""
    code = "import sys; import runc_guard.shim.entry, runc_guard.delete.run; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                         cwd="/")  # fmt: skip
    loaded = set(ast.literal_eval(out.stdout))
    assert [m for m in NOT_BEFORE_THE_REPLY if m in loaded] == []


def test_the_reporter_loads_no_logging_framework() -> None:
    """The reporter a delete detaches (one per delete on a quiet node) sends its entries with the
    stdlib alone: structlog's import (asyncio, ssl) cost ~50 ms of CPU a reporter, socket's ~8."""
    code = "import sys, runc_guard.reporter; print(' '.join(sorted(sys.modules)))"  # not json: it is checked
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True,
                         cwd="/")  # fmt: skip
    loaded = set(out.stdout.split())
    assert "runc_guard.reporter" in loaded
    assert not loaded & {"structlog", "logging", "asyncio", "json", "re", "typing", "socket", "enum"}


def _imports(path: str) -> list[str]:
    """Every module a file imports, at the top or inside a function (lazy imports too)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names]
    return found


@pytest.mark.parametrize(
    ("room", "forbidden"),
    [
        # shim/ is the front door above delete/: the delete never reaches back into it.
        ("delete", ("runc_guard.shim", "runc_guard.node", "runc_guard.cli", "runc_guard.logs")),
        ("node", ("runc_guard.cli",)),
        ("shim", ("runc_guard.node", "runc_guard.cli", "runc_guard.logs")),
        # The operator's commands parse and print; the kernel is reached through node/ only.
        ("cli", ("runc_guard.delete",)),
    ],
)
def test_no_import_runs_against_the_layout(room: str, forbidden: tuple[str, ...]) -> None:
    """Not even a lazy import inside a function crosses into a room above."""
    directory = os.path.join(PACKAGE, room)
    crossing = [
        (name, target)
        for name in sorted(os.listdir(directory)) if name.endswith(".py")
        for target in _imports(os.path.join(directory, name)) if target.startswith(forbidden)
    ]  # fmt: skip
    assert crossing == []


@pytest.mark.parametrize("leaf", SHARED_LEAVES)
def test_shared_leaves_stand_below_every_program(leaf: str) -> None:
    """A shared leaf imports only the stdlib and other shared leaves, even lazily."""
    imported = [t for t in _imports(os.path.join(PACKAGE, f"{leaf}.py")) if t.startswith("runc_guard")]
    allowed = tuple(f"runc_guard.{other}" for other in SHARED_LEAVES)
    assert [t for t in imported if t != "runc_guard" and not t.startswith(allowed)] == []
    assert third_party([t for t in _imports(os.path.join(PACKAGE, f"{leaf}.py"))]) == []


def test_the_layout_doc_is_the_package_as_it_is() -> None:
    """docs/layout.md's module table is what the modules' own docstrings say, module for module:
    a module added, moved, removed or re-described without ``python -m tests.layout_doc`` fails here."""
    from tests import layout_doc

    assert layout_doc.in_doc() == layout_doc.render()
