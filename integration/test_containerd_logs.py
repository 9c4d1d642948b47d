"""runc-guard's canonical delete entry reaches a real journald from inside containerd's shim."""

from __future__ import annotations

import pytest

from labkit import containerd as cl
from labkit import prereq
from labkit.journald import Journald

pytestmark = pytest.mark.kernel


def test_path_b_delete_is_one_canonical_journal_entry(
    journal: Journald | None, guarded: cl.GuardedLab, ctd: cl.Containerd, ns: str
) -> None:
    """journalctl CONTAINER_ID=<id> shows the delete with its outcome and waited time."""
    prereq.require(journal, "systemd-journald and journalctl (make deps installs systemd)")
    assert journal is not None
    crash = cl.path_b_crash(ctd, ns, cl.guard_binary(), delay=1.0)
    try:
        assert crash.left == []
        # the entry is sent by the reporter the delete detached, after containerd had its status
        fallback = cl.guard_events(guarded.settings)  # waits for the reporter; journald refused -> here
        entries = journal.wait_entries(f"CONTAINER_ID={crash.task_id}", timeout=30)
        deletes = [e for e in entries if e.get("EVENT") == "delete"]
        assert len(deletes) == 1, (entries, [e for e in fallback if e.get("container_id") == crash.task_id])
        entry = deletes[0]
        assert entry["SYSLOG_IDENTIFIER"] == "runc-guard"
        assert entry["OUTCOME"] == "removed"
        assert entry["FORCE"] in ("True", "true", "1")  # containerd cleans up with --force
        assert int(entry["WAITED_MS"]) > 0
        assert entry["INIT_ALIVE"] in ("False", "false", "0")  # Path B: waited before runc ran
        assert entry["RUNTIME_ROOT"] == f"{cl.RUNC_ROOT}/{ns}"
        assert f"outcome=removed waited_ms={entry['WAITED_MS']}" in entry["MESSAGE"]
    finally:
        cl.remove_dirs(crash.left)
