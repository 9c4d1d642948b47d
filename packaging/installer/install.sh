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

log() { echo "runc-guard-install: $*" >&2; }

# Copy the payload file by file, each replaced atomically (a new inode: shims
# already running the old file keep it; the next call gets the new one).
copy_payload() {
    local src rel dst
    (cd "$PAYLOAD" && find . -mindepth 1 \( -type f -o -type l \) -print) | sort | while read -r rel; do
        src=$PAYLOAD/${rel#./}
        dst=$HOST_ROOT/${rel#./}
        mkdir -p "$(dirname "$dst")"
        cp -a "$src" "$dst.runc-guard-new"
        mv -fT "$dst.runc-guard-new" "$dst"
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
        args+=(--restart --restart-command "${HOST_EXEC:+$HOST_EXEC }systemctl restart containerd")
    fi
    printf '%s\0' "${args[@]}"
}

main() {
    mapfile -d '' -t args < <(configure_args)
    if [ "$DRY_RUN" = "true" ]; then
        "$CTL" "${args[@]}" --dry-run
        return
    fi
    log "copying $PAYLOAD to the host"
    copy_payload
    # Never point containerd at a binary the host cannot run: every pod start would fail.
    log "checking that the host runs $PREFIX/bin/runc-guard"
    # shellcheck disable=SC2086
    if ! $HOST_EXEC "$PREFIX/bin/runc-guard" --version >/dev/null; then
        log "$PREFIX/bin/runc-guard does not run on this host: containerd left unchanged"
        exit 1
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
