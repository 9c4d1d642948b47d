#!/bin/bash
# runc-guard node installer: the DaemonSet container's entrypoint.
#
# In the style of the NVIDIA container toolkit container: copy runc-guard onto
# the host, check that the host can run it, point containerd's runc handlers at
# it (runc-guardctl configure containerd), restart containerd only when asked,
# then stay up so that the pod's preStop hook (uninstall.sh) can revert.
#
# Environment (defaults in brackets):
#   HOST_ROOT [/host]                where the host's paths are mounted
#   PAYLOAD [/payload]               files to copy, laid out as on the host
#   PREFIX [/opt/runc-guard]         host directory for runc-guard (bin/, python/)
#   CONTAINERD_CONFIG [/etc/containerd/config.toml]
#   RUNTIMES []                      comma-separated handlers to front (default:
#                                    runc + handlers already chained, e.g. nvidia)
#   RESTART_CONTAINERD [false]       restart containerd when its config changed
#   HOST_EXEC [nsenter -t 1 -m -u -i -n -p --]   runs a command on the host
#                                    (needs hostPID); "" runs it here (tests)
#   DRY_RUN [false]                  print the change, write nothing
#   ONESHOT [false]                  exit after installing (no sleep)
#   VERSION []                       name of the version directory (default: a
#                                    hash of the payload, so a re-install of the
#                                    same payload changes nothing)
#
# Layout on the host (one atomic switch per upgrade):
#   PREFIX/versions/<version>/...    the payload's PREFIX tree, never modified
#                                    once complete
#   PREFIX/current -> versions/<v>   the ONE symlink an upgrade swaps (rename(2)
#                                    of a new symlink over it: atomic)
#   PREFIX/bin -> current/bin        stable entry points (containerd's
#   PREFIX/python -> current/python  BinaryName, the pyz's #! interpreter), made
#                                    once; every lookup goes through `current`
# A shim exec'd before the swap runs the old version's files from start to end;
# one exec'd after it runs the new one. The previous version is kept (a
# running shim may still read it, and it is the rollback); older ones go.
set -euo pipefail

HOST_ROOT=${HOST_ROOT:-/host}
PAYLOAD=${PAYLOAD:-/payload}
PREFIX=${PREFIX:-/opt/runc-guard}
CONTAINERD_CONFIG=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
RUNTIMES=${RUNTIMES:-}
RESTART_CONTAINERD=${RESTART_CONTAINERD:-false}
HOST_EXEC=${HOST_EXEC-nsenter -t 1 -m -u -i -n -p --}
DRY_RUN=${DRY_RUN:-false}
ONESHOT=${ONESHOT:-false}
READY_FILE=${READY_FILE:-/run/runc-guard-installer.ready}
CTL=${CTL:-runc-guardctl}
VERSION=${VERSION:-}

log() { echo "runc-guard-install: $*" >&2; }

# A version name that changes exactly when the payload does: tar of the tree in a
# fixed order with fixed owners and times, hashed.
payload_version() {
    tar -C "$PAYLOAD${PREFIX}" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . |
        sha256sum | cut -c1-16
}

# Swap symlink `link` to point at `target` with one rename(2): readers see the old
# or the new target, never nothing.
swap_link() {
    local target=$1 link=$2
    ln -sfn "$target" "$link.runc-guard-new"
    mv -fT "$link.runc-guard-new" "$link"
}

# Exchange two paths atomically (renameat2 RENAME_EXCHANGE): turns a directory of an
# older, file-by-file install into a symlink without a moment where it is missing.
exchange() {
    python3 - "$1" "$2" <<'PY'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b = (os.fsencode(p) for p in sys.argv[1:3])
if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
    sys.exit(f"renameat2 {sys.argv[1]} <-> {sys.argv[2]}: {os.strerror(ctypes.get_errno())}")
PY
}

# PREFIX/<entry> -> current/<entry> for each top-level entry of the version.
ensure_entry_links() {
    local dst=$1 version_dir=$2 entry name
    for entry in "$version_dir"/*; do
        name=${entry##*/}
        if [ -L "$dst/$name" ] && [ "$(readlink "$dst/$name")" = "current/$name" ]; then
            continue
        fi
        if [ -e "$dst/$name" ] && [ ! -L "$dst/$name" ]; then
            # an older layout's real file or directory: swap it for the link, then drop it
            ln -sfn "current/$name" "$dst/$name.runc-guard-new"
            exchange "$dst/$name.runc-guard-new" "$dst/$name"
            rm -rf --one-file-system "$dst/$name.runc-guard-new"
        else
            swap_link "current/$name" "$dst/$name"
        fi
    done
}

