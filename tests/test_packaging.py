"""The .deb, the single-file build and the DaemonSet installer, built and run for real.

The .deb is installed with apt into a Debian 12 root of its own (labkit.chroot: the
cached bookworm image under an overlay, Debian's own python3-* libraries), never into
this machine; there the tests check its files and timers, run a real Path B delete
through its /usr/bin/runc-guard in front of the root's runc, configure containerd with
Debian's tomlkit, and purge it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import tomlkit
import yaml

import runc_guard
from labkit import chroot, prereq, stall
from runc_guard.settings import Settings, load_settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGING = os.path.join(REPO, "packaging")
DEBIAN_DEPS = ("python3-psutil", "python3-tenacity", "python3-structlog", "python3-click",
               "python3-tomlkit")
HEAVY = ("click", "structlog", "psutil", "tenacity", "tomlkit", "tomllib", "re", "subprocess")
DEB_PYTHON = "/usr/bin/python3"


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", 300)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:  # the script's own words in the failure, not only its status
        output = f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        raise AssertionError(f"{argv[0]} exited {proc.returncode}:\n{output}")
    return proc


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``packaging/build-deb.sh`` output, built once for this module."""
    out = tmp_path_factory.mktemp("rgpkg-dist")
    env = dict(os.environ, PYTHON=sys.executable)
    path = run([os.path.join(PACKAGING, "build-deb.sh"), str(out)], env=env).stdout.strip()
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    assert path == os.path.join(out, f"runc-guard_{runc_guard.__version__}_{arch}.deb")
    return path


def deb_files(deb: str) -> dict[str, str]:
    """Path -> mode string of every entry in the package."""
    files = {}
    for line in run(["dpkg-deb", "-c", deb]).stdout.splitlines():
        mode, *_rest, name = line.split()
        files[name.removeprefix(".")] = mode
    return files


def imported_modules(argv: list[str], env: dict[str, str]) -> set[str]:
    """Modules a command imports, from ``-X importtime`` (stderr)."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    return {
        line.split("|")[-1].strip() for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_deb_metadata_and_dependencies(deb: str) -> None:
    """The .deb is per architecture (the launcher is compiled), versioned like the package, and
    depends on Debian's python3 libs (no libc: the launcher is static)."""
    fields = run(["dpkg-deb", "-f", deb, "Package", "Version", "Architecture", "Depends"]).stdout
    assert "Package: runc-guard" in fields
    assert f"Version: {runc_guard.__version__}" in fields
    assert f"Architecture: {run(['dpkg', '--print-architecture']).stdout.strip()}" in fields
    assert "libc6" not in fields
    depends = fields.split("Depends:", 1)[1]
    for name in ("python3 ", *DEBIAN_DEPS):
        assert name.strip() in depends


def test_deb_contents(deb: str, tmp_path: Any) -> None:
    """Launcher and Python entry, package, conffile, systemd units present at build time, and man pages."""
    files = deb_files(deb)
    for path in ("/usr/bin/runc-guard", "/usr/bin/runc-guardctl", "/usr/lib/runc-guard/runc-guard.py",
                 "/usr/lib/python3/dist-packages/runc_guard/shim/entry.py",
                 "/usr/lib/python3/dist-packages/runc_guard/cli/configure.py",
                 "/etc/runc-guard/config.toml", "/usr/share/man/man8/runc-guard.8.gz",
                 "/usr/share/man/man8/runc-guardctl.8.gz", "/usr/share/doc/runc-guard/copyright"):
        assert path in files, path
    assert files["/usr/bin/runc-guard"].startswith("-rwxr-xr-x")
    unpacked = tmp_path / "unpacked"
    run(["dpkg-deb", "-x", deb, str(unpacked)])
    assert (unpacked / "usr/bin/runc-guard").read_bytes()[:4] == b"\x7fELF"
    # Where it looks for the Python entry: its one line when it cannot exec it. Run inside the
    # unpacked tree (chroot; the launcher is static), never against this host's own install:
    # there the entry's interpreter, /usr/bin/python3, is absent, so the exec fails.
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    proc = subprocess.run([chroot, str(unpacked), "/usr/bin/runc-guard", "state", "c1"], capture_output=True,
                          text=True, env={"RUNC_GUARD_RUNTIME": "runc"}, check=False, timeout=30)
    assert proc.returncode == 78, proc.stderr
    assert "cannot exec the Python entry /usr/lib/runc-guard/runc-guard.py" in proc.stderr
    units = sorted(
        n for n in os.listdir(os.path.join(PACKAGING, "systemd"))
        if n.endswith((".service", ".timer", ".socket"))
    ) if os.path.isdir(os.path.join(PACKAGING, "systemd")) else []
    assert sorted(os.path.basename(p) for p in files if p.startswith("/lib/systemd/system/")
                  and not p.endswith("/")) == units
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in files)
    control = tmp_path / "control"
    run(["dpkg-deb", "-e", deb, str(control)])
    assert (control / "conffiles").read_text().split() == ["/etc/runc-guard/config.toml"]


