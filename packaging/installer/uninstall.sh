#!/bin/bash
# runc-guard node uninstaller: the DaemonSet's preStop hook (also usable by hand).
#
# Reverts containerd's config byte for byte (runc-guardctl configure containerd
# --revert) and restarts containerd only when RESTART_CONTAINERD=true. The files
# under PREFIX stay by default: containers started while runc-guard was
# configured keep calling it (containerd stores BinaryName with each container)
# until they are gone, so deleting it would break their exec, kill and delete.
# REMOVE_FILES=true removes them (after the node is drained): the whole of
# PREFIX as install.sh lays it out (versions/<v>/, the `current` symlink and the
# bin/, python/ entry links), never following a symlink out of it.
#
# Environment: HOST_ROOT, PREFIX, CONTAINERD_CONFIG, RESTART_CONTAINERD,
# HOST_EXEC as for install.sh; REVERT_ON_STOP [true]: false makes this a no-op
# (e.g. for a rolling update of the DaemonSet that should not touch containerd).
set -euo pipefail

HOST_ROOT=${HOST_ROOT:-/host}
PREFIX=${PREFIX:-/opt/runc-guard}
CONTAINERD_CONFIG=${CONTAINERD_CONFIG:-/etc/containerd/config.toml}
RESTART_CONTAINERD=${RESTART_CONTAINERD:-false}
HOST_EXEC=${HOST_EXEC-nsenter -t 1 -m -u -i -n -p --}
REVERT_ON_STOP=${REVERT_ON_STOP:-true}
REMOVE_FILES=${REMOVE_FILES:-false}
CTL=${CTL:-runc-guardctl}

log() { echo "runc-guard-uninstall: $*" >&2; }

if [ "$REVERT_ON_STOP" != "true" ]; then
    log "REVERT_ON_STOP=$REVERT_ON_STOP: leaving containerd configured"
    exit 0
fi
args=(configure containerd --host-root "$HOST_ROOT" --config "$CONTAINERD_CONFIG" --revert)
if [ "$RESTART_CONTAINERD" = "true" ]; then
    # configure picks the unit (containerd, or the k3s/RKE2 unit that embeds it).
    args+=(--restart)
    if [ -n "$HOST_EXEC" ]; then args+=(--restart-via "$HOST_EXEC"); fi
fi
"$CTL" "${args[@]}"
if [ "$REMOVE_FILES" = "true" ]; then
    log "removing $PREFIX from the host"
    # `current` goes first, in one rename: a call racing the removal then finds no
    # entry point at all rather than a half-removed version; then everything else.
    dst="${HOST_ROOT:?}/${PREFIX#/}"
    if [ -L "$dst/current" ]; then
        mv -fT "$dst/current" "$dst/.current.removing"
    fi
    rm -rf --one-file-system "$dst"
fi
log "reverted"
