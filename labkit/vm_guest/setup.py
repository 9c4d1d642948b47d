"""Inside the VM: containerd's own default config, the systemd driver, then runc-guardctl.

The node an operator has: Debian's containerd 1.6.20 with ``containerd config
default`` and kubeadm's ``SystemdCgroup = true`` on the ``runc`` handler. The lab
adds control handlers first (``stock``: Debian's runc 1.1.5; ``stock-134`` and
``runc-134``: runc 1.3.4; ``stock-fs`` and ``runc-fs``: runc 1.1.5 with the
cgroupfs driver), then runs the operator's step, ``runc-guardctl configure
containerd --runtime runc --runtime runc-fs --runtime runc-134 --restart``:
``runc`` and ``runc-fs`` then run runc-guard in front of runc 1.1.5,
``runc-134`` runs runc-guard's ``runc-guard-runc-134`` link in front of runc
1.3.4. Images come from the share. Prints one JSON line.

``setup.py containerd2 VERSION`` then upgrades the node in place to containerd
2.x (``/opt/rg/runtimes/containerd-2.3.4/`` or the 2.2.2 at the runtimes' top):
stop the 1.6.20 service, write 2.x's own ``containerd config default`` (config
``version = 3``) with ``SystemdCgroup = true`` and the same control handlers to
``/etc/containerd/config-2.toml``, point ``containerd.service`` at the 2.x
binary with a drop-in (its directory first on PATH: containerd starts the
``containerd-shim-runc-v2`` it finds there), then ``runc-guardctl configure
containerd --config /etc/containerd/config-2.toml ... --restart``, and import
the images with 2.x's ``ctr``. Root and state stay containerd's defaults
(``/var/lib/containerd``, ``/run/containerd``), as on an upgraded node.

crictl comes only with the shared runtimes (Debian 12 ships none). Without it
(a newcomer's clone with nothing beside it) the 1.6.20 setup still runs: it waits
for ``ctr version`` instead of ``crictl info`` and reads the handlers from
``containerd config dump``; only the CRI cells, which the host skips, need crictl.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import subprocess
import sys
import time
from typing import Any

import tomlkit

CONFIG = "/etc/containerd/config.toml"
CONFIG_2 = "/etc/containerd/config-2.toml"
CRI = "io.containerd.grpc.v1.cri"
#: containerd 2.x (config version 3): the CRI runtime plugin and the images plugin.
CRI_RUNTIME_2 = "io.containerd.cri.v1.runtime"
CRI_IMAGES_2 = "io.containerd.cri.v1.images"
RUNTIMES = "/opt/rg/runtimes"
#: containerd 2.x builds in the runtimes directory: version -> the directory of its binaries.
CONTAINERD_2 = {"2.2.2": RUNTIMES, "2.3.4": f"{RUNTIMES}/containerd-2.3.4"}
DROP_IN = "/etc/systemd/system/containerd.service.d/rg-containerd-2.conf"
PAUSE_IMAGE = "docker.io/runc-guard-test/pause:1"
RUNC_134 = "/opt/rg/runtimes/runc-1.3.4"
SHARE = "/opt/rg/share"
#: The host's per-boot data disk (labkit.vm.DATA_MOUNT): hostPath volumes of the
#: slow-teardown scenarios, throttled apart from the root disk.
DATA_DEVICE = "/dev/vdb"
DATA_MOUNT = "/var/lib/rgvm/data"


CRICTL = "/opt/rg/runtimes/crictl"


def sh(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


#: Handlers with the cgroupfs driver (``SystemdCgroup = false``, containerd's own default and
#: kubelet's ``cgroupDriver: cgroupfs``): runc itself creates and removes the container's cgroup.
CGROUPFS = ("stock-fs", "runc-fs")


def add_handlers(handlers: Any, with_134: bool) -> None:
    """``SystemdCgroup = true`` on ``runc`` (kubeadm's driver), then the control handlers copied from it.

    ``stock-fs`` / ``runc-fs``: runc 1.1.5 with the cgroupfs driver, alone and (once
    configured) behind runc-guard, for what only that driver lets a delete see.
    """
    handlers["runc"]["options"]["SystemdCgroup"] = True
    controls = {"stock": "/usr/sbin/runc", **dict.fromkeys(CGROUPFS, "/usr/sbin/runc")}
    if with_134:
        controls.update({"stock-134": RUNC_134, "runc-134": RUNC_134})
    for name, binary in controls.items():
        handler = copy.deepcopy(handlers["runc"])
        handler["options"]["BinaryName"] = binary
        handler["options"]["SystemdCgroup"] = name not in CGROUPFS
        handlers[name] = handler


def write_config(with_134: bool) -> None:
    doc = tomlkit.parse(sh("containerd", "config", "default").stdout)
    cri = doc["plugins"][CRI]
    cri["sandbox_image"] = PAUSE_IMAGE
    add_handlers(cri["containerd"]["runtimes"], with_134)
    with open(CONFIG, "w") as f:
        f.write(tomlkit.dumps(doc))
    with open("/etc/crictl.yaml", "w") as f:
        f.write("runtime-endpoint: unix:///run/containerd/containerd.sock\n"
                "image-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 60\n")


def have_crictl() -> bool:
    return os.access(CRICTL, os.X_OK)


def wait_crictl(timeout: float = 60) -> None:
    """containerd answers after its restart: its CRI (``crictl info``), or ``ctr version`` without crictl."""
    probe = [CRICTL, "info"] if have_crictl() else ["ctr", "version"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sh(*probe, check=False).returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit(f"containerd did not answer {' '.join(probe)} after the restart")


def cri_runtimes() -> Any:
    """The CRI handlers containerd runs with: what its CRI reports, else its merged config (1.6's layout)."""
    if have_crictl():
        info = json.loads(sh(CRICTL, "info").stdout)
        return info.get("config", {}).get("containerd", {}).get("runtimes", {})
    import tomllib  # plain values (tomlkit's booleans are not JSON)

    dumped = tomllib.loads(sh("containerd", "config", "dump").stdout)
    return dumped["plugins"][CRI]["containerd"]["runtimes"]


def report(configured: subprocess.CompletedProcess[str], **extra: object) -> None:
    runtimes = cri_runtimes()
    with open("/etc/runc-guard/config.toml") as f:
        settings = f.read()
    images = [CRICTL, "images", "-q"] if have_crictl() else ["ctr", "-n", "k8s.io", "images", "ls", "-q"]
    print(json.dumps({
        "configure": configured.stdout.strip().splitlines(),
        "handlers": {n: {"binary": r.get("options", {}).get("BinaryName"),
                         "systemd": r.get("options", {}).get("SystemdCgroup")} for n, r in runtimes.items()},
        "images": sh(*images).stdout.split(),
        "runc_guard_config": settings.rsplit("[runtimes]", 1)[-1].strip(),
        **extra,
    }))


def import_images(ctr: str) -> None:
    for tar in sorted(glob.glob(f"{SHARE}/images/*.tar")):
        sh(ctr, "-n", "k8s.io", "images", "import", tar, timeout=300)


def setup_16() -> None:
    with_134 = os.access(RUNC_134, os.X_OK)
    os.makedirs(DATA_MOUNT, exist_ok=True)
    sh("mount", "-t", "ext4", DATA_DEVICE, DATA_MOUNT)
    write_config(with_134)
    guarded = ["--runtime", "runc", "--runtime", "runc-fs"] + (["--runtime", "runc-134"] if with_134 else [])
    configured = sh("runc-guardctl", "configure", "containerd", *guarded, "--restart")
    wait_crictl()
    import_images("ctr")
    report(configured)


def setup_2(version: str) -> None:
    """Upgrade the running node to containerd ``version`` (2.x) in place; see the module's docstring."""
    bindir = CONTAINERD_2[version]
    containerd = f"{bindir}/containerd"
    sh("systemctl", "stop", "containerd", timeout=180)
    doc = tomlkit.parse(sh(containerd, "config", "default").stdout)
    plugins = doc["plugins"]
    plugins[CRI_IMAGES_2]["pinned_images"]["sandbox"] = PAUSE_IMAGE
    add_handlers(plugins[CRI_RUNTIME_2]["containerd"]["runtimes"], os.access(RUNC_134, os.X_OK))
    with open(CONFIG_2, "w") as f:
        f.write(tomlkit.dumps(doc))
    os.makedirs(os.path.dirname(DROP_IN), exist_ok=True)
    with open(DROP_IN, "w") as f:
        f.write("[Service]\n"
                f"Environment=PATH={bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
                "ExecStart=\n"
                f"ExecStart={containerd} --config {CONFIG_2}\n")
    sh("systemctl", "daemon-reload")
    configured = sh("runc-guardctl", "configure", "containerd", "--config", CONFIG_2,
                    "--runtime", "runc", "--runtime", "runc-fs", "--runtime", "runc-134", "--restart",
                    timeout=300)
    wait_crictl()
    # containerd 2.x reads 1.6's metadata (same root): the images are normally still
    # there; import them again only when its CRI does not list both.
    if len(sh(CRICTL, "images", "-q").stdout.split()) < len(glob.glob(f"{SHARE}/images/*.tar")):
        import_images(f"{bindir}/ctr")
    version_out = sh(CRICTL, "version").stdout
    report(configured, crictl_version=version_out.strip().splitlines(),
           containerd_version=sh(containerd, "--version").stdout.strip())


def main() -> None:
    if sys.argv[1:2] == ["containerd2"]:
        setup_2(sys.argv[2])
    else:
        setup_16()


if __name__ == "__main__":
    sys.exit(main())
