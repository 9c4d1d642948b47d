"""The delete path's name tests (plain string code, no ``re``) against the regexes they replaced."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from runc_guard.delete.paths import _is_kubelet_level, container_id_of

KUBELET_LEVEL = re.compile(
    r"^(kubepods(\.slice)?|burstable|besteffort|guaranteed|"
    r"kubepods-.*\.slice|pod[0-9a-fA-F_-]{8,}(\.slice)?)$"
)
BARE_ID = re.compile(r"^[0-9a-f]{64}\Z")
SCOPE_ID = re.compile(r"^(?:cri-containerd|docker|crio)-([0-9a-f]{64})\.scope\Z")

_PARTS = st.sampled_from(
    ["kubepods", "kubepods-", "burstable", "besteffort", "guaranteed", "pod", ".slice", ".scope",
     "cri-containerd-", "docker-", "crio-", "-", "_", ".", "\n", "0123abcd", "ABCDEF12", "g",
     "a" * 64, "f0" * 32]
)  # fmt: skip
_NAMES = st.lists(_PARTS, max_size=5).map("".join) | st.text(
    alphabet="0123456789abcdefABCDEFpod_-.\nslice", max_size=80
)


@given(_NAMES)
@example("kubepods-burstable-pod1234.slice")
@example("pod0123abcd\n")
@example("burstable\n\n")
@example("kubepods-\n.slice")
def test_kubelet_level_is_the_regex(name: str) -> None:
    assert _is_kubelet_level(name) == bool(KUBELET_LEVEL.match(name))


@given(_NAMES)
@example("f0" * 32)
@example("cri-containerd-" + "ab" * 32 + ".scope")
@example("docker-" + "ab" * 32 + ".scope\n")
@example("f0" * 32 + "\n")
def test_container_id_of_is_the_regex_at_end_of_string(name: str) -> None:
    """Exact names only: unlike ``$``, a trailing newline is no container's cgroup (the sweep stays away)."""
    scope = SCOPE_ID.match(name)
    expected = name if BARE_ID.match(name) else (scope.group(1) if scope else None)
    assert container_id_of(name) == expected
