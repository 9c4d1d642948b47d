"""A CRI sandbox's dead sibling, deleted after the sandbox's reply: its record read as work, its delete.

A sandbox's delete records the pod's other containers whose init is dead (aside
records of kind ``sibling``: delete.run) instead of deleting them before its
reply; the finisher (node.finisher) gives each its own delete. A record is input:
:func:`sibling_work` turns only one a sandbox's delete could have written into
work, and :class:`LateSibling` is that delete, which looks at the id's state
again before it kills or runs anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from runc_guard.delete.run import DeleteRun, Outcome
from runc_guard.delete.state import read_state
from runc_guard.errors import EXIT_UNSAFE_STATE, StateMissing, StateUnreadable
from runc_guard.invocation import parse, valid_container_id


@dataclass(frozen=True)
class SiblingWork:
    """A CRI sandbox's dead sibling as its sandbox's delete recorded it: what its own delete needs."""

    container_id: str
    runtime_root: str
    runtime: str
    sandbox_id: str
    #: The runtime call the sibling's delete interposes (the sandbox's global flags, ``delete --force``).
    args: list[str]
    init_pid: int
    init_start: int
    #: The state's bundle when the sandbox's delete recorded it ("" from an older record).
    bundle: str = ""


class LateSibling(DeleteRun):
    """A sandbox's sibling deleted after the sandbox's reply: the id can be deleted and created again
    between the finisher's look at its state and any act of its delete, so under the delete's claim
    before the first kill (the wait for the cgroups), and again before each runtime run, the id's
    state must still be the recorded container's (init pid and start time, bundle when known:
    :meth:`_same_container`). A container created under the id meanwhile is never killed nor the
    target of a ``delete --force``: ``refused``, the record stays."""

    identity: tuple[int, int] = (0, 0)
    bundle: str = ""

    def _same_container(self) -> None:
        if not os.path.lexists(os.path.join(self.invocation.root, self.container_id)):
            # Deleted meanwhile (containerd 1.6 deletes a pod's containers itself): the runtime
            # answers "does not exist" and the table removes what that delete left, as a retry would.
            return
        try:
            state = read_state(self.invocation.root, self.container_id, self.mounts)
            bundle = state.labels.get("bundle", "")
            same = (state.init_pid, state.init_start) == self.identity and (
                not self.bundle or not bundle or bundle == self.bundle
            )
        except (StateMissing, StateUnreadable):  # a directory without state: one being created
            same = False
        if not same:
            reason = ("the id's state changed while its delete waited (re-created?): nothing was killed"
                      " and the runtime was not run")  # fmt: skip
            raise Outcome("refused", EXIT_UNSAFE_STATE, reason)


def sibling_work(doc: Mapping[str, object]) -> SiblingWork | None:
    """A sibling aside record as work, or None when it is not one a sandbox's delete wrote (input)."""
    cid, root, runtime = doc.get("container_id"), doc.get("runtime_root"), doc.get("runtime")
    sandbox, args = doc.get("sandbox_id"), doc.get("args")
    pid, start, bundle = doc.get("init_pid"), doc.get("init_start"), doc.get("bundle", "")
    if not (isinstance(cid, str) and isinstance(root, str) and isinstance(runtime, str)
            and isinstance(sandbox, str) and isinstance(args, list) and isinstance(pid, int)
            and isinstance(start, int) and isinstance(bundle, str)
            and all(isinstance(a, str) for a in args)):  # fmt: skip
        return None
    if not (valid_container_id(cid) and valid_container_id(sandbox) and os.path.isabs(root)
            and os.path.isabs(runtime) and pid > 0 and start > 0):  # fmt: skip
        return None
    argv = [str(a) for a in args]
    invocation = parse(argv)
    if not (invocation.is_delete and invocation.force and invocation.container_id == cid
            and os.path.abspath(invocation.root) == os.path.normpath(root)):  # fmt: skip
        return None
    return SiblingWork(cid, root, runtime, sandbox, argv, pid, start, bundle)
