"""Assemble runc-guard.pyz: one executable file, a one-line ``env -S`` prelude followed by a zip.

Usage: build_pyz.py REPO DEPS_DIR OUT [PYTHON]

The zip holds runc_guard, its dependencies (DEPS_DIR, a ``pip install --target``)
and an unchecked-hash .pyc beside every .py (zipimport's layout: the hot path
never compiles and never checks a source). The prelude runs
``PYTHON -IS -c <2 statements>`` with the file itself on ``sys.path``. Why not a
plain zipapp: running a zip makes CPython import ``runpy`` and its dependencies
(~3 ms, a third of an interpreter start) and a zipapp's shebang cannot skip
``site``. Extension modules
(psutil) go under ``_native/`` and are extracted on first use by runc-guardctl
only. ``python3 runc-guard.pyz ...`` works too (zipimport skips the prelude).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import stat
import sys
import zipfile

SKIP_DIRS = {"__pycache__", "bin"}
#: The first line is the whole prelude: env -S splits it into python's argv and
#: execs it (same pid, fds, signal dispositions). Not sh: dash and bash export a
#: PWD (bash also SHLVL and _) the caller never set, and the runtime would inherit
#: them. Linux reads 255 bytes of a shebang (127 before 5.1: the build warns);
#: env -S needs coreutils >= 8.30. _runc_guard_main drops the leading "-c" from argv.
PRELUDE = (
    "#!/usr/bin/env -S @PYTHON@ -IS -c "
    "'import sys,os;sys.path[:0]=[os.path.realpath(sys.argv[1])];import _runc_guard_main'\n"
)
MAX_SHEBANG = 255
PORTABLE_SHEBANG = 127

NATIVE_SUFFIXES = (".so",)


def _pyc(source: bytes, path: str) -> bytes:
    """An unchecked-hash pyc (PEP 552) of ``source`` for this interpreter."""
    code = compile(source, path, "exec", dont_inherit=True, optimize=0)
    import marshal

    flags = 0b01  # hash-based, check_source=0
    return (
        importlib.util.MAGIC_NUMBER
        + flags.to_bytes(4, "little")
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def _walk(root: str, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            full = os.path.join(dirpath, name)
            out.append((full, os.path.join(prefix, os.path.relpath(full, root))))
    return out


def _native_packages(deps: str) -> set[str]:
    """Top-level packages that contain an extension module: they all go to _native/."""
    tops = set()
    for full, rel in _walk(deps):
        if full.endswith(NATIVE_SUFFIXES):
            tops.add(rel.split(os.sep, 1)[0])
    return tops


def build(repo: str, deps: str, out: str, python: str) -> None:
    entries: list[tuple[str, str]] = [
        (os.path.join(repo, "packaging", "single-file", "pyz_main.py"), "__main__.py"),
        (os.path.join(repo, "packaging", "single-file", "pyz_main.py"), "_runc_guard_main.py"),
    ]
    entries += _walk(os.path.join(repo, "runc_guard"), "runc_guard")
    own = (repo.rstrip(os.sep) + os.sep, )
    native = _native_packages(deps)
    native_hash = hashlib.sha256()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for full, rel in entries + _walk(deps):
            if rel.endswith((".pyc", ".pyi")) or rel.split(os.sep, 1)[0] in ("bin",):
                continue
            with open(full, "rb") as f:
                data = f.read()
            top = rel.split(os.sep, 1)[0]
            if top in native:
                native_hash.update(rel.encode() + b"\0" + data)
                zf.writestr("_native/" + rel, data)
                continue
            # runc-guard's own modules are stored uncompressed: the shim's hot path
            # then never imports zlib (zipimport loads it only to inflate).
            method = zipfile.ZIP_STORED if full.startswith(own) else zipfile.ZIP_DEFLATED
            zf.writestr(rel, data, compress_type=method)
            if rel.endswith(".py") and rel != "__main__.py":  # runpy wants the source
                zf.writestr(rel + "c", _pyc(data, rel), compress_type=method)
        if native:
            zf.writestr("_native/BUILD", native_hash.hexdigest()[:16] + "\n")
    prelude = PRELUDE.replace("@PYTHON@", python).encode()
    if len(prelude) > MAX_SHEBANG or b" " in python.encode() or b"'" in python.encode():
        raise SystemExit(f"interpreter path {python!r} does not fit a shebang line")
    if len(prelude) > PORTABLE_SHEBANG:
        print(f"warning: {len(prelude)}-byte shebang: kernels before 5.1 read only "
              f"{PORTABLE_SHEBANG}; use a shorter interpreter path for them", file=sys.stderr)
    with open(out + ".tmp", "wb") as f:
        f.write(prelude)
        f.write(buf.getvalue())
    os.chmod(out + ".tmp", 0o755 | stat.S_IFREG)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    build(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "/usr/bin/python3")
