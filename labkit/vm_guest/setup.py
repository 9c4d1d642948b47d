"""Inside the VM: containerd's own default config, the systemd driver, then runc-guardctl.

The node an operator has: Debian's containerd 1.6.20 with ``containerd config
default`` and kubeadm's ``SystemdCgroup = true`` on the ``runc`` handler. The lab
adds control handlers first (``stock``: Debian's runc 1.1.5; ``stock-134`` and
``runc-134``: runc 1.3.4), then runs the operator's step, ``runc-guardctl
configure containerd --runtime runc --runtime runc-134 --restart``: ``runc`` then
runs runc-guard in front of runc 1.1.5, ``runc-134`` runs runc-guard's
``runc-guard-runc-134`` link in front of runc 1.3.4. Images come from the share.
Prints one JSON line.
"""

from __future__ import annotations

import copy
import glob
import json
import subprocess
import sys
import time

import tomlkit

CONFIG = "/etc/containerd/config.toml"
CRI = "io.containerd.grpc.v1.cri"
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


def write_config(with_134: bool) -> None:
    doc = tomlkit.parse(sh("containerd", "config", "default").stdout)
    cri = doc["plugins"][CRI]
    cri["sandbox_image"] = PAUSE_IMAGE
    handlers = cri["containerd"]["runtimes"]
    handlers["runc"]["options"]["SystemdCgroup"] = True  # kubeadm's systemd cgroup driver
    controls = {"stock": "/usr/sbin/runc"}
    if with_134:
        controls.update({"stock-134": RUNC_134, "runc-134": RUNC_134})
    for name, binary in controls.items():
        handler = copy.deepcopy(handlers["runc"])
        handler["options"]["BinaryName"] = binary
        handlers[name] = handler
    with open(CONFIG, "w") as f:
        f.write(tomlkit.dumps(doc))
    with open("/etc/crictl.yaml", "w") as f:
        f.write("runtime-endpoint: unix:///run/containerd/containerd.sock\n"
                "image-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 60\n")


def wait_crictl(timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sh(CRICTL, "info", check=False).returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit("containerd's CRI did not answer after the restart")


def main() -> None:
    import os

    with_134 = os.access(RUNC_134, os.X_OK)
    os.makedirs(DATA_MOUNT, exist_ok=True)
    sh("mount", "-t", "ext4", DATA_DEVICE, DATA_MOUNT)
    write_config(with_134)
    guarded = ["--runtime", "runc"] + (["--runtime", "runc-134"] if with_134 else [])
    configured = sh("runc-guardctl", "configure", "containerd", *guarded, "--restart")
    wait_crictl()
    for tar in sorted(glob.glob(f"{SHARE}/images/*.tar")):
        sh("ctr", "-n", "k8s.io", "images", "import", tar, timeout=300)
    info = json.loads(sh(CRICTL, "info").stdout)
    runtimes = info.get("config", {}).get("containerd", {}).get("runtimes", {})
    with open("/etc/runc-guard/config.toml") as f:
        settings = f.read()
    print(json.dumps({
        "configure": configured.stdout.strip().splitlines(),
        "handlers": {n: {"binary": r.get("options", {}).get("BinaryName"),
                         "systemd": r.get("options", {}).get("SystemdCgroup")} for n, r in runtimes.items()},
        "images": sh(CRICTL, "images", "-q").stdout.split(),
        "runc_guard_config": settings.rsplit("[runtimes]", 1)[-1].strip(),
    }))


if __name__ == "__main__":
    sys.exit(main())
