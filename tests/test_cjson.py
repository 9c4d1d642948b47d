"""runc_guard.cjson gives what json gives: the same values, the same text, the same failures."""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runc_guard import cjson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cjson.__file__)))

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
)
_documents = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(_documents)
def test_dumps_is_json_dumps(doc: object) -> None:
    assert cjson.dumps(doc) == json.dumps(doc)
    assert cjson.dumps(doc, sort_keys=True) == json.dumps(doc, sort_keys=True)


@given(_documents, st.sampled_from(["", " ", "\n", " \t\r\n"]))
def test_loads_is_json_loads(doc: object, pad: str) -> None:
    text = pad + json.dumps(doc, ensure_ascii=False) + pad
    assert cjson.loads(text) == json.loads(text)
    raw = text.encode("utf-8", "surrogatepass")
    assert cjson.loads(raw) == json.loads(raw)


@given(st.binary(max_size=40))
def test_loads_fails_where_json_fails(raw: bytes) -> None:
    try:
        expected = json.loads(raw)
    except ValueError:
        with pytest.raises(ValueError):  # noqa: PT011 - json's own messages vary by failure
            cjson.loads(raw)
        return
    got = cjson.loads(raw)
    assert got == expected or (isinstance(got, float) and math.isnan(got) and math.isnan(expected))


@pytest.mark.parametrize(
    "raw",
    [b"", b" ", b"{", b"{} {}", b'{"a": 1}x', b"[1,]", b'"\x01"', b"\xef\xbb\xbf{}", b"nul", b"\xff"],
)
def test_bad_documents_raise_value_error(raw: bytes) -> None:
    try:
        expected: object = json.loads(raw)
    except ValueError:
        with pytest.raises(ValueError):  # noqa: PT011 - json's own messages vary by failure
            cjson.loads(raw)
    else:
        assert cjson.loads(raw) == expected


def test_other_encodings_go_to_json() -> None:
    doc = {"id": "abc", "pid": 7}
    for encoding in ("utf-16", "utf-16-le", "utf-32", "utf-8-sig"):
        assert cjson.loads(json.dumps(doc).encode(encoding)) == doc


def test_constants_and_failures_match_json() -> None:
    assert cjson.dumps([math.inf, -math.inf]) == json.dumps([math.inf, -math.inf])
    assert cjson.loads("[Infinity, -Infinity]") == [math.inf, -math.inf]
    assert math.isnan(cjson.loads("NaN"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cjson.dumps({"x": object()})
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        cjson.dumps(loop)
    shared = [1]
    assert cjson.dumps([shared, shared]) == "[[1], [1]]"  # no stale markers from the failures above


def test_a_bad_document_raises_value_error_where_json_was_never_imported() -> None:
    """The accelerator builds its errors from ``json.decoder``; where nothing imported it (the finisher,
    a fresh ``python -I``), a malformed object came out as SystemError, past every ``except ValueError``."""
    import subprocess
    import sys

    probe = ("import sys; from runc_guard import cjson\n"
             "for raw in (b'{not json', b'{\"a\" 1}', b'[1 2]', b'\"\\\\q\"'):\n"
             "    try: cjson.loads(raw)\n"
             "    except ValueError: pass\n"
             )  # fmt: skip
    done = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {ROOT!r}); {probe}"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
