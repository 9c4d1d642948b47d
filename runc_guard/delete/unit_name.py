"""A container's systemd scope unit, named and looked up without asking systemd (stdlib only).

Every delete on a node with the systemd cgroup driver needs the scope's name, and
most need no more: when the runtime's own delete stopped the unit and systemd
collected it, there is nothing for systemd to do. Loading ``systemd_scope``
(json, re, subprocess, dataclasses) and running ``systemctl show`` cost a clean
delete ~40 ms on that driver; a name check in plain string code and one
``lstat`` of systemd's transient unit file answer the common case.
"""

from __future__ import annotations

import os

#: A unit name is at most 255 bytes (UNIT_NAME_MAX); these characters (unit-name.c's VALID_CHARS).
_VALID = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789:_.\\@-")
_MAX_STEM = 249
#: systemd writes a transient unit (runc's scopes are) to this directory when the unit is
#: created, and unlinks it when the unit is freed (unit_free -> unit_remove_transient): a
#: failed scope stays loaded, and so does its file, until reset-failed.
TRANSIENT_DIR = "/run/systemd/transient"


def valid_unit_name(unit: str) -> bool:
    """A scope or slice name systemd accepts, with nothing that could climb a path."""
    stem, dot, kind = unit.rpartition(".")
    return (
        bool(dot)
        and kind in ("scope", "slice")
        and 1 <= len(stem) <= _MAX_STEM
        and _VALID.issuperset(stem)
        and ".." not in unit
    )


def scope_unit_name(name: str, scope_prefix: str) -> str | None:
    """runc's unit name for cgroup ``name`` (``getUnitName``); None for a slice or a bad name."""
    if not name or name.endswith(".slice"):
        return None
    unit = f"{scope_prefix}-{name}.scope" if scope_prefix else f"{name}.scope"
    return unit if valid_unit_name(unit) else None


def transient_unit_loaded(unit: str, directory: str | None = None) -> bool | None:
    """Is systemd holding the transient ``unit``? None when this cannot be told from its files.

    None without the directory (no systemd as PID 1, or one too old to keep
    transient units there) or on any error but ENOENT: the caller then asks
    systemd itself. A valid name is required, so the lookup stays in the directory.
    """
    if not valid_unit_name(unit):
        return None
    directory = TRANSIENT_DIR if directory is None else directory
    try:
        os.lstat(os.path.join(directory, unit))
    except FileNotFoundError:
        return False if os.path.isdir(directory) else None
    except OSError:
        return None
    return True