def test_deb_shim_launcher_imports_only_the_shim() -> None:
    """The Python entry runs Debian's python3 isolated, without site, and imports nothing but the shim."""
    with open(os.path.join(PACKAGING, "debian", "runc-guard")) as f:
        text = f.read()
    assert text.startswith("#!/usr/bin/python3 -IS\n")
    code = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert code[:3] == ["import sys", 'sys.path.append("/usr/lib/python3/dist-packages")', "import _signal"]
    assert code[-2:] == ["from runc_guard.shim.entry import main", "sys.exit(main(_noted))"]


def test_conffile_shows_the_real_defaults(tmp_path: Any) -> None:
    """Every commented setting in the packaged config.toml is a real key with its real default."""
    with open(os.path.join(PACKAGING, "debian", "config.toml")) as f:
        lines = f.read().split("#[runtimes]", 1)[0].splitlines()
    assigned = [ln[1:] for ln in lines if re.match(r"^#[a-z_]+ = ", ln)]
    raw = tomlkit.parse("\n".join(assigned)).unwrap()
    defaults = Settings().as_dict()
    assert set(raw) == set(defaults) - {"runtimes"}
    config = os.path.join(str(tmp_path), "config.toml")
    with open(config, "w") as f:
        f.write("\n".join(assigned) + "\n")
    env = {"RUNC_GUARD_CONFIG": config, "RUNC_GUARD_CACHE_DIR": os.path.join(str(tmp_path), "cache")}
    assert load_settings(env).as_dict() == defaults


# -- pip install -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cc", "launcher"), [("gcc", True), ("/bin/false", False)], ids=["gcc", "no compiler"]
)
def test_pip_builds_the_launcher_where_a_compiler_exists(tmp_path: Any, cc: str, launcher: bool) -> None:
    """The wheel's scripts: ``runc-guard`` is the launcher (an ELF) beside ``runc-guard.py``; without a
    compiler it is the Python entry itself (pip rewrites its ``#!python`` line at install)."""
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(os.path.join(REPO, name), src / name)
    for name in ("runc_guard", "bin", "launcher"):
        shutil.copytree(os.path.join(REPO, name), src / name, ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "wheel"), str(src)],
        env={**os.environ, "CC": cc}, timeout=600)
    (wheel,) = (tmp_path / "wheel").iterdir()
    with zipfile.ZipFile(wheel) as zf:
        scripts = {n.rpartition("/")[2]: zf.read(n) for n in zf.namelist() if "/scripts/" in n}
    assert sorted(scripts) == ["runc-guard", "runc-guard.py"]
    assert scripts["runc-guard.py"].startswith(b"#!python")
    assert scripts["runc-guard"].startswith(b"\x7fELF" if launcher else b"#!python")


# -- single file ---------------------------------------------------------------------------

def _vendor_deps(target: str) -> None:
    """Copy the installed runtime dependencies (offline stand-in for pip install --target)."""
    for dist in ("click", "structlog", "tenacity", "tomlkit", "psutil"):
        files = importlib.metadata.distribution(dist).files or []
        for f in files:
            src = str(f.locate())
            if "__pycache__" in str(f) or not os.path.isfile(src) or str(f).startswith(".."):
                continue
            dst = os.path.join(target, str(f))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``build_pyz.py`` output, run by this interpreter (bytecode matches it)."""
    base = tmp_path_factory.mktemp("rgpkg-pyz")
    deps = os.path.join(base, "deps")
    _vendor_deps(deps)
    out = os.path.join(base, "runc-guard")
    run([sys.executable, os.path.join(PACKAGING, "single-file", "build_pyz.py"), REPO, deps, out,
         sys.executable])
    os.symlink("runc-guard", os.path.join(base, "runc-guardctl"))
    return out


def test_single_file_passthrough_execs_the_runtime(pyz: str, tmp_path: Any) -> None:
    """The single file execs the runtime with argv unchanged, in the same process."""
    record = tmp_path / "record"
    runtime = tmp_path / "fake-runc"
    runtime.write_text(f'#!/bin/sh\necho "$$ $*" > {record}\n')
    runtime.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "RUNC_GUARD_RUNTIME": str(runtime),
           "RUNC_GUARD_CONFIG": str(tmp_path / "none.toml"),
           "RUNC_GUARD_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([pyz, "--root", "/r", "exec", "--", "c1", "ls", "-l"], env=env)
    assert proc.wait(timeout=60) == 0
    pid, *argv = record.read_text().split()
    assert int(pid) == proc.pid
    assert argv == ["--root", "/r", "exec", "--", "c1", "ls", "-l"]


def test_single_file_hot_path_stays_small(pyz: str, tmp_path: Any) -> None:
    """A passthrough through the single file loads no heavy module and no runpy/site."""
    # Run exactly what the file's env -S shebang runs, with -X importtime added
    # (-I ignores PYTHONPROFILEIMPORTTIME).
    with open(pyz, "rb") as f:
        shebang = f.readline().decode()
    interpreter, *flags = shlex.split(shebang.split(" -S ", 1)[1])
    assert interpreter == sys.executable
    env = {"PATH": os.environ["PATH"], "RUNC_GUARD_RUNTIME": "/bin/true",
           "RUNC_GUARD_CONFIG": str(tmp_path / "none.toml"),
           "RUNC_GUARD_CACHE_DIR": str(tmp_path / "cache")}
    modules = imported_modules([interpreter, "-X", "importtime", *flags, pyz, "state", "c1"], env)
    assert "runc_guard.shim.entry" in modules
    assert not modules & {*HEAVY, "runpy", "site", "zlib"}


def test_single_file_environment_is_exact(pyz: str, tmp_path: Any) -> None:
    """The runtime gets exactly the caller's environment: no PWD/SHLVL from a shell, no LC_CTYPE."""
    dump = tmp_path / "env"
    runtime = tmp_path / "fake-runc"
    runtime.write_text(f"#!/bin/sh\ncat /proc/$$/environ > {dump}\n")
    runtime.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "RUNC_GUARD_RUNTIME": str(runtime),
           "RUNC_GUARD_CONFIG": str(tmp_path / "none.toml"), "RUNC_GUARD_CACHE_DIR": str(tmp_path / "c")}
    subprocess.run([pyz, "state", "c1"], env=env, cwd=str(tmp_path), check=True, timeout=60)
    got = dict(item.split("=", 1) for item in dump.read_text().split("\0") if item)
    assert got == env


