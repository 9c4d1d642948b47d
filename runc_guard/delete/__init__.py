"""The interposed ``delete``: runs once per container, on containerd's critical path.

State, path rules, the cgroupfs seam, cleanup, durable records, the runtime
child and reporting (``run.run_delete`` is the entry). Never imports ``node``
or ``cli``.
"""
