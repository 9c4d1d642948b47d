"""Container images for the CRI suite, built here with no network: pause and busybox.

The CRI plugin runs only images it has in its store, and a sandbox needs a
pause image; pulling either would need the network. So the test support builds
both as OCI image layouts (``oci-layout``, ``index.json``, ``blobs/sha256/...``)
in a tar, which ``ctr -n k8s.io images import`` accepts on containerd 1.6 and
2.2 alike. ``io.containerd.image.name`` in the index names the image: the
importer uses that annotation as the full reference.

- pause: ``labkit/pause/pause.c`` compiled with ``gcc -static -Os`` (libc.a
  from libc6-dev): reaps children, exits 0 on SIGTERM/SIGINT.
- busybox: Debian's busybox-static with the applets the suite runs.

Layers are uncompressed tars with fixed mtimes, so the same inputs give the
same digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass

from labkit.kernel import BUSYBOX

HERE = os.path.dirname(os.path.abspath(__file__))
PAUSE_SOURCE = os.path.join(HERE, "pause", "pause.c")
GCC = shutil.which("gcc") or "/usr/bin/gcc"
PAUSE_IMAGE = "docker.io/runc-guard-test/pause:1"
BUSYBOX_IMAGE = "docker.io/runc-guard-test/busybox:1"
BUSYBOX_APPLETS = (
    "sh",
    "sleep",
    "cat",
    "echo",
    "true",
    "false",
    "ps",
    "ls",
    "id",
    "hostname",
    "wc",
    "head",
    "kill",
    "env",
    "printf",
)
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
#: A fixed timestamp for every tar entry and the config: reproducible digests.
EPOCH = 1_700_000_000


@dataclass(frozen=True)
class Image:
    """An image written as an OCI layout tar, ready for ``ctr images import``."""

    name: str
    tar: str


def missing_tools() -> str | None:
    """Why the images cannot be built here, or None."""
    if not os.access(GCC, os.X_OK):
        return f"building the pause image needs {GCC} (apt-get install gcc libc6-dev)"
    if not os.access(BUSYBOX, os.X_OK):
        return f"the busybox image needs {BUSYBOX} (apt-get install busybox-static)"
    return None


def build_pause(directory: str) -> str:
    """Compile the static pause binary into ``directory``; returns its path."""
    out = os.path.join(directory, "pause")
    result = subprocess.run(
        [GCC, "-static", "-Os", "-s", "-Wall", "-o", out, PAUSE_SOURCE],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"gcc -static failed (a static libc comes with libc6-dev):\n{result.stderr}")
    return out


def _info(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = EPOCH
    return info


def _layer(files: dict[str, str], symlinks: dict[str, str], dirs: list[str]) -> bytes:
    """An uncompressed layer tar: ``files`` (path in image -> host file), links, empty dirs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(set(dirs) | {os.path.dirname(p) for p in [*files, *symlinks]} - {""}):
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o755 if d != "tmp" else 0o1777))
        for path, source in sorted(files.items()):
            with open(source, "rb") as f:
                data = f.read()
            tar.addfile(_info(path, tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
        for path, target in sorted(symlinks.items()):
            tar.addfile(_info(path, tarfile.SYMTYPE, 0o777, link=target))
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return digest, len(data)


def write_oci_layout(path: str, name: str, layer: bytes, entrypoint: list[str]) -> Image:
    """One-layer linux/amd64 image ``name`` as an OCI layout tar at ``path``."""
    blobs: dict[str, bytes] = {}
    layer_digest, layer_size = _blob(blobs, layer)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2023-11-14T22:13:20Z",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "2023-11-14T22:13:20Z", "created_by": "runc-guard test support"}],
    }
    config_digest, config_size = _blob(blobs, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": layer_size}],
    }
    manifest_digest, manifest_size = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_MANIFEST,
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
    }
    for digest, data in blobs.items():
        entries["blobs/sha256/" + digest.split(":", 1)[1]] = data
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o755))
        for entry, data in entries.items():
            tar.addfile(_info(entry, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    return Image(name, path)


def pause_image(directory: str) -> Image:
    """The pause image (built from source) as an OCI layout tar in ``directory``."""
    binary = build_pause(directory)
    layer = _layer({"pause": binary}, {}, ["dev", "proc", "sys", "etc"])
    return write_oci_layout(os.path.join(directory, "pause-oci.tar"), PAUSE_IMAGE, layer, ["/pause"])


def busybox_image(directory: str) -> Image:
    """A busybox image (Debian's static busybox) as an OCI layout tar in ``directory``."""
    links = {f"bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS}
    layer = _layer({"bin/busybox": BUSYBOX}, links, ["dev", "proc", "sys", "tmp", "etc"])
    return write_oci_layout(os.path.join(directory, "busybox-oci.tar"), BUSYBOX_IMAGE, layer, ["/bin/sh"])
