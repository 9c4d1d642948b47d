"""Shared fixtures: a fake kernel for unit tests, real-kernel guards for kernel tests."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest

from labkit.kernel import wait_reported
from tests.fakes import FakeCgroupFs, FakeClock


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Kernel tests need root, cgroups and runc; say clearly why when they cannot run."""
    reason = None
    if os.geteuid() != 0:
        reason = "kernel tests need root"
    elif not shutil.which("runc"):
        reason = "kernel tests need runc (make deps installs it)"
    if reason:
        for item in items:
            if "kernel" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_fs(clock: FakeClock) -> FakeCgroupFs:
    return FakeCgroupFs(clock)


@pytest.fixture
def shim_binary() -> str:
    """The installed ``runc-guard`` next to the interpreter running the tests."""
    path = os.path.join(os.path.dirname(sys.executable), "runc-guard")
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
