"""Real labs for both test suites and the benchmarks: runc containers, cgroups, freezer
holds, a private journald, containerd (1.6, 1.7, 2.1) and a CRI client of its own, a booted systemd.

Everything a lab starts it stops by the pid it started, and removes what it made.
"""
