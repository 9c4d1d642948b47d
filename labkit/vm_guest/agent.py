"""The VM lab's guest agent: runs the host's commands inside the guest (no network there).

Started by ``rg-agent.service`` from the image. It reads JSON lines from the
virtio-serial port named ``rg.agent`` (``{"id", "argv", "timeout", "input",
"env"}``), runs each request in its own thread and writes one JSON line back
(``{"id", "rc", "stdout", "stderr"}``; ``rc`` is None after the timeout killed
the command). The guest's python3 runs it: standard library only.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import threading
import time

PORT_NAME = "rg.agent"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def port_device() -> str:
    """The port's /dev node, found through sysfs (no udev rule needed)."""
    for _ in range(600):
        for entry in glob.glob("/sys/class/virtio-ports/*"):
            with open(os.path.join(entry, "name")) as f:
                if f.read().strip() == PORT_NAME:
                    return "/dev/" + os.path.basename(entry)
        time.sleep(0.1)
    raise SystemExit(f"no virtio port named {PORT_NAME}")


def serve(fd: int) -> None:
    lock = threading.Lock()

    def reply(body: dict[str, object]) -> None:
        data = (json.dumps(body) + "\n").encode()
        with lock:
            while data:
                try:
                    data = data[os.write(fd, data) :]
                except BlockingIOError:
                    time.sleep(0.01)

    def handle(request: dict[str, object]) -> None:
        env = {"PATH": PATH, "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
        env.update(request.get("env") or {})  # type: ignore[call-overload]
        try:
            proc = subprocess.run(
                request["argv"],  # type: ignore[arg-type]
                input=request.get("input"),  # type: ignore[arg-type]
                capture_output=True,
                text=True,
                errors="replace",
                timeout=float(request.get("timeout") or 60),  # type: ignore[arg-type]
                env=env,
                stdin=None if request.get("input") is not None else subprocess.DEVNULL,
                check=False,
            )
            body = {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
            body = {"rc": None, "stdout": out or "", "stderr": f"timed out after {exc.timeout} s"}
        except OSError as exc:
            body = {"rc": 127, "stdout": "", "stderr": str(exc)}
        reply({"id": request.get("id"), **body})

    buf = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            chunk = b""
        if not chunk:  # the host is not connected (or nothing to read): poll again
            time.sleep(0.02)
            continue
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:
                continue
            threading.Thread(target=handle, args=(request,), daemon=True).start()


if __name__ == "__main__":
    serve(os.open(port_device(), os.O_RDWR | os.O_NONBLOCK))
