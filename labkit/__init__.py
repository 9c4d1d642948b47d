"""Real labs for both test suites and the benchmarks: runc containers, cgroups, freezer
holds, a private journald, containerd (1.6 and 2.2), crictl, a booted systemd.

Everything a lab starts it stops by the pid it started, and removes what it made.
"""