# Copy PAYLOAD/PREFIX into PREFIX/versions/<version> (complete before it is named),
# and anything else in the payload file by file, each replaced atomically.
copy_payload() {
    local version=$1 dst=$HOST_ROOT$PREFIX src rel out
    local version_dir=$dst/versions/$version
    if [ ! -e "$version_dir/.runc-guard-version" ]; then
        rm -rf --one-file-system "$version_dir" "$version_dir.tmp"
        mkdir -p "$version_dir.tmp"
        cp -a "$PAYLOAD$PREFIX/." "$version_dir.tmp/"
        echo "$version" > "$version_dir.tmp/.runc-guard-version"
        mv -T "$version_dir.tmp" "$version_dir"
    fi
    (cd "$PAYLOAD" && find . -mindepth 1 \( -type f -o -type l \) -print) | sort | while read -r rel; do
        case "/${rel#./}" in "$PREFIX"/*) continue ;; esac
        src=$PAYLOAD/${rel#./}
        out=$HOST_ROOT/${rel#./}
        mkdir -p "$(dirname "$out")"
        cp -a "$src" "$out.runc-guard-new"
        mv -fT "$out.runc-guard-new" "$out"
    done
}

# Make `version` the one in use: the single swap of PREFIX/current.
activate() {
    local version=$1 dst=$HOST_ROOT$PREFIX
    swap_link "versions/$version" "$dst/current"
    ensure_entry_links "$dst" "$dst/versions/$version"
}

# Keep the version in use and the one before it; remove the rest.
prune_versions() {
    local keep_current=$1 keep_previous=$2 dir name
    for dir in "$HOST_ROOT$PREFIX"/versions/*; do
        [ -e "$dir" ] || continue
        name=${dir##*/}
        if [ "$name" != "$keep_current" ] && [ "$name" != "$keep_previous" ]; then
            rm -rf --one-file-system "$dir"
        fi
    done
}

configure_args() {
    local args=(configure containerd --host-root "$HOST_ROOT" --config "$CONTAINERD_CONFIG"
                --binary "$PREFIX/bin/runc-guard")
    local r
    IFS=',' read -r -a handlers <<< "$RUNTIMES"
    for r in "${handlers[@]}"; do
        [ -n "$r" ] && args+=(--runtime "$r")
    done
    if [ "$RESTART_CONTAINERD" = "true" ]; then
        # configure picks the unit (containerd; k3s, k3s-agent, rke2-server or rke2-agent,
        # which embed containerd) and runs `systemctl restart <unit>` on the host.
        args+=(--restart)
        if [ -n "$HOST_EXEC" ]; then args+=(--restart-via "$HOST_EXEC"); fi
    fi
    printf '%s\0' "${args[@]}"
}

main() {
    mapfile -d '' -t args < <(configure_args)
    if [ "$DRY_RUN" = "true" ]; then
        "$CTL" "${args[@]}" --dry-run
        return
    fi
    local version previous
    version=${VERSION:-$(payload_version)}
    previous=$(readlink "$HOST_ROOT$PREFIX/current" 2>/dev/null || true)
    previous=${previous#versions/}
    log "copying $PAYLOAD to the host as $PREFIX/versions/$version"
    copy_payload "$version"
    activate "$version"
    # Never point containerd at a binary the host cannot run: every pod start would fail.
    log "checking that the host runs $PREFIX/bin/runc-guard"
    # shellcheck disable=SC2086
    if ! $HOST_EXEC "$PREFIX/bin/runc-guard" --version >/dev/null; then
        if [ -n "$previous" ] && [ "$previous" != "$version" ]; then
            activate "$previous"
            log "$PREFIX/bin/runc-guard ($version) does not run on this host: back to $previous;" \
                "containerd left unchanged"
        else
            log "$PREFIX/bin/runc-guard does not run on this host: containerd left unchanged"
        fi
        exit 1
    fi
    if [ "$previous" != "$version" ]; then
        prune_versions "$version" "$previous"
    fi
    "$CTL" "${args[@]}"
    touch "$READY_FILE"
    log "installed"
}

main
if [ "$ONESHOT" != "true" ] && [ "$DRY_RUN" != "true" ]; then
    # Stay up; the pod's preStop hook reverts. TERM/INT end the sleep.
    trap 'exit 0' TERM INT
    sleep infinity &
    wait
fi
