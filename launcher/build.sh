#!/bin/sh
# The one build rule of the launcher, used by every install path (make venv,
# pip install's setuptools hook, the .deb, the installer image):
#
#   launcher/build.sh OUT [PY_ENTRY] [EXTRA_CFLAGS...]
#
# OUT: the binary to write. PY_ENTRY: where the launcher finds the Python entry,
# relative to its own directory unless absolute (default: runc-guard.py beside it).
# Static: no dynamic loader on every runtime call (measured: bench/launcher.py),
# and the binary runs on any glibc host the installer copies it to.
# CC (default gcc); SRC (default launcher/runc-guard.c: a test build names its own
# file, which includes it). Exits non-zero without a compiler: callers fall back to
# the Python entry as BinaryName.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$1
entry=${2:-runc-guard.py}
[ $# -ge 2 ] && shift 2 || shift 1
cc=${CC:-gcc}
src=${SRC:-$here/runc-guard.c}
tmp="$out.build.$$"
trap 'rm -f "$tmp"' EXIT
"$cc" -std=c11 -Wall -Wextra -Werror -O2 -static -DPY_ENTRY="\"$entry\"" "$@" -o "$tmp" "$src"
chmod 0755 "$tmp"
mv -f "$tmp" "$out"
