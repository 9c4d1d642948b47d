#!/bin/bash
# Build dist/runc-guard_<version>_<arch>.deb with dpkg-deb alone (no debhelper):
# the launcher (launcher/build.sh: static, so no libc dependency) as
# /usr/bin/runc-guard, and the Python package on top of Debian's own python3-*
# libraries, its entry at /usr/lib/runc-guard/runc-guard.py. Needs gcc.
#
#   packaging/build-deb.sh [OUTDIR]      (default: dist/)
#
# PYTHON (default: .venv/bin/python, else python3) must have click: it renders
# runc-guardctl(8) from the commands' --help text.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then python=$repo/.venv/bin/python; else python=python3; fi
fi
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/runc_guard/__init__.py")
[ -n "$version" ] || { echo "build-deb: no __version__ in runc_guard/__init__.py" >&2; exit 1; }

stage=$(mktemp -d /tmp/runc-guard-deb.XXXXXX)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
deb=$here/debian
arch=$(dpkg --print-architecture)
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/python3/dist-packages" "$root/usr/lib/runc-guard" \
    "$root/etc/runc-guard" "$root/usr/share/doc/runc-guard" "$root/usr/share/man/man8"

# The package: sources only (postinst byte-compiles with the system python3).
(cd "$repo" && find runc_guard -name '*.py' -print0) | while IFS= read -r -d '' f; do
    install -D -m 0644 "$repo/$f" "$root/usr/lib/python3/dist-packages/$f"
done
# containerd's BinaryName: the launcher, which hands what it does not route itself to the entry.
"$repo/launcher/build.sh" "$root/usr/bin/runc-guard" /usr/lib/runc-guard/runc-guard.py
install -m 0755 "$deb/runc-guard" "$root/usr/lib/runc-guard/runc-guard.py"
install -m 0755 "$deb/runc-guardctl" "$root/usr/bin/"
install -m 0644 "$deb/config.toml" "$root/etc/runc-guard/config.toml"

# systemd units (sweep timer etc.) from packaging/systemd/, if present at build time.
if compgen -G "$here/systemd/*.service" >/dev/null || compgen -G "$here/systemd/*.timer" >/dev/null; then
    install -d "$root/lib/systemd/system"
    for unit in "$here"/systemd/*.service "$here"/systemd/*.timer "$here"/systemd/*.socket; do
        [ -f "$unit" ] && install -m 0644 "$unit" "$root/lib/systemd/system/"
    done
fi

# Docs and man pages.
install -m 0644 "$deb/copyright" "$root/usr/share/doc/runc-guard/copyright"
for doc in "$repo/README.md" "$repo"/contrib/containerd-config/*; do
    [ -f "$doc" ] && install -m 0644 "$doc" "$root/usr/share/doc/runc-guard/"
done
gzip -9n -c "$deb/runc-guard.8" > "$root/usr/share/man/man8/runc-guard.8.gz"
(cd "$repo" && PYTHONPATH=$repo "$python" "$here/render_man.py" "$version") \
    | gzip -9n > "$root/usr/share/man/man8/runc-guardctl.8.gz"

install -m 0644 "$deb/conffiles" "$root/DEBIAN/conffiles"
install -m 0755 "$deb/postinst" "$deb/prerm" "$deb/postrm" "$root/DEBIAN/"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" -e "s/@ARCH@/$arch/" "$deb/control.in" \
    > "$root/DEBIAN/control"

target=$out/runc-guard_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$target" >/dev/null
echo "$target"
