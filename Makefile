# runc-guard: every target installs what it needs on a fresh Debian 12 machine (as root).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# runc/containerd/crun/busybox-static: the real parts the tests drive; systemd gives
# systemd-journald and systemd-analyze; python3-venv builds the test venv;
# debootstrap + systemd-container: the booted-systemd lab of the systemd cgroup
# driver (systemd-nspawn), whose cached root is also the Debian 12 root the packaging
# tests install the .deb into (labkit/chroot.py: unshare and mount from util-linux, chroot
# from coreutils); prometheus: promtool, which checks and unit-tests the
# alert rules; strace: stalls an import and injects syscall faults (pidfd_open ENOSYS, /proc EMFILE);
# gcc + libc6-dev: the CRI suite's static pause binary; qemu-system-x86 + e2fsprogs:
# the VM lab of a pure cgroup v2 node (qemu under TCG, its disk made by mkfs.ext4 -d);
# patchelf: sid's runc and crun run here on sid's own glibc (labkit/runtimes.py).
APT_PACKAGES := runc containerd crun busybox-static python3-venv systemd util-linux procps make \
	debootstrap systemd-container prometheus strace gcc libc6-dev qemu-system-x86 e2fsprogs patchelf
SOURCES := $(shell find runc_guard bin launcher -type f -name '*' -not -name '*.pyc') pyproject.toml setup.py
STAMP := $(VENV)/.installed

.PHONY: deps venv lint typecheck unit kernel integration runtimes test demo bench clean

deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# A real (not editable) install: the shim's start-up cost is part of what we measure,
# and an editable install adds an import hook to every interpreter start. pip's
# setuptools hook (setup.py) compiles the launcher to $(VENV)/bin/runc-guard, beside
# the Python entry runc-guard.py, which runs under `python -IS` as the .deb installs
# it (bin/runc-guard.py adds the venv's packages). The suite and the benches go
# through the launcher: here a venv without one is an error, not a fallback.
$(STAMP): $(SOURCES)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip >/dev/null
	$(PY) -m pip install -q '.[test]'
	sed -i '1s|^#!\(.*/python[0-9.]*\)$$|#!\1 -IS|' $(VENV)/bin/runc-guard.py
	head -1 $(VENV)/bin/runc-guard.py | grep -q -- ' -IS$$'
	test "$$(head -c4 $(VENV)/bin/runc-guard | od -An -c | tr -d ' ')" = '177ELF'
	touch $@

venv: $(STAMP)

lint: venv
	$(VENV)/bin/ruff check runc_guard labkit tests integration bench

typecheck: venv
	$(VENV)/bin/mypy

unit: venv
	$(PY) -m pytest tests -m 'not kernel'

kernel: deps venv
	$(PY) -m pytest tests -m kernel

integration: deps venv
	$(PY) -m pytest integration

# The README's test command: lint, type check, unit, kernel and integration tests.
# Two workers (these machines have two cores); --dist loadscope keeps each module's
# containerd lab on one worker, and --no-loadscope-reorder hands modules out in
# collection order, the VM lab first (integration/conftest.py). The runtimes beyond
# Debian 12's (containerd 1.7 / 2.1, runc 1.3, crun 1.28, the CRI's api.proto) come from
# Debian's archive: `runtimes` fetches them once into /var/tmp (labkit/runtimes.py).
JOBS ?= 2
runtimes: venv
	$(PY) -m labkit.runtimes

test: deps venv lint typecheck runtimes
	$(PY) -m pytest -n $(JOBS) --dist loadscope --no-loadscope-reorder tests integration

# The README's main job: stock runc leaks cgroups on a slow teardown, runc-guard does not.
demo: deps venv
	$(PY) -m integration.demo

bench: deps venv
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) build dist *.egg-info

# dist/runc-guard_<version>_<arch>.deb for Debian 12 (dpkg-deb + gcc: the static launcher, then the
# Python package on Debian's python3-* libs).
.PHONY: deb single-file
deb: venv
	PYTHON=$(abspath $(PY)) packaging/build-deb.sh dist

# dist/runc-guard.pyz: one executable file (env -S shebang + zip with bytecode) for other distributions.
single-file: venv
	PYTHON=$(abspath $(PY)) packaging/single-file/build.sh dist
