"""Fixtures of the containerd end-to-end suite: a private containerd and journald, fresh namespaces.

One hybrid (cgroup v1 + v2) containerd serves most tests for the whole session;
tests that need other runc-guard settings or another cgroup layout start their
own. Every fixture stops what it started, by pid, even when a test fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cache

import pytest

from labkit import containerd as cl
from labkit import figures, prereq
from labkit.journald import Journald, private_journald
from labkit.journald import available as journald_available
from labkit.kernel import FREEZER

#: Lines the storm test leaves for the end of the run (the numbers the issue asks for).
SUMMARY_KEY = pytest.StashKey[list[str]]()
#: Where a pytest-xdist worker hands its summary lines to the controller (workeroutput).
_WORKER_SUMMARY = "runc_guard_summary"


@cache
def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the containerd suite needs root"
    for tool in (cl.CONTAINERD, cl.CTR, cl.STOCK_RUNC, cl.NSENTER, cl.UNSHARE):
        if not os.access(tool, os.X_OK):
            return f"the containerd suite needs {tool} (make deps installs it)"
    if not os.path.isdir(FREEZER):
        return f"the containerd suite needs the cgroup v1 freezer at {FREEZER}"
    if not os.path.exists(cl.guard_binary()):
        return f"{cl.guard_binary()} is missing: install the package (make venv)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The containerd suite's prerequisites: without them, fail under CI, skip elsewhere."""
    if os.path.basename(str(item.path)).startswith("test_containerd_"):
        prereq.require_none(_missing())


#: Modules run first: the VM lab alone takes ~13-15 of `make test`'s minutes on one worker.
FIRST = ("test_vm_node.py", "test_vm_modern_node.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The VM lab first: `make test` hands modules out in collection order (loadscope without
    its reorder, which puts modules with many tests first), and the VM lab, collected last
    and with few tests, started once the other worker was nearly done: its whole length came
    on top of the rest (20 min for a local CI run)."""
    items.sort(key=lambda item: item.path.name not in FIRST)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[SUMMARY_KEY] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker: send the summary lines along with the worker's end of run."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_WORKER_SUMMARY] = list(session.config.stash.get(SUMMARY_KEY, []))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """In pytest-xdist's controller: collect a finished worker's summary lines for the terminal."""
    output = getattr(node, "workeroutput", None) or {}
    config = getattr(node, "config", None)
    if config is not None:
        config.stash.setdefault(SUMMARY_KEY, []).extend(output.get(_WORKER_SUMMARY, []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    lines = config.stash.get(SUMMARY_KEY, [])
    if lines:
        terminalreporter.section("runc-guard integration summary (storm, CRI, systemd lab)")
        for line in lines:
            terminalreporter.write_line(line)
    figures.terminal_summary(terminalreporter, config)


@pytest.fixture
def summary(request: pytest.FixtureRequest) -> list[str]:
    """Lines shown in pytest's terminal summary, e.g. the storm's numbers."""
    return request.config.stash[SUMMARY_KEY]


@pytest.fixture(scope="session")
def journal() -> Iterator[Journald | None]:
    """A private journald for the session, or None where the machine has none."""
    if not journald_available():
        yield None
        return
    with private_journald("rgctd") as jd:
        yield jd


@pytest.fixture(scope="session")
def guarded(
    tmp_path_factory: pytest.TempPathFactory, journal: Journald | None
) -> Iterator[cl.GuardedLab]:
    """The session's hybrid containerd, runc-guard settings in its environment."""
    socket = journal.socket if journal is not None else None
    with cl.guarded_containerd_in(tmp_path_factory, "rgctd-hybrid", cl.HYBRID, socket) as lab:
        yield lab


@pytest.fixture
def ctd(guarded: cl.GuardedLab) -> cl.Containerd:
    if not guarded.containerd.alive():
        pytest.fail(f"the session's containerd died:\n{guarded.containerd.log()[-2000:]}")
    return guarded.containerd


@pytest.fixture
def ns(ctd: cl.Containerd) -> Iterator[str]:
    """A fresh containerd namespace; its tasks, containers and cgroups go with it."""
    with cl.namespace(ctd) as name:
        yield name
