"""A CRI sandbox's dead siblings: recorded by the sandbox's delete, deleted after its reply.

containerd's dead-shim cleanup deletes only the sandbox (the pod's containers
shared its shim); their runtime state and cgroups would stay. Deleting them
inside the sandbox's delete made its reply wait on their cgroups (4 s where
stock replies in 50 ms, leaving containerd's cleanup < 1 s before its SIGKILL),
so each gets an aside record of kind ``sibling`` and its own delete right after
the reply (node.finisher, started for them even with ``finish_window = 0``).
A sibling whose init is alive or cannot be judged is not recorded.

Cost on a node with hundreds of containers in the root: a state is parsed only
when its bytes name the sandbox (runc's labels, crun's config.json annotations),
so the others cost one read each.
"""

from __future__ import annotations

import os

from runc_guard.delete.aside import SIBLING, write_aside
from runc_guard.delete.state import MAX_STATE_BYTES, ContainerState, read_state
from runc_guard.errors import StateMissing, StateUnreadable
from runc_guard.procinfo import DEAD, init_liveness

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence


def dead_siblings(
    root: str, sandbox: ContainerState, mounts: Callable[[], Mapping[str, str]]
) -> list[ContainerState]:
    """The states in ``root`` of the sandbox's other containers whose init is dead."""
    needle = sandbox.container_id.encode()
    siblings = []
    for container_id in state_ids(root):
        if container_id == sandbox.container_id or not mentions(root, container_id, needle):
            continue
        try:
            state = read_state(root, container_id, mounts)
        except (StateUnreadable, StateMissing):
            continue
        dead = init_liveness(state.init_pid, state.init_start) == DEAD
        if state.sandbox_id == sandbox.container_id and dead:
            siblings.append(state)
    return siblings


def record_sibling(
    cache_dir: str, root: str, runtime: str, global_args: Sequence[str], sandbox: ContainerState,
    state: ContainerState,
) -> dict[str, object]:
    """One sibling's aside record: what its own delete needs (argv, identity), nothing judged yet."""
    args = [*global_args, "delete", "--force", state.container_id]
    written = write_aside(
        cache_dir, root, state.container_id, sorted(set(state.cgroup_paths.values())),
        f"dead sibling of sandbox {sandbox.container_id}: its own delete follows the sandbox's reply",
        SIBLING, runtime,
        {"sandbox_id": sandbox.container_id, "args": args, "init_pid": state.init_pid,
         "init_start": state.init_start, "bundle": state.labels.get("bundle", "")},
    )  # fmt: skip
    return {"id": state.container_id, "left_for": "finisher" if written else "unrecorded"}


def state_ids(root: str) -> list[str]:
    """The container ids with a directory in the runtime's root; [] when it cannot be listed."""
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []


def mentions(root: str, container_id: str, needle: bytes) -> bool:
    """Do the container's state bytes (runc's state.json, else crun's config.json) contain ``needle``?"""
    for name in ("state.json", "config.json"):
        try:
            with open(os.path.join(root, container_id, name), "rb") as f:
                return needle in f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            continue
        except OSError:
            return True  # cannot tell from the bytes: let read_state decide
    return False
