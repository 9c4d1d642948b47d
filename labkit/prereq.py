"""One rule for a missing prerequisite: under CI it fails the run, elsewhere it skips.

A skipped suite looks green. On a developer's machine that is what you want
(no containerd 2.2 here, no promtool there); in CI it hides a broken machine
or a lost setting behind a green run. So every test that needs something the
machine may lack (a runtime Debian's archive did not give, journald, promtool,
systemd-nspawn, qemu, ...) asks :func:`require`, which calls
``pytest.fail`` when the environment says ``CI=true`` (``.ci/run`` sets it) and
``pytest.skip`` otherwise, naming what is missing either way.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

#: The environment variable CI systems set (GitHub Actions, GitLab, ``.ci/run``).
CI_ENV = "CI"


def in_ci() -> bool:
    """Whether this run is CI's, where nothing may be skipped for want of a prerequisite."""
    return os.environ.get(CI_ENV, "").strip().lower() in ("1", "true", "yes")


def missing(what: str) -> NoReturn:
    """Stop the calling test because ``what`` is missing: fail under CI, skip elsewhere."""
    import pytest  # labkit also serves make demo and bench/, which run without pytest

    if in_ci():
        pytest.fail(f"missing prerequisite (fails under {CI_ENV}=true): {what}", pytrace=False)
    pytest.skip(f"missing prerequisite: {what}")


def require(present: object, what: str) -> None:
    """Go on when ``present`` is true; otherwise :func:`missing` (``what`` names it)."""
    if not present:
        missing(what)


def require_none(reason: str | None) -> None:
    """For the labs' ``missing_prerequisites()`` style: None means ready, a string names the gap."""
    if reason is not None:
        missing(reason)


def needs(present: object, what: str) -> Callable[[_F], _F]:
    """Decorator form of :func:`require`, where a module used ``pytest.mark.skipif``.

    The test keeps its signature (pytest still sets up its fixtures) and, when
    ``present`` is false, stops through :func:`missing` as its first act.
    """

    def decorate(test: _F) -> _F:
        if present:
            return test

        @functools.wraps(test)
        def stopped(*args: Any, **kwargs: Any) -> Any:
            missing(what)

        return stopped  # type: ignore[return-value]

    return decorate
