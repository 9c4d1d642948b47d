"""Shared fixtures: a fake kernel for unit tests, real-kernel guards for kernel tests."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator

import pytest

from labkit import figures, prereq
from labkit.kernel import wait_reported
from tests.fakes import FakeCgroupFs, FakeClock


def _kernel_tests_missing() -> str | None:
    if os.geteuid() != 0:
        return "kernel tests need root"
    if not shutil.which("runc"):
        return "kernel tests need runc (make deps installs it)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Kernel tests need root, cgroups and runc: without them, fail under CI, skip elsewhere."""
    if "kernel" in item.keywords:
        prereq.require_none(_kernel_tests_missing())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Figures recorded with record_property("figure", ...), from xdist workers too."""
    figures.terminal_summary(terminalreporter, config)


@pytest.fixture(autouse=True)
def _no_memcg_probe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit test that runs doctor in-process makes no probe memcg and caches no answer in the node's
    cache directory (node.memcg_probe); kernel tests probe for real."""
    if "kernel" in request.keywords:
        return
    from runc_guard.node import memcg_probe

    monkeypatch.setattr(memcg_probe, "probe", lambda mounts, *a, **kw: (None, "not probed: a unit test"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_fs(clock: FakeClock) -> FakeCgroupFs:
    return FakeCgroupFs(clock)


@pytest.fixture
def shim_binary() -> str:
    """The installed ``runc-guard`` next to the interpreter running the tests (the launcher)."""
    path = os.path.join(os.path.dirname(sys.executable), "runc-guard")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: install the package (make venv)")
    return path


@pytest.fixture
def python_entry(shim_binary: str) -> str:
    """The Python entry installed beside the launcher (``runc-guard.py``): a BinaryName of its own."""
    path = os.path.join(os.path.dirname(shim_binary), "runc-guard.py")
    if not os.path.exists(path):
        pytest.fail(f"{path} is missing: install the package (make venv)")
    return path


@pytest.fixture
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private directory for runc-guard's paths (pending, cache, logs); its reporters are done after."""
    path = str(tmp_path_factory.mktemp("rg"))
    yield path
    wait_reported(os.path.join(path, "cache"))


@pytest.fixture(autouse=True)
def _reporters_done(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that ran runc-guard with its paths in tmp_path ends only when its reporter is done."""
    tmp = str(request.getfixturevalue("tmp_path")) if "tmp_path" in request.fixturenames else None
    yield
    if tmp is not None:
        wait_reported(os.path.join(tmp, "cache"))


@pytest.fixture
def journald(tmp_path: object) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket standing in for journald's native one: (its path, the socket to read)."""
    path = os.path.join(str(tmp_path), "journal.socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()
