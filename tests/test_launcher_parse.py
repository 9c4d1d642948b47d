"""The launcher parses a runtime command line exactly as runc_guard.invocation does (differential)."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runc_guard import invocation as argv_mod
from tests.launcher import builds

ROOT = "/run/containerd/runc/k8s.io"
LOG = "/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1/log.json"
GO = ["--root", ROOT, "--log", LOG, "--log-format", "json"]
ID = "4f1c0a5e" * 8

#: The command lines go-runc builds (runc.go: args() then each command's own flags).
GO_RUNC = [
    [*GO, "delete", "--force", ID],
    [*GO, "--systemd-cgroup", "delete", "--force", ID],
    [*GO, "delete", ID],
    ["--root", ROOT, "delete", "--force", ID],  # the shim's dead-shim cleanup (no --log)
    [*GO, "state", ID],
    [*GO, "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "--console-socket", "/tmp/c.sock", ID],
    [*GO, "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "--no-pivot", "--no-new-keyring", ID],
    [*GO, "start", ID],
    [*GO, "kill", ID, "9"],
    [*GO, "kill", "--all", ID, "15"],
    [*GO, "ps", "--format", "json", ID],
    [*GO, "exec", "--process", "/tmp/p.json", "--detach", "--pid-file", "/b/exec.pid", ID],
    [*GO, "pause", ID],
    [*GO, "resume", ID],
    [*GO, "update", "--resources", "-", ID],
    [*GO, "events", "--stats", ID],
    [*GO, "checkpoint", "--image-path", "/i", "--work-path", "/w", ID],
    [*GO, "restore", "--bundle", "/b", "--image-path", "/i", ID],
    [*GO, "list", "--format", "json"],
    ["features"],
    ["--version"],
    ["--debug", *GO, "delete", "--force", ID],
]

#: Words that exercise every branch of the parser, for the generated lines.
WORDS = [
    "--root", "-root", "--root=/x", "--root=", "-root=/y", "--log", "--log=delete", "-log-format", "json",
    "--criu", "--rootless=auto", "--debug", "-debug=false", "--systemd-cgroup=0", "--help", "-h", "-h=false",
    "--version", "-v", "--version=FALSE", "-v=maybe", "--unknown", "-x=1", "delete", "state", "--force",
    "-f", "--force=false", "--force=TRUE", "--force=t", "-force=0", "--force=maybe", "-f=F", "--force=tRue",
    "--force=True", "-f=fAlse", "--force=FALSE", "--", "-",
    "---x", "-=x", "--=x", "", ".", "..", "c1", "../c1", "a b", "a" * 255, "a" * 256, "c+,-.9_Z", "caf\u00e9",
]


def python_parse(args: list[bytes]) -> str:
    """runc_guard.invocation's answer, in the parse-only build's format."""
    inv = argv_mod.parse([os.fsdecode(a) for a in args])

    def hexed(value: str | None) -> str:
        return "-" if value is None else "x" + os.fsencode(value).hex()

    return (
        f"subcommand={hexed(inv.subcommand)}\nid={hexed(inv.container_id)}\nforce={int(inv.force)}\n"
        f"root={hexed(inv.root)}\ndelete={int(inv.is_delete)}\n"
    )


@pytest.fixture(scope="module")
def parse_only(tmp_path_factory: pytest.TempPathFactory) -> str:
    return builds.parse_only(str(tmp_path_factory.mktemp("launcher")))


def c_parse(binary: str, args: list[bytes]) -> str:
    return subprocess.run([binary.encode(), *args], capture_output=True, check=True).stdout.decode()


@pytest.mark.parametrize("line", GO_RUNC, ids=lambda line: " ".join(line)[-60:])
def test_go_runc_command_lines(parse_only: str, line: list[str]) -> None:
    """Every shape go-runc sends: both parsers agree on subcommand, id, force, root and delete."""
    args = [w.encode() for w in line]
    assert c_parse(parse_only, args) == python_parse(args)


def test_the_corpus_means_what_it_says(parse_only: str) -> None:
    """The differential is not vacuous: an interposed delete, a forced one and a help line are told apart."""
    assert "delete=1" in c_parse(parse_only, [w.encode() for w in GO_RUNC[0]])
    assert "force=1" in c_parse(parse_only, [w.encode() for w in GO_RUNC[0]])
    assert "delete=0" in c_parse(parse_only, [b"--help", b"delete", b"c1"])
    assert "delete=0" in c_parse(parse_only, [b"--log", b"delete", b"x", b"c1"])
    assert f"root=x{b'/q'.hex()}" in c_parse(parse_only, [b"--root=/x", b"-root", b"/q", b"state"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.sampled_from(WORDS).map(str.encode),
                          st.binary(max_size=12).filter(lambda b: b"\0" not in b)), max_size=10))
def test_generated_command_lines(parse_only: str, words: list[bytes]) -> None:
    """Generated lines (every flag form, =false, repeats, --, odd, over-long and non-UTF-8 words) agree."""
    assert c_parse(parse_only, words) == python_parse(words)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(WORDS).map(str.encode), max_size=6),
       st.lists(st.sampled_from([*WORDS, "delete", "--force", "c1"]).map(str.encode), max_size=5))
def test_generated_deletes(parse_only: str, flags: list[bytes], tail: list[bytes]) -> None:
    """Global flags in front of a delete: the case the launcher routes on."""
    words = [*flags, b"delete", *tail]
    assert c_parse(parse_only, words) == python_parse(words)
