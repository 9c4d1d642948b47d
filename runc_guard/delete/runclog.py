"""Append runc-guard's verdict to the runtime's own ``--log`` file, in runc's format.

containerd's shim reports the last ``"level":"error"`` line of that file as the
reason a runtime call failed (go-runc's log reading), so our reason must be a
line runc itself could have written: logrus JSON (``--log-format json``) or
logrus text. runc 1.1 deletes nothing here, but containerd removes the bundle
(and the file) after a successful delete, so we only write on failure.
"""

from __future__ import annotations

import time

from runc_guard import cjson
from runc_guard.atomic import append_line


def _timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def format_line(level: str, msg: str, log_format: str) -> str:
    """One logrus-style line, as runc writes it."""
    if log_format == "json":
        return cjson.dumps({"level": level, "msg": msg, "time": _timestamp()}) + "\n"
    return f"time={cjson.dumps(_timestamp())} level={level} msg={cjson.dumps(msg)}\n"


def append(log_path: str | None, level: str, msg: str, log_format: str) -> bool:
    """Append to ``log_path``; False if there is none or it cannot be written."""
    return bool(log_path) and append_line(log_path or "", format_line(level, msg, log_format))
