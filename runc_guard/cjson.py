"""``json.loads``/``json.dumps`` for the delete path, without importing ``json``.

``import json`` pulls in ``re`` and ``enum`` (about 5 ms of every delete's start,
a fifth of what runc-guard adds to containerd's wait). The parsing and encoding
that ``json`` does for us run in its C accelerator, ``_json``, anyway; this module
calls that accelerator with the settings ``json.loads``/``json.dumps`` use by
default, so the results are the same (``tests/test_cjson.py`` compares both on
generated documents). Whatever the fast path does not cover (no ``_json``, bytes
that are not plainly UTF-8) goes to ``json`` itself.
"""

from __future__ import annotations

_WHITESPACE = " \t\n\r"


def _constant(name: str) -> float:
    return float(name.lower().replace("infinity", "inf"))  # NaN, Infinity, -Infinity


class _ScanContext:
    """The attributes ``_json.make_scanner`` reads: ``json.loads``' defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_constant)


def _fail(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_scan: Any = None
_make_encoder: Any = None
try:
    import _json

    _scan = _json.make_scanner(_ScanContext)  # type: ignore[arg-type]  # reads only these attributes
    _make_encoder = _json.make_encoder
    _make_encoder({}, _fail, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True)
except (ImportError, AttributeError, TypeError):  # another interpreter: plain json
    _scan = _make_encoder = None


def loads(raw: bytes | str) -> object:
    """``json.loads(raw)``: the same value, or a ``ValueError`` where json raises one."""
    if _scan is None or (isinstance(raw, bytes) and not _plain_utf8(raw)):
        import json

        return json.loads(raw)
    text = raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"Expecting value: char {exc.value}") from None
    except SystemError:
        # The accelerator builds most of its errors from json.decoder and, where nothing imported
        # that, fails without one (CPython's raise_errmsg): json itself says what is wrong.
        import json

        return json.loads(text)
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"Extra data: char {end}")
    return value


def loads_object(raw: bytes | str) -> dict[str, Any]:
    """A JSON object from ``raw``; ``ValueError`` saying which it is not: valid JSON, or an object.

    Every record and state runc-guard reads is one JSON object of untrusted bytes: the
    one parse, each caller wrapping the reason in its own error.
    """
    try:
        doc = loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object")
    return doc


def _plain_utf8(raw: bytes) -> bool:
    """No BOM and no NUL in the first bytes: ``json.detect_encoding`` would say UTF-8."""
    head = raw[:4]
    return b"\x00" not in head and not head.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"))


def dumps(obj: object, sort_keys: bool = False) -> str:
    """``json.dumps(obj, sort_keys=sort_keys)`` with every other argument at its default."""
    if _make_encoder is None:
        import json

        return json.dumps(obj, sort_keys=sort_keys)
    if isinstance(obj, str):
        return _json.encode_basestring_ascii(obj)
    # A new encoder per call, as json.dumps makes: its circular-reference markers
    # would keep the ids of a failed call's objects.
    encode = _make_encoder({}, _fail, _json.encode_basestring_ascii, None, ": ", ", ", sort_keys, False, True)
    return "".join(encode(obj, 0))
