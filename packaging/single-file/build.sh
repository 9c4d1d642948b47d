#!/bin/bash
# Build dist/runc-guard.pyz, one executable file for distributions without the .deb.
#
#   packaging/single-file/build.sh [OUTDIR]    (default: dist/)
#
# Needs a CPython 3.11 (PYTHON, default python3) with pip and access to PyPI for
# the dependencies (psutil's abi3 wheel runs on any CPython >= 3.6). Bytecode is
# compiled for PYTHON's version; other versions fall back to the sources inside.
# Install: copy to /usr/local/bin/runc-guard, symlink runc-guardctl to it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)
python=${PYTHON:-python3}
target_python=${PYZ_PYTHON:-/usr/bin/python3}  # the interpreter the file runs with
deps=$(mktemp -d /tmp/runc-guard-pyz.XXXXXX)
trap 'rm -rf "$deps"' EXIT
# Same dependency list as pyproject.toml, resolved to wheels for this platform.
reqs=$("$python" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
)
# shellcheck disable=SC2086
"$python" -m pip install -q --disable-pip-version-check --only-binary=:all: \
    --target "$deps" $reqs
"$python" "$here/build_pyz.py" "$repo" "$deps" "$out/runc-guard.pyz" "$target_python"
echo "$out/runc-guard.pyz"
