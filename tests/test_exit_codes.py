"""One exit-code table: runc_guard/errors.py. The README, the man page and the launcher say the same.

The delete's own verdicts are what containerd and an operator read; a code documented in one
place and changed in another is a lie to one of them. errors.py is the table; this test holds
the three other places to it.
"""

from __future__ import annotations

import os
import re

from runc_guard import errors

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
#: The delete's (runc-guard's) own verdicts, each documented for the operator.
DELETE_CODES = {
    errors.EXIT_UNSAFE_STATE, errors.EXIT_RUNTIME_UNAVAILABLE, errors.EXIT_INTERNAL,
    errors.EXIT_CGROUP_ERROR, errors.EXIT_CGROUP_BUSY, errors.EXIT_CONFIG,
}  # fmt: skip


def _read(*parts: str) -> str:
    with open(os.path.join(TOP, *parts)) as f:
        return f.read()


def test_every_code_in_errors_is_a_delete_code_or_a_node_tools_code() -> None:
    """errors.py names each code once, and each code means one thing; the node tools' codes (66, 73
    locked, 77) are not the delete's."""
    codes = [v for k, v in vars(errors).items() if k.startswith("EXIT_")]
    assert len(codes) == len(set(codes)), sorted(codes)
    named = set(codes)
    assert named == DELETE_CODES | {errors.EXIT_NO_HIERARCHY, errors.EXIT_SWEEP_LOCKED,
                                    errors.EXIT_FOREIGN_PID_NAMESPACE}  # fmt: skip


def test_the_readme_table_is_errors_py() -> None:
    """The README's exit-code table lists exactly the delete's codes (and 0, and 128+N)."""
    text = _read("README.md").split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    codes = {int(c) for c in re.findall(r"^\| (\d+) \|", text, re.M)}
    assert codes == DELETE_CODES | {0}
    assert "| 128+N |" in text


def test_the_man_page_is_errors_py() -> None:
    """runc-guard(8)'s EXIT STATUS lists exactly the delete's codes."""
    text = _read("packaging", "debian", "runc-guard.8").split(".SH EXIT STATUS", 1)[1].split(".SH", 1)[0]
    assert {int(c) for c in re.findall(r"^(\d+) ", text, re.M)} == DELETE_CODES


def test_the_launchers_codes_are_errors_py() -> None:
    """The launcher restates the two codes it can end with itself; both are errors.py's."""
    source = _read("launcher", "runc-guard.c")
    defined = dict(re.findall(r"^#define (EXIT_\w+) (\d+)$", source, re.M))
    assert defined == {"EXIT_RUNTIME_UNAVAILABLE": str(errors.EXIT_RUNTIME_UNAVAILABLE),
                       "EXIT_CONFIG": str(errors.EXIT_CONFIG)}  # fmt: skip
    header = source.split("*/", 1)[0]
    assert {int(c) for c in re.findall(r"^ \*   (\d+) \(EXIT_", header, re.M)} == {69, 78}
