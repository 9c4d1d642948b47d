"""The passthrough shim containerd runs on every runtime call of every container.

Stdlib only, and nothing of ``delete``, ``node`` or ``cli`` at import time
(tests/test_layout.py): ``entry.main`` routes the call, execs the runtime, and
loads the delete path only for ``delete``.
"""
