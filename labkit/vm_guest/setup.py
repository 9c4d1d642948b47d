"""Inside the VM: containerd's own default config, the systemd driver, then runc-guardctl.

The node an operator has: Debian's containerd 1.6.20 with ``containerd config
default`` and kubeadm's ``SystemdCgroup = true`` on the ``runc`` handler. The lab
adds control handlers first (``stock``: Debian's runc 1.1.5; ``stock-13`` and
``runc-13``: sid's runc 1.3; ``stock-fs`` and ``runc-fs``: runc 1.1.5 with the
cgroupfs driver), then runs the operator's step, ``runc-guardctl configure
containerd --runtime runc --runtime runc-fs --runtime runc-13 --restart``:
``runc`` and ``runc-fs`` then run runc-guard in front of runc 1.1.5, ``runc-13``
runs runc-guard's ``runc-guard-runc-13`` link in front of runc 1.3. Images come
from the share. Prints one JSON line.

runc 1.3 and containerd 2.1 are Debian sid's (``labkit.runtimes``): the disk
holds each package's unpacked tree at the host's path and names the binaries in
``/opt/rg/runtimes.json`` (``labkit.vm.RUNTIMES_MANIFEST``); a disk built
without them (Debian's archive out of reach, nothing cached) has no ``*-13``
handlers and no upgrade.

``setup.py containerd2`` then upgrades the node in place to that containerd 2.1:
stop the 1.6.20 service, write 2.1's own ``containerd config default`` (config
``version = 3``) with ``SystemdCgroup = true`` and the same control handlers to
``/etc/containerd/config-2.toml``, point ``containerd.service`` at the 2.1
binary with a drop-in (its directory first on PATH: containerd starts the
``containerd-shim-runc-v2`` it finds there), then ``runc-guardctl configure
containerd --config /etc/containerd/config-2.toml ... --restart``, and import
the images with 2.1's ``ctr`` when its CRI lacks them. Root and state stay
containerd's defaults (``/var/lib/containerd``, ``/run/containerd``), as on an
upgraded node.

The handlers reported are those of containerd's merged config (``containerd
config dump``): what its CRI runs with.
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
#: labkit.vm.RUNTIMES_MANIFEST: sid's runc 1.3 and containerd 2.1 on this disk ({} when none).
MANIFEST = "/opt/rg/runtimes.json"
DROP_IN = "/etc/systemd/system/containerd.service.d/rg-containerd-2.conf"
PAUSE_IMAGE = "docker.io/runc-guard-test/pause:1"
SHARE = "/opt/rg/share"
#: The host's per-boot data disk (labkit.vm.DATA_MOUNT): hostPath volumes of the
#: slow-teardown scenarios, throttled apart from the root disk.
DATA_DEVICE = "/dev/vdb"
DATA_MOUNT = "/var/lib/rgvm/data"



def sh(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


#: Handlers with the cgroupfs driver (``SystemdCgroup = false``, containerd's own default and
#: kubelet's ``cgroupDriver: cgroupfs``): runc itself creates and removes the container's cgroup.
CGROUPFS = ("stock-fs", "runc-fs")


def manifest() -> dict[str, dict[str, str]]:
    """The disk's runtimes beside Debian 12's: ``{"runc": {"path", "version"}, "containerd": ...}``."""
    try:
        with open(MANIFEST) as f:
            found: dict[str, dict[str, str]] = json.load(f)
    except FileNotFoundError:
        return {}
    return found


def add_handlers(handlers: Any, runc_13: str | None) -> None:
    """``SystemdCgroup = true`` on ``runc`` (kubeadm's driver), then the control handlers copied from it.

    ``stock-fs`` / ``runc-fs``: runc 1.1.5 with the cgroupfs driver, alone and (once
    configured) behind runc-guard, for what only that driver lets a delete see.
    """
    handlers["runc"]["options"]["SystemdCgroup"] = True
    controls = {"stock": "/usr/sbin/runc", **dict.fromkeys(CGROUPFS, "/usr/sbin/runc")}
    if runc_13:
        controls.update({"stock-13": runc_13, "runc-13": runc_13})
    for name, binary in controls.items():
        handler = copy.deepcopy(handlers["runc"])
        handler["options"]["BinaryName"] = binary
        handler["options"]["SystemdCgroup"] = name not in CGROUPFS
        handlers[name] = handler


def write_config(runc_13: str | None) -> None:
    doc = tomlkit.parse(sh("containerd", "config", "default").stdout)
    cri = doc["plugins"][CRI]
    cri["sandbox_image"] = PAUSE_IMAGE
    add_handlers(cri["containerd"]["runtimes"], runc_13)
    with open(CONFIG, "w") as f:
        f.write(tomlkit.dumps(doc))


def wait_containerd(ctr: str = "ctr", timeout: float = 60) -> None:
    """containerd answers after its restart (``ctr version``: its gRPC serves once every plugin loaded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sh(ctr, "version", check=False).returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit(f"containerd did not answer {ctr} version after the restart")


def cri_runtimes(containerd: str = "containerd", config: str = CONFIG) -> Any:
    """The CRI handlers of containerd's merged config (1.6's plugin layout, or 2.x's ``version = 3``)."""
    import tomllib  # plain values (tomlkit's booleans are not JSON)

    plugins = tomllib.loads(sh(containerd, "--config", config, "config", "dump").stdout)["plugins"]
    cri = plugins[CRI] if CRI in plugins and "containerd" in plugins[CRI] else plugins[CRI_RUNTIME_2]
    return cri["containerd"]["runtimes"]


def images(ctr: str = "ctr") -> list[str]:
    """The image references of containerd's ``k8s.io`` namespace (the CRI's)."""
    return sh(ctr, "-n", "k8s.io", "images", "ls", "-q").stdout.split()


def report(
    configured: subprocess.CompletedProcess[str], containerd: str = "containerd", config: str = CONFIG,
    ctr: str = "ctr", **extra: object,
) -> None:
    runtimes = cri_runtimes(containerd, config)
    with open("/etc/runc-guard/config.toml") as f:
        settings = f.read()
    print(json.dumps({
        "configure": configured.stdout.strip().splitlines(),
        "handlers": {n: {"binary": r.get("options", {}).get("BinaryName"),
                         "systemd": r.get("options", {}).get("SystemdCgroup")} for n, r in runtimes.items()},
        "images": images(ctr),
        "runc_guard_config": settings.rsplit("[runtimes]", 1)[-1].strip(),
        **extra,
    }))


def import_images(ctr: str) -> None:
    for tar in sorted(glob.glob(f"{SHARE}/images/*.tar")):
        sh(ctr, "-n", "k8s.io", "images", "import", tar, timeout=300)


def guarded(runc_13: str | None) -> list[str]:
    """The handlers ``runc-guardctl configure containerd`` fronts: ``--runtime NAME`` each."""
    names = ["runc", "runc-fs"] + (["runc-13"] if runc_13 else [])
    return [arg for name in names for arg in ("--runtime", name)]


def setup_16() -> None:
    runc_13 = manifest().get("runc", {}).get("path")
    os.makedirs(DATA_MOUNT, exist_ok=True)
    sh("mount", "-t", "ext4", DATA_DEVICE, DATA_MOUNT)
    write_config(runc_13)
    configured = sh("runc-guardctl", "configure", "containerd", *guarded(runc_13), "--restart")
    wait_containerd()
    import_images("ctr")
    report(configured, runc_13=manifest().get("runc", {}))


def setup_2() -> None:
    """Upgrade the running node to the disk's containerd 2.x in place; see the module's docstring."""
    found = manifest()
    if "containerd" not in found:
        raise SystemExit(f"no containerd 2.x on this disk ({MANIFEST})")
    containerd = found["containerd"]["path"]
    bindir = os.path.dirname(containerd)
    runc_13 = found.get("runc", {}).get("path")
    sh("systemctl", "stop", "containerd", timeout=180)
    doc = tomlkit.parse(sh(containerd, "config", "default").stdout)
    plugins = doc["plugins"]
    plugins[CRI_IMAGES_2]["pinned_images"]["sandbox"] = PAUSE_IMAGE
    add_handlers(plugins[CRI_RUNTIME_2]["containerd"]["runtimes"], runc_13)
    with open(CONFIG_2, "w") as f:
        f.write(tomlkit.dumps(doc))
    os.makedirs(os.path.dirname(DROP_IN), exist_ok=True)
    with open(DROP_IN, "w") as f:
        f.write("[Service]\n"
                f"Environment=PATH={bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
                "ExecStart=\n"
                f"ExecStart={containerd} --config {CONFIG_2}\n")
    sh("systemctl", "daemon-reload")
    configured = sh("runc-guardctl", "configure", "containerd", "--config", CONFIG_2, *guarded(runc_13),
                    "--restart", timeout=300)
    ctr = f"{bindir}/ctr"
    wait_containerd(ctr)
    # containerd 2.x reads 1.6's metadata (same root): the images are normally still
    # there; import them again only when its CRI namespace does not list both.
    if len(images(ctr)) < len(glob.glob(f"{SHARE}/images/*.tar")):
        import_images(ctr)
    version = sh(containerd, "--version").stdout.strip()
    report(configured, containerd, CONFIG_2, ctr, containerd_version=version,
           debian_version=found["containerd"]["version"])


def main() -> None:
    if sys.argv[1:2] == ["containerd2"]:
        setup_2()
    else:
        setup_16()


if __name__ == "__main__":
    main()
