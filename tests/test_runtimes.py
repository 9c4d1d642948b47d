"""labkit.runtimes, the provider of the archive's runtimes: what a test sees when it cannot fetch.

The matrix depends on it, so its failure path is proven for real: apt itself
against a mirror that refuses connections (a closed port on loopback), with an
empty cache. The package must be named, under CI the test must fail, elsewhere skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit import prereq, runtimes


@pytest.fixture
def unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An empty cache and a mirror nothing listens on; the provider's memo cleared around it."""
    monkeypatch.setattr(runtimes, "CACHE_ROOT", str(tmp_path / "cache"))
    monkeypatch.setattr(runtimes, "MIRROR", "http://127.0.0.1:9/debian")
    monkeypatch.setattr(runtimes, "_update_failed", [])
    runtimes.tree.cache_clear()
    yield
    runtimes.tree.cache_clear()


@pytest.mark.parametrize(
    ("debian", "upstream"),
    [("2.1.9+ds1-5", "2.1.9"), ("1.7.24~ds1-6+deb13u1", "1.7.24"), ("1.28-1", "1.28"),
     ("1:2.6.1-1+b2", "2.6.1"), ("0.36.4-1", "0.36.4")],
)  # fmt: skip
def test_upstream_version_drops_epoch_and_debian_parts(debian: str, upstream: str) -> None:
    assert runtimes.upstream(debian) == upstream


def test_unreachable_archive_names_the_package(unreachable: None) -> None:
    """No archive, no cache: nothing is returned, and the reason names the package and apt's error."""
    assert runtimes.find(runtimes.RUNC_13) is None
    why = runtimes.why_missing(runtimes.RUNC_13)
    assert "runc 1.3 (sid)" in why and "apt-get update" in why, why


def test_require_fails_under_ci_and_skips_elsewhere(
    unreachable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one rule of labkit.prereq: a CI run fails on the missing package, a developer's skips."""
    monkeypatch.setenv(prereq.CI_ENV, "true")
    with pytest.raises(pytest.fail.Exception, match=r"fails under CI=true.*crun 1\.28 \(sid\)"):
        runtimes.require(runtimes.CRUN_128)
    monkeypatch.setenv(prereq.CI_ENV, "")
    with pytest.raises(pytest.skip.Exception, match=r"crun 1\.28 \(sid\)"):
        runtimes.require(runtimes.CRUN_128)


def test_a_ready_tree_of_the_series_serves_when_the_archive_is_away(unreachable: None) -> None:
    """A cached tree of the right series is used offline; one of another series never is."""
    for version, ready in (("1.3.6+ds1-1", True), ("1.4.0-1", True), ("1.3.5-1", False)):
        tree = Path(runtimes.CACHE_ROOT) / "sid" / f"runc_{version}"
        tree.mkdir(parents=True)
        (tree / "VERSION").write_text(version + "\n")
        if ready:
            (tree / ".ready").touch()
    found = runtimes.tree(runtimes.RUNC_13_PKG)
    assert found.endswith("runc_1.3.6+ds1-1"), found
