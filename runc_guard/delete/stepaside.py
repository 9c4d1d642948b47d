"""The launcher's step-aside, made whole: one line it leaves in the spool, turned into what Python writes.

In a crash storm the launcher (launcher/runc-guard.c ``step_aside``) steps a known
container's delete aside without an interpreter: it leaves only the fact, one line
in ``<cache_dir>/spool/<ns>-<pid>.aside`` (by rename, never seen half-written),
starts the detached reporter (and the finisher) once per storm, and execs the
runtime alone. The reporter turns each fact into exactly what the Python entry's
step-aside writes (``shim/entry.py _report_overloaded``): the overload aside
record and the ``startup_overloaded`` entry, which it then sends like any other.

The line, tab-separated, printable ASCII, ``\\n``-terminated::

    runc-guard-aside 1  <wall clock ns>  <container id>  <runtime root as given>
                        <cwd when the root is relative, else empty>  <runtime path>
                        <why: budget|storm|slots|cpu>  <ms spent | 0 | slots held | runnable>

A fact is read only through ``atomic.read_trusted`` (ours, writable by nobody
else) and only in this format; anything else is reported and dropped, never
turned into a record. Converting happens under the spool's lock (the reporter's
or the sweep's: ``reporter.drain_spool(take=take)``), so no fact is taken twice;
a fact is unlinked after its record and entry are written (a reporter killed in
between converts it again: at worst twice, as with the spool's entries).
Stdlib only.
"""

from __future__ import annotations

import os
import time

from runc_guard.atomic import read_trusted
from runc_guard.reporter import STEP_ASIDE_SUFFIX as SUFFIX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

HEADER = "runc-guard-aside 1"
#: The launcher's line buffer (4 x PATH_MAX).
MAX_BYTES = 16384
WHY = ("budget", "storm", "slots", "cpu")
_FIELDS = ("ns", "container_id", "root", "cwd", "runtime", "why", "count")


def pending(directory: str) -> list[str]:
    """The spool's facts, oldest first (their names start with the wall clock's ns)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in sorted(names) if n.endswith(SUFFIX) and not n.startswith(".")]


def parse(blob: bytes) -> dict[str, str] | None:
    """A fact's fields, or None when ``blob`` is not exactly one line of this format."""
    if not blob.endswith(b"\n") or blob.count(b"\n") != 1 or not blob.isascii():
        return None
    words = blob[:-1].decode("ascii").split("\t")
    if len(words) != len(_FIELDS) + 1 or words[0] != HEADER:
        return None
    fact = dict(zip(_FIELDS, words[1:], strict=True))
    if not (fact["ns"].isdigit() and fact["count"].isdigit() and fact["why"] in WHY):
        return None
    if not fact["container_id"] or not fact["root"] or not os.path.isabs(fact["runtime"]):
        return None
    if not os.path.isabs(fact["root"]) and not os.path.isabs(fact["cwd"]):
        return None
    return fact


def entry(fact: Mapping[str, str], reason: str) -> dict[str, object]:
    """The ``startup_overloaded`` entry as ``report.EventLog`` makes it, stamped at the step-aside."""
    seconds, ns = divmod(int(fact["ns"]), 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns // 1000:06d}Z"
    return {"container_id": fact["container_id"], "runtime_root": fact["root"], "reason": reason,
            "event": "startup_overloaded", "level": "warning", "timestamp": stamp}


def take(directory: str) -> int:
    """Turn every fact in the spool ``directory`` into its aside record and spool entry; how many.

    The caller holds the spool's lock. The settings (the cache directory and the
    entries' sink) are loaded only when there is a fact.
    """
    facts = pending(directory)
    if not facts:
        return 0
    from runc_guard.delete.aside import OVERLOAD, write_aside  # only with a fact: the reporter starts light
    from runc_guard.overload import overload_reason
    from runc_guard.settings import load
    from runc_guard.spool import write_spool

    settings = load(os.environ)
    sink = {"journal_socket": settings.journal_socket, "log_file": settings.log_file}
    taken = 0
    for path in facts:
        blob = read_trusted(path, MAX_BYTES + 1)
        fact = parse(blob) if blob is not None and len(blob) <= MAX_BYTES else None
        if fact is None:
            _refuse(path, settings.journal_socket)
            continue
        reason = overload_reason(fact["why"], int(fact["count"]))
        root = os.path.abspath(os.path.join(fact["cwd"], fact["root"]))
        created = {"created": round(int(fact["ns"]) / 1e9, 3)}
        runtime, container_id = fact["runtime"], fact["container_id"]
        try:  # best effort, as the Python entry's step-aside: the entry says it stepped aside
            write_aside(settings.cache_dir, root, container_id, [], reason, OVERLOAD, runtime, created)
        except OSError:
            pass
        try:
            write_spool(directory, [entry(fact, reason)], sink)
        except OSError:
            continue  # the spool is full: the fact waits for the next reporter or the sweep
        _unlink(path)
        taken += 1
    return taken


def _refuse(path: str, socket_path: str) -> None:
    """A file named like a fact that is not ours or not one: reported, dropped (never read again)."""
    from runc_guard import journal

    journal.send({"MESSAGE": f"spool_unreadable: {path}: not a step-aside of runc-guard's", "PRIORITY": 3,
                  "SYSLOG_IDENTIFIER": journal.IDENTIFIER, "EVENT": "spool_unreadable"}, socket_path)
    _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
