"""Figures a test run measured, shown at the end of pytest's output, pytest-xdist included.

Tests record a figure with ``record_property("figure", "...")``: properties travel
with the test reports from xdist workers to the controller, so the figure reaches
the terminal however the run is split. Both conftests (tests/, integration/) call
:func:`terminal_summary`; the section is written once per run.
"""

from __future__ import annotations

from typing import Any

import pytest

_PRINTED = pytest.StashKey[bool]()


def collected(terminalreporter: Any) -> list[str]:
    """Every ``figure`` property of the run, once per test (its teardown report carries them all)."""
    return sorted(
        str(value)
        for reports in terminalreporter.stats.values()
        for report in reports
        for key, value in getattr(report, "user_properties", ())
        if key == "figure" and getattr(report, "when", None) == "teardown"
    )


def terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Write the run's figures (stock vs runc-guard, timings) once, whichever conftest asks first."""
    if config.stash.get(_PRINTED, False):
        return
    config.stash[_PRINTED] = True
    figures = collected(terminalreporter)
    if figures:
        terminalreporter.section("runc-guard figures (stock vs runc-guard)")
        for line in figures:
            terminalreporter.write_line(line)
