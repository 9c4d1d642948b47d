"""runc argv parsing: global flags exactly as runc 1.1 (Go flag package) reads them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runc_guard.invocation import DEFAULT_ROOT, parse, valid_container_id

CASES = [
    # (argv, subcommand, container_id, force, globals)
    (["delete", "c1"], "delete", "c1", False, {}),
    (["delete", "--force", "c1"], "delete", "c1", True, {}),
    (["delete", "-f", "c1"], "delete", "c1", True, {}),
    (["delete", "c1", "--force"], "delete", "c1", True, {}),
    (["delete", "--force=false", "c1"], "delete", "c1", False, {}),
    (["delete", "--", "c1"], "delete", "c1", False, {}),
    (["--root", "/r", "delete", "c1"], "delete", "c1", False, {"root": "/r"}),
    (["--root=/r", "delete", "c1"], "delete", "c1", False, {"root": "/r"}),
    (["-root", "/r", "delete", "c1"], "delete", "c1", False, {"root": "/r"}),
    (["--log", "delete", "delete", "c1"], "delete", "c1", False, {"log": "delete"}),
    (
        ["--log", "/b/log.json", "--log-format", "json", "--systemd-cgroup", "delete", "--force", "c1"],
        "delete",
        "c1",
        True,
        {"log": "/b/log.json", "log-format": "json", "systemd-cgroup": "true"},
    ),
    (["--debug", "state", "c1"], "state", None, False, {"debug": "true"}),
    (["--rootless", "auto", "--criu", "/c", "list"], "list", None, False, {"rootless": "auto", "criu": "/c"}),
    (["--", "delete", "c1"], "delete", "c1", False, {}),
    (["--root", "/a", "--root", "/b", "delete", "c1"], "delete", "c1", False, {"root": "/b"}),
]


@pytest.mark.parametrize(("argv", "sub", "cid", "force", "globals_"), CASES)
def test_parse_table(
    argv: list[str], sub: str, cid: str | None, force: bool, globals_: dict[str, str]
) -> None:
    """Each form runc accepts yields the subcommand, id, --force and globals runc would see."""
    inv = parse(argv)
    assert (inv.subcommand, inv.container_id, inv.force, inv.globals) == (sub, cid, force, globals_)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--version"],
        ["--help"],
        ["features"],
        ["--unknown", "delete", "c1"],
        ["--root"],
        ["delete"],
        ["delete", "a", "b"],
        ["delete", "--bogus", "c1"],
        ["delete", "../etc"],
        ["delete", "a/b"],
        ["delete", ".."],
        ["delete", ""],
        ["delete", "x" * 300],
        ["delete", "caf\u00e9"],
        ["delete", "--force=maybe", "c1"],
        # strconv.ParseBool takes 1 t T TRUE true True (and their false twins) only: runc refuses these.
        ["delete", "--force=tRue", "c1"],
        ["delete", "-f=fAlse", "c1"],
    ],
)
def test_not_interposed(argv: list[str]) -> None:
    """Anything but a delete of exactly one id runc accepts is passed through untouched."""
    assert not parse(argv).is_delete


def test_bool_flag_never_consumes_next_word() -> None:
    """`--debug delete c1` is delete with debug on, as in Go's flag package."""
    inv = parse(["--debug", "delete", "c1"])
    assert inv.is_delete and inv.globals == {"debug": "true"}


def test_root_defaults_to_runc_default() -> None:
    """Without --root the state lives where runc keeps it as root: /run/runc."""
    assert parse(["delete", "c1"]).root == DEFAULT_ROOT == "/run/runc"


def test_invocation_is_immutable() -> None:
    """A parsed invocation cannot be changed after the fact."""
    inv = parse(["delete", "c1"])
    with pytest.raises(AttributeError):
        inv.container_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("cid", "ok"),
    [
        ("abc", True),
        ("a+b,c-d.e_f", True),
        ("0" * 64, True),
        (".", False),
        ("..", False),
        ("a b", False),
        ("a\0b", False),
        ("/abs", False),
        ("a:b", False),
        ("\u0661", False),
    ],
)
def test_valid_container_id(cid: str, ok: bool) -> None:
    """Only ids runc's own regex ^[\\w+-\\.]+$ accepts (ASCII) are acted on."""
    assert valid_container_id(cid) is ok


@given(st.lists(st.text(), max_size=30))
def test_parse_never_raises_and_ids_are_safe(argv: list[str]) -> None:
    """Any argv parses; an id is only ever one runc would accept (never a path)."""
    inv = parse(argv)
    if inv.container_id is not None:
        assert valid_container_id(inv.container_id)
        assert "/" not in inv.container_id and inv.container_id not in (".", "..")