def test_single_file_admin_tool_and_native_modules(pyz: str, tmp_path: Any) -> None:
    """Invoked as runc-guardctl it is the admin tool; psutil's .so is extracted and loads."""
    ctl = os.path.join(os.path.dirname(pyz), "runc-guardctl")
    cache = tmp_path / "pyz-cache"
    env = {"PATH": os.environ["PATH"], "RUNC_GUARD_PYZ_CACHE": str(cache)}
    assert run([ctl, "--version"], env=env).stdout.strip().endswith(runc_guard.__version__)
    config = tmp_path / "config.toml"
    config.write_text("")
    out = run([ctl, "configure", "containerd", "--config", str(config), "--binary", pyz,
               "--settings", str(tmp_path / "s.toml"), "--config-version", "2", "--dry-run"],
              env=env).stdout
    assert f'+BinaryName = "{pyz}"' in out
    (extracted,) = os.listdir(cache)
    probe = "import sys; sys.path[:0] = sys.argv[1:]; import psutil; print(psutil.__file__)"
    where = run([sys.executable, "-IS", "-c", probe, pyz, str(cache / extracted)]).stdout
    assert where.startswith(str(cache / extracted))


# -- DaemonSet installer -------------------------------------------------------------------

def _yaml_documents(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


MANIFESTS = (os.path.join(PACKAGING, "installer", "daemonset.yaml"),
             os.path.join(REPO, "contrib", "containerd-config", "runtimeclass.yaml"))


@pytest.mark.parametrize("version", ["1.25.0", kubernetes_validate.latest_version()])
@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_manifests_validate_against_kubernetes_schema(path: str, version: str) -> None:
    """Installer DaemonSet and RuntimeClass pass the strict offline schema (no unknown fields)."""
    for doc in _yaml_documents(path):
        kubernetes_validate.validate(doc, version, strict=True)


def test_daemonset_manifest_matches_image_and_scripts() -> None:
    """The manifest's hooks, env and mounts match the image recipe and the scripts."""
    docs = _yaml_documents(MANIFESTS[0])
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert kinds == {("v1", "Namespace"), ("apps/v1", "DaemonSet")}
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= (
        ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert spec["hostPID"] is True
    (container,) = spec["containers"]
    assert container["securityContext"]["privileged"] is True
    with open(os.path.join(PACKAGING, "installer", "Dockerfile")) as f:
        dockerfile = f.read()
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert f"uninstall.sh {prestop[0]}" in dockerfile
    assert 'ENTRYPOINT ["/usr/local/bin/runc-guard-install"]' in dockerfile
    for src in re.findall(r"^COPY (?!--from)(\S+)", dockerfile, re.M):
        assert os.path.exists(os.path.join(REPO, src)), src
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    assert {mounts[n]: host_paths[n] for n in mounts} == {
        "/host/etc/containerd": "/etc/containerd",
        "/host/etc/runc-guard": "/etc/runc-guard",
        "/host/opt/runc-guard": "/opt/runc-guard",
    }
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["RESTART_CONTAINERD"] == "false"
    readiness = container["readinessProbe"]["exec"]["command"]
    with open(os.path.join(PACKAGING, "installer", "install.sh")) as f:
        assert readiness[-1] in f.read()


def test_runtimeclass_names_a_handler_the_examples_define() -> None:
    """The RuntimeClass's handler exists, fronted by runc-guard, in both containerd examples."""
    (rc,) = _yaml_documents(os.path.join(REPO, "contrib", "containerd-config", "runtimeclass.yaml"))
    assert (rc["apiVersion"], rc["kind"]) == ("node.k8s.io/v1", "RuntimeClass")
    for name, plugin in (("containerd-1.6-1.7.toml", "io.containerd.grpc.v1.cri"),
                         ("containerd-2.x.toml", "io.containerd.cri.v1.runtime")):
        with open(os.path.join(REPO, "contrib", "containerd-config", name)) as f:
            doc = tomlkit.parse(f.read()).unwrap()
        handler = doc["plugins"][plugin]["containerd"]["runtimes"][rc["handler"]]
        assert handler["options"]["BinaryName"] == "/usr/bin/runc-guard"
        assert doc["timeouts"]["io.containerd.timeout.shim.cleanup"] == "5s"


def test_containerd_accepts_the_16_example() -> None:
    """containerd 1.6 parses the version-2 example and shows every runc-guard BinaryName."""
    prereq.require(shutil.which("containerd"), "containerd (make deps installs it)")
    example = os.path.join(REPO, "contrib", "containerd-config", "containerd-1.6-1.7.toml")
    dump = run(["containerd", "--config", example, "config", "dump"]).stdout
    runtimes = tomlkit.parse(dump).unwrap()["plugins"]["io.containerd.grpc.v1.cri"][
        "containerd"]["runtimes"]
    assert {k: v["options"]["BinaryName"] for k, v in runtimes.items()} == {
        "runc": "/usr/bin/runc-guard", "nvidia": "/usr/bin/runc-guard-nvidia",
        "runc-guard": "/usr/bin/runc-guard",
    }


@pytest.fixture
def fake_host(tmp_path: Any, shim_binary: str) -> dict[str, str]:
    """A host root with a containerd config, a payload to install, and recording host commands."""
    host = tmp_path / "host"
    (host / "etc/containerd").mkdir(parents=True)
    payload = tmp_path / "payload"
    (payload / "opt/runc-guard/bin").mkdir(parents=True)
    shutil.copy2(shim_binary, payload / "opt/runc-guard/bin/runc-guard")
    shutil.copy2(os.path.join(os.path.dirname(shim_binary), "runc-guard.py"), payload / "opt/runc-guard/bin")
    tools = tmp_path / "tools"
    tools.mkdir()
    restarts = tmp_path / "restarts"
    (tools / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {restarts}\n')
    # HOST_EXEC stand-in: absolute paths are the host's, so run them below the host root.
    (tools / "host-exec").write_text(
        f'#!/bin/sh\ncase "$1" in /*) p="{host}$1"; shift; exec "$p" "$@";; esac\nexec "$@"\n'
    )
    for tool in ("systemctl", "host-exec"):
        (tools / tool).chmod(0o755)
    env = {
        "PATH": f"{tools}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        "HOST_ROOT": str(host), "PAYLOAD": str(payload), "HOST_EXEC": str(tools / "host-exec"),
        "ONESHOT": "true", "READY_FILE": str(tmp_path / "ready"),
        "RUNC_GUARD_CONFIG": str(tmp_path / "none.toml"),
        "RUNC_GUARD_CACHE_DIR": str(tmp_path / "cache"),
    }
    return {"host": str(host), "restarts": str(restarts), "ready": str(tmp_path / "ready"),
            "payload": str(payload), **{f"env:{k}": v for k, v in env.items()}}


def _env(fake: dict[str, str], **extra: str) -> dict[str, str]:
    return {**{k[4:]: v for k, v in fake.items() if k.startswith("env:")}, **extra}


def test_installer_scripts_install_and_revert(fake_host: dict[str, str]) -> None:
    """install.sh copies, checks, configures and restarts; uninstall.sh restores byte for byte."""
    config = os.path.join(fake_host["host"], "etc/containerd/config.toml")
    original = b'version = 2\n# node config\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
    with open(config, "wb") as f:
        f.write(original)
    env = _env(fake_host, RESTART_CONTAINERD="true")
    run([os.path.join(PACKAGING, "installer", "install.sh")], env=env)
    assert os.access(os.path.join(fake_host["host"], "opt/runc-guard/bin/runc-guard"), os.X_OK)
    with open(config) as f:
        doc = tomlkit.parse(f.read()).unwrap()
    runc = doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
    assert runc["options"]["BinaryName"] == "/opt/runc-guard/bin/runc-guard"
    assert os.path.exists(fake_host["ready"])
    with open(fake_host["restarts"]) as f:
        assert f.read().split("\n")[:1] == ["restart containerd"]
    run([os.path.join(PACKAGING, "installer", "uninstall.sh")], env=env)
    with open(config, "rb") as f:
        assert f.read() == original
    with open(fake_host["restarts"]) as f:
        assert f.read().splitlines() == ["restart containerd", "restart containerd"]


def test_installer_restarts_the_k3s_unit_on_a_k3s_node(fake_host: dict[str, str]) -> None:
    """k3s embeds containerd: the installer restarts the k3s unit, on the host, not `containerd`."""
    directory = os.path.join(fake_host["host"], "var/lib/rancher/k3s/agent/etc/containerd")
    os.makedirs(directory)
    config = os.path.join(directory, "config.toml")
    drop_ins = "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d"
    with open(config, "w") as f:  # k3s >= v1.31.6 with containerd 2: it imports a drop-in directory
        f.write("# File generated by k3s. DO NOT EDIT. Use config-v3.toml.tmpl instead.\nversion = 3\n"
                f'imports = ["{drop_ins}/*.toml"]\n'
                "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n"
                '  runtime_type = "io.containerd.runc.v2"\n')
    units = os.path.join(fake_host["host"], "etc/systemd/system")
    os.makedirs(units)
    open(os.path.join(units, "k3s.service"), "w").close()
    env = _env(fake_host, RESTART_CONTAINERD="true", CONTAINERD_CONFIG=config[len(fake_host["host"]):])
    run([os.path.join(PACKAGING, "installer", "install.sh")], env=env)
    with open(fake_host["restarts"]) as f:
        assert f.read().splitlines() == ["restart k3s"]
    assert os.listdir(fake_host["host"] + drop_ins), "the change goes to k3s's drop-in directory"
    run([os.path.join(PACKAGING, "installer", "uninstall.sh")], env=env)
    with open(fake_host["restarts"]) as f:
        assert f.read().splitlines() == ["restart k3s", "restart k3s"]


def test_installer_leaves_containerd_alone_when_the_host_cannot_run_it(
    fake_host: dict[str, str],
) -> None:
    """A payload the host cannot execute aborts the install before containerd is touched."""
    config = os.path.join(fake_host["host"], "etc/containerd/config.toml")
    with open(config, "w") as f:
        f.write("version = 2\n")
    broken = os.path.join(fake_host["payload"], "opt/runc-guard/bin/runc-guard")
    with open(broken, "w") as f:
        f.write("#!/nonexistent/python3\n")
    proc = subprocess.run([os.path.join(PACKAGING, "installer", "install.sh")],
                          env=_env(fake_host), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode != 0
    assert "containerd left unchanged" in proc.stderr
    with open(config) as f:
        assert f.read() == "version = 2\n"
    assert not os.path.exists(fake_host["restarts"])


def _payload_note(fake: dict[str, str], note: str, runs: bool = True) -> None:
    """A payload whose version shows: a note beside the shim, and a second entry (python/)."""
    prefix = os.path.join(fake["payload"], "opt/runc-guard")
    os.makedirs(os.path.join(prefix, "python/bin"), exist_ok=True)
    with open(os.path.join(prefix, "python/bin/NOTE"), "w") as f:
        f.write(note)
    with open(os.path.join(prefix, "bin/NOTE"), "w") as f:
        f.write(note)
    if not runs:
        with open(os.path.join(prefix, "bin/runc-guard"), "w") as f:
            f.write("#!/nonexistent/python3\n")


def _live_version(host: str) -> str:
    return os.readlink(os.path.join(host, "opt/runc-guard/current"))


def test_installer_upgrade_is_one_atomic_symlink_swap(fake_host: dict[str, str]) -> None:
    """install.sh twice (an upgrade): each version in its own directory, switched by one rename of
    ``current``; while the upgrade runs, every look-up of the entry points finds one complete
    version, old or new (never none, never going back); the same payload again changes nothing;
    a payload the host cannot run rolls back to the previous version; uninstall removes it all."""
    host = fake_host["host"]
    prefix = os.path.join(host, "opt/runc-guard")
    with open(os.path.join(host, "etc/containerd/config.toml"), "w") as f:
        f.write("version = 2\n")
    env = _env(fake_host)
    installer = os.path.join(PACKAGING, "installer", "install.sh")
    _payload_note(fake_host, "one")
    run([installer], env=env)
    first = _live_version(host)
    assert first.startswith("versions/")
    assert os.readlink(os.path.join(prefix, "bin")) == "current/bin"
    assert os.readlink(os.path.join(prefix, "python")) == "current/python"
    assert os.access(os.path.join(prefix, "bin/runc-guard"), os.X_OK)

    # The upgrade, watched: bin/NOTE and python/NOTE always read one whole version.
    _payload_note(fake_host, "two")
    seen: list[str] = []
    proc = subprocess.Popen([installer], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while proc.poll() is None:
        live = os.path.join(host, "opt/runc-guard", os.readlink(os.path.join(prefix, "current")))
        with open(os.path.join(live, "bin/NOTE")) as a, open(os.path.join(live, "python/bin/NOTE")) as b:
            notes = {a.read(), b.read()}
        assert len(notes) == 1, f"a mix of versions: {notes}"
        assert os.path.exists(os.path.join(prefix, "bin/runc-guard"))
        seen.append(notes.pop())
    assert proc.wait() == 0, proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    second = _live_version(host)
    assert second != first
    assert seen and seen == sorted(seen), "went back to the old version mid-upgrade"
    with open(os.path.join(prefix, "bin/NOTE")) as f:
        assert f.read() == "two"
    assert sorted(os.listdir(os.path.join(prefix, "versions"))) == sorted(
        [os.path.basename(first), os.path.basename(second)]
    ), "the previous version is kept (running shims, rollback)"

    # The same payload again: no new version, no swap.
    run([installer], env=env)
    assert _live_version(host) == second

    # A version the host cannot run: back to the one before, containerd untouched.
    _payload_note(fake_host, "three", runs=False)
    bad = subprocess.run([installer], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode != 0 and "containerd left unchanged" in bad.stderr
    assert _live_version(host) == second
    with open(os.path.join(prefix, "bin/NOTE")) as f:
        assert f.read() == "two"

    run([os.path.join(PACKAGING, "installer", "uninstall.sh")], env=_env(fake_host, REMOVE_FILES="true"))
    assert not os.path.lexists(prefix)


def test_installer_migrates_a_file_by_file_install(fake_host: dict[str, str]) -> None:
    """An older install (bin/ a real directory) becomes the versioned layout: bin/ is exchanged
    for the link in one renameat2, so bin/runc-guard never goes missing."""
    host = fake_host["host"]
    prefix = os.path.join(host, "opt/runc-guard")
    with open(os.path.join(host, "etc/containerd/config.toml"), "w") as f:
        f.write("version = 2\n")
    os.makedirs(os.path.join(prefix, "bin"))
    shim = os.path.join(fake_host["payload"], "opt/runc-guard/bin/runc-guard")
    shutil.copy2(shim, os.path.join(prefix, "bin"))
    run([os.path.join(PACKAGING, "installer", "install.sh")], env=_env(fake_host))
    assert os.path.islink(os.path.join(prefix, "bin"))
    assert os.access(os.path.join(prefix, "bin/runc-guard"), os.X_OK)
    assert sorted(os.listdir(prefix)) == ["bin", "current", "versions"]


def test_pyz_shim_mid_upgrade_keeps_its_own_version(
    pyz: str, fake_host: dict[str, str], tmp_path: Any
) -> None:
    """A single-file shim paused between its first import and the delete path's imports while
    install.sh switches versions finishes on the version it started with: no traceback, exit 0."""
    prereq.require(os.access("/usr/bin/strace", os.X_OK), "/usr/bin/strace (make deps installs it)")
    host = fake_host["host"]
    with open(os.path.join(host, "etc/containerd/config.toml"), "w") as f:
        f.write("version = 2\n")
    payload_shim = os.path.join(fake_host["payload"], "opt/runc-guard/bin/runc-guard")
    shutil.copy2(pyz, payload_shim)
    env = _env(fake_host)
    installer = os.path.join(PACKAGING, "installer", "install.sh")
    run([installer], env=env)
    # Version two: the same code, archive offsets shifted (a longer spelling of the interpreter).
    deps = os.path.join(os.path.dirname(pyz), "deps")
    longer = os.path.join(os.path.dirname(sys.executable), "..", "bin", os.path.basename(sys.executable))
    build = os.path.join(PACKAGING, "single-file", "build_pyz.py")
    run([sys.executable, build, REPO, deps, payload_shim, longer])
    root = str(tmp_path / "state")
    os.makedirs(os.path.join(root, "c1"))
    state = os.path.join(root, "c1", "state.json")
    with open(state, "w") as f:
        f.write('{"id": "c1", "init_process_pid": 4194311, "init_process_start": 1, "cgroup_paths": {}}')
    shim_env = {
        "PATH": os.environ["PATH"], "RUNC_GUARD_RUNTIME": "/bin/true", "RUNC_GUARD_DELETE_TIMEOUT": "30",
        **{f"RUNC_GUARD_{k}": str(tmp_path / k.lower()) for k in
           ("CONFIG", "CACHE_DIR", "PENDING_DIR", "LOG_FILE", "STATS_FILE", "JOURNAL_SOCKET")},
    }
    # strace stalls the shim's stat of state.json (just before it imports the delete path) 4 s,
    # longer than an install takes on a loaded 2-core machine
    program = os.path.join(host, "opt/runc-guard/bin/runc-guard")
    argv = [stall.STRACE, "-o", "/dev/null", "-P", state, "-e", "inject=all:delay_enter=4000000:when=1",
            program, "--root", root, "delete", "--force", "c1"]  # fmt: skip
    with stall.traced(argv, env=shim_env, stderr=subprocess.PIPE) as shim:
        tracee = stall.tracee(shim.pid, program)
        assert stall.held_in_a_syscall(tracee), "the shim never reached the stalled stat"
        before = os.readlink(os.path.join(host, "opt/runc-guard/current"))
        run([installer], env=env)
        assert os.readlink(os.path.join(host, "opt/runc-guard/current")) != before
        _out, err = shim.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert shim.returncode == 0, err


# -- the installed .deb, in a Debian 12 root of its own ----------------------------------------
#
# Installed with apt into a throwaway root over the cached bookworm image (labkit.chroot),
# never into this machine: no test reads or changes the host's runc-guard package,
# /etc/runc-guard or /run/runc-guard, so these run alike where one is installed.


def _installed(root: chroot.DebianRoot, package: str) -> bool:
    proc = root.run(["dpkg-query", "-W", "-f", "${Status}", package], check=False)
    return proc.returncode == 0 and "install ok installed" in proc.stdout


def _exists(root: chroot.DebianRoot, *paths: str) -> dict[str, bool]:
    """Which of ``paths`` exist inside the root (symlinks as themselves)."""
    script = 'for p; do [ -e "$p" ] || [ -L "$p" ] && echo "$p"; done; true'
    found = root.run(["sh", "-c", script, "-", *paths])
    there = set(found.stdout.splitlines())
    return {path: path in there for path in paths}


#: Where the README and the man pages say the package puts things.
INSTALLED = ("/usr/bin/runc-guard", "/usr/bin/runc-guardctl", "/usr/lib/runc-guard/runc-guard.py",
             "/usr/lib/python3/dist-packages/runc_guard/shim/entry.py", "/etc/runc-guard/config.toml",
             "/lib/systemd/system/runc-guard-sweep.timer", "/lib/systemd/system/runc-guard-audit.timer",
             "/usr/share/man/man8/runc-guard.8.gz", "/usr/share/man/man8/runc-guardctl.8.gz")
TIMERS = ("runc-guard-sweep.timer", "runc-guard-audit.timer")
WANTS = "/etc/systemd/system/timers.target.wants"


@contextlib.contextmanager
def _root_with(deb: str, work: str, shared: tuple[str, ...] = ()) -> Iterator[chroot.DebianRoot]:
    """A Debian 12 root (labkit.chroot) with the .deb installed by apt, as an operator installs it."""
    prereq.require_none(chroot.missing())
    with chroot.debian_root(work, (os.path.dirname(deb), *shared)) as root:
        root.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", deb], timeout=600)
        yield root


@pytest.fixture(scope="module")
def installed_root(deb: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[chroot.DebianRoot]:
    """One root with the package installed, for the tests below that only use it, and a directory
    of theirs shared into it at its own path (the same absolute path inside and out)."""
    share = str(tmp_path_factory.mktemp("rgpkg-share"))
    with _root_with(deb, str(tmp_path_factory.mktemp("rgpkg-root")), (share,)) as root:
        yield root


@pytest.fixture
def share(installed_root: chroot.DebianRoot, tmp_path: Any) -> str:
    """A directory at the same path on the host and in the root (the module's shared one)."""
    path = os.path.join(installed_root.shared[-1], os.path.basename(str(tmp_path)))
    os.makedirs(path)
    return path


def test_installed_deb_enables_the_sweep_and_audit_timers(
    installed_root: chroot.DebianRoot, record_property: Callable[[str, object], None]
) -> None:
    """Without its timers /run fills with what nobody prunes or rotates, and leaks wait for nobody:
    the first install enables both (offline here: PID 1 is no systemd, so symlinks are the proof);
    every file is where the README and the man pages say."""
    root = installed_root
    built = "cached" if root.build_s is None else f"{root.build_s:.1f} s now"
    record_property("figure", f"Debian root for the .deb: debootstrap {root.recorded_build_s:.1f} s, {built}")
    assert all(_exists(root, *INSTALLED).values()), _exists(root, *INSTALLED)
    for timer in TIMERS:
        link, unit = os.path.join(WANTS, timer), f"/lib/systemd/system/{timer}"
        script = 'test -L "$1" && readlink -f "$1" "$2"'
        resolved = root.run(["sh", "-c", script, "-", link, unit], check=False)
        targets = resolved.stdout.split()
        assert len(targets) == 2 and targets[0] == targets[1], f"{timer} not enabled: {resolved}"


def test_purge_removes_what_the_package_and_its_runs_left(deb: str, tmp_path: Any) -> None:
    """``apt-get purge``: the files, the enabled timers, the conffile, the fallback log and the routing
    cache go; a removal refuses while containerd is still configured to run runc-guard."""
    with _root_with(deb, str(tmp_path / "root")) as root:
        root.run(["sh", "-c", "mkdir -p /var/log/runc-guard /var/lib/runc-guard /etc/containerd"
                              " && echo '{}' > /var/log/runc-guard/events.jsonl"
                              " && echo '{}' > /etc/containerd/config.toml.runc-guard.json"])  # fmt: skip
        refused = root.run(["apt-get", "remove", "-y", "-qq", "runc-guard"], check=False)
        assert refused.returncode != 0 and "configure containerd --revert" in refused.stderr + refused.stdout
        assert _installed(root, "runc-guard")
        root.run(["rm", "/etc/containerd/config.toml.runc-guard.json"])
        root.run(["apt-get", "remove", "--purge", "-y", "-qq", "runc-guard"])
        gone = (*INSTALLED, *(os.path.join(WANTS, t) for t in TIMERS), "/etc/runc-guard",
                "/var/log/runc-guard", "/var/lib/runc-guard", "/usr/lib/python3/dist-packages/runc_guard")
        left = _exists(root, *gone)
        assert not any(left.values()), [p for p, there in left.items() if there]
        assert not _installed(root, "runc-guard")
        for dep in DEBIAN_DEPS:  # Debian's libraries stay: other packages may use them
            assert _installed(root, dep), dep


@pytest.mark.kernel
def test_installed_deb_removes_cgroups_on_a_slow_delete(
    installed_root: chroot.DebianRoot, share: str
) -> None:
    """Through the apt-installed /usr/bin/runc-guard (in front of the root's runc 1.1.5, Debian's
    python3 and libraries) a Path B delete leaves no cgroup behind."""
    from labkit.kernel import wait_reported
    from labkit.scenario import guard_env, run_leak_scenario

    root = installed_root
    assert _installed(root, "runc-guard")
    for dep in DEBIAN_DEPS:
        assert _installed(root, dep), dep
    assert _exists(root, "/usr/lib/python3/dist-packages/runc_guard/__pycache__")[
        "/usr/lib/python3/dist-packages/runc_guard/__pycache__"]
    env = guard_env(share)
    # The hot path of the installed Python entry, under Debian's interpreter.
    entry = "/usr/lib/runc-guard/runc-guard.py"
    trace = root.run([DEB_PYTHON, "-IS", "-X", "importtime", entry, "--version"],  # as its shebang runs it
                     env=root.env({**_guard_settings(env), "RUNC_GUARD_RUNTIME": "/bin/true"}))
    modules = {line.split("|")[-1].strip() for line in trace.stderr.splitlines()
               if line.startswith("import time:") and "|" in line}  # fmt: skip
    assert "runc_guard.shim.entry" in modules
    assert not modules & set(HEAVY)
    guard = root.wrapper(os.path.join(share, "runc-guard"), "/usr/bin/runc-guard")
    result = run_leak_scenario(guard, share, 0.5, root.env(_guard_settings(env)))
    assert wait_reported(env["RUNC_GUARD_CACHE_DIR"]), "the root's reporter did not finish"
    assert result["exit_status"] == 0, result["stderr"]
    assert result["left"] == []
    with open(env["RUNC_GUARD_LOG_FILE"]) as f:  # the root's runc-guard interposed, in front of its runc
        [delete] = [e for e in map(json.loads, f) if e.get("event") == "delete"]
    assert (delete["outcome"], delete["runtime"], delete["container_id"]) == (
        "removed", "/usr/sbin/runc", result["container_id"])
    assert root.run(["/usr/bin/runc-guardctl", "--version"]).stdout.strip().endswith(runc_guard.__version__)


def _guard_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The RUNC_GUARD_* paths of ``env`` (all in the shared directory), nothing of the host's PATH."""
    return {k: v for k, v in env.items() if k.startswith("RUNC_GUARD_")}


def test_installed_deb_configures_with_debians_tomlkit(installed_root: chroot.DebianRoot, share: str) -> None:
    """/usr/bin/runc-guardctl (Debian's python3-tomlkit) configures and reverts like the venv."""
    import tomlkit as venv_tomlkit

    root = installed_root
    version = root.run([DEB_PYTHON, "-c", "import tomlkit; print(tomlkit.__version__)"]).stdout.strip()
    config = Path(share) / "config.toml"
    original = run(["containerd", "config", "default"]).stdout.encode()
    original = original.replace(
        b"      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n",
        b"      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n\n"
        b"        [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]\n"
        b"          runtime_type = \"io.containerd.runc.v2\"\n"
        b"          [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia.options]\n"
        b"            BinaryName = \"/usr/bin/nvidia-container-runtime\"\n",
    )
    config.write_bytes(original)
    # The per-handler link goes next to --binary: a copy of the installed launcher, at one path
    # both tools see (the shared directory), never a name of this host's /usr/bin.
    binary = Path(share) / "bin" / "runc-guard"
    binary.parent.mkdir()
    root.run(["cp", "/usr/bin/runc-guard", str(binary)])
    outputs = {}
    venv_ctl = os.path.join(os.path.dirname(sys.executable), "runc-guardctl")
    # Settings and cache in the shared directory: neither tool reads /etc/runc-guard or /run/runc-guard.
    own = {"RUNC_GUARD_CONFIG": os.path.join(share, "absent.toml"),
           "RUNC_GUARD_CACHE_DIR": os.path.join(share, "cache")}
    for tool in ("/usr/bin/runc-guardctl", venv_ctl):
        base = [tool, "configure", "containerd", "--config", str(config), "--binary",
                str(binary), "--settings", os.path.join(share, "settings.toml")]
        if tool == venv_ctl:
            run(base, env={**os.environ, **own})
            outputs[tool] = config.read_bytes()
            run([*base, "--revert"], env={**os.environ, **own})
        else:
            root.run(base, env=root.env(own))
            outputs[tool] = config.read_bytes()
            root.run([*base, "--revert"], env=root.env(own))
        assert config.read_bytes() == original
    assert len(set(outputs.values())) == 1, f"Debian tomlkit {version} vs {venv_tomlkit}"
    assert f'BinaryName = "{binary}-nvidia"'.encode() in outputs["/usr/bin/runc-guardctl"]
    assert not os.path.lexists(f"{binary}-nvidia")
