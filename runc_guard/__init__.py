"""runc-guard: a runc wrapper whose ``delete`` waits for and removes the container's cgroups."""

__version__ = "0.1.0"
