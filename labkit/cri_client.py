"""A CRI client of our own: the calls kubelet makes, over containerd's CRI socket.

The tests and benches drive a containerd's CRI plugin the way kubelet does. No
crictl is packaged for Debian and nothing built by hand may enter the project,
so this module speaks the CRI itself: gRPC stubs compiled at test time from the
``api.proto`` Debian ships (``golang-k8s-cri-api-dev``), and a minimal RFC 6455
WebSocket client for the streaming ``exec``.

It must also run inside a VM guest (Debian 12's python3 with python3-grpcio and
python3-protobuf 3.21): it imports only the standard library, ``grpc``,
``google.protobuf.json_format`` and the generated stubs, and those lazily, so
importing it never fails. Nothing from ``runc_guard`` or the rest of ``labkit``.
The file also runs on its own (``python3 cri_client.py ...``).

Stubs
-----
``generate_stubs(proto)`` compiles ``api.proto`` with grpc_tools into
``/var/tmp/runc-guard-cri-stubs/<key>/api_pb2.py`` and ``api_pb2_grpc.py`` (key:
the proto's sha256, the recipe, grpc_tools' and protobuf's versions), atomically
(two pytest-xdist workers may generate at once); nothing generated is ever
committed. The recipe drops the proto's ``[debug_redact = true]`` options, which
Debian 12's protoc (3.21) rejects and which change nothing on the wire.
``find_stubs(stubs, proto)`` picks a stubs directory: the argument, else
``$RUNC_GUARD_CRI_STUBS``, else stubs generated from ``proto`` or
``$RUNC_GUARD_CRI_PROTO``.

Python API
----------
``Cri(endpoint, stubs=None, timeout=60.0)``: ``endpoint`` is ``unix:///path``
(or a bare path). Every RPC has a deadline (``timeout`` s, or the call's
``timeout=``); ``with_timeout(s)`` is a view with another one on the same
channel. One ``Cri`` per process or run, shared by threads (gRPC channels are
thread-safe); ``close()`` it (or use ``with``) when done. Configs and filters
are dicts in the CRI's JSON form (proto or lowerCamel field names, as crictl's
JSON files); replies are dicts as ``MessageToDict`` gives them with defaults
included (lowerCamel names, enum names, int64 as strings, as crictl's ``-o json``).

- ``version()``, ``status(verbose=True)`` -> crictl's ``info`` shape
- ``run_pod(config, handler="")`` -> id; ``stop_pod(id)``; ``remove_pod(id)``;
  ``pod_status(id, verbose=True)`` -> ``{"status": ..., <info key>: ...}``
  (crictl's ``inspectp``); ``list_pods(filter=None)`` -> list
- ``create_container(pod_id, config, pod_config)`` -> id; ``start_container(id)``;
  ``stop_container(id, grace=0)`` (grace s before SIGKILL); ``remove_container(id)``;
  ``container_status(id, verbose=True)`` (crictl's ``inspect``);
  ``container_state(id)`` -> ``"CONTAINER_RUNNING"``... or None when unknown to the CRI;
  ``list_containers(filter=None)``
- ``exec_sync(id, cmd, exec_timeout=0)`` -> :class:`ExecResult` (a non-zero exit is a result, not an error);
  ``exec(id, cmd, stdin=None, stdout=None, stderr=None)`` -> :class:`ExecResult`
  (streaming: the CRI ``Exec`` URL spoken to as WebSocket ``v4.channel.k8s.io``)
- ``container_stats(id)``, ``list_container_stats(filter=None)``, ``pod_stats(id)``,
  ``list_pod_stats(filter=None)``; ``update_container_resources(id, linux)``;
  ``reopen_container_log(id)``; ``image_status(image)`` (None when absent); ``list_images()``
- ``container_logs(id, stdout, stderr)``: the CRI log file split back into its streams

Errors are :class:`CriError`: :class:`Unreachable` (no socket, connection
refused), :class:`DeadlineExceeded`, :class:`NotFound` / :class:`RpcFailed`
(the runtime's answer, with its gRPC code), :class:`BadReply` (a reply that
cannot be what the CRI sends), :class:`StreamError` (the exec stream),
:class:`StubsUnavailable`.

CLI (a crictl-compatible subset)
--------------------------------
``python -m labkit.cri_client --endpoint unix:///path [--timeout 60s] [--stubs DIR]
[--proto api.proto] VERB ...`` (the endpoint may also come from
``$CONTAINER_RUNTIME_ENDPOINT``, as crictl's); flags of a verb come before its
arguments (as crictl's). Ids go to stdout, errors to stderr with exit status 1;
``exec -s`` writes the command's stderr to stderr (crictl 1.34 printed both to stdout).

- ``version``, ``info``
- ``runp [-r|--runtime H] POD.json``; ``stopp ID...``; ``rmp [-f] ID...`` (``-f``
  stops a ready pod first); ``inspectp [-o json] ID...``; ``pods [-q] [-o json|table] [--id ID]``
- ``create POD-ID CTR.json POD.json``; ``start ID...``; ``stop [-t N] ID...``;
  ``rm [-f] ID...`` (a running container: ``-f`` stops it with timeout 0, else an
  error); ``inspect [-o json] ID...``; ``ps [-a] [-q] [-o json|table] [--id ID] [-p|--pod ID]``
- ``exec [-s] [-i] [--timeout N] ID CMD...``: ``-s`` is ExecSync; otherwise the
  WebSocket stream, stdin with ``-i``. A non-zero exit is exit status 1 and
  ``exit code N`` (streaming) / ``exited with N`` (sync) on stderr.
- ``logs ID``; ``stats [-o json] [--id ID] [ID]``; ``statsp [-o json] [--id ID]``;
  ``update [--cpu-share N] [--memory BYTES] ID...``; ``inspecti [-o json] IMAGE...``;
  ``images [-q]``

``inspect``/``inspectp``/``info`` print ``{"status": ..., <each verbose info key>:
<its value parsed as JSON>}`` as crictl does.

Sharp edge: the streaming protocol ``v4.channel.k8s.io`` (the newest that
containerd 1.6, 1.7 and 2.1's streaming server accept over WebSocket) has no
half-close: a command that waits for stdin's EOF (``cat``) never gets it, so an
``exec -i`` must end by itself (``head -n1``). Closing the socket would end its
output channels too.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

#: Environment variables naming the stubs directory, or the proto to generate them from.
STUBS_ENV = "RUNC_GUARD_CRI_STUBS"
PROTO_ENV = "RUNC_GUARD_CRI_PROTO"
#: Outside the checkout: generated code is never committed, and is shared by every clone.
STUBS_CACHE = "/var/tmp/runc-guard-cri-stubs"
DEFAULT_TIMEOUT = 60.0
#: crictl's own limit: a verbose ``info`` of a busy containerd exceeds gRPC's 4 MiB default.
MAX_MESSAGE = 16 << 20
#: What the exec stream asks for, best first (containerd's streaming server has no v5 on 1.6-2.1).
EXEC_PROTOCOLS = ("v4.channel.k8s.io", "channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR = 0, 1, 2, 3
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_OP_CONT, _OP_TEXT, _OP_BINARY, _OP_CLOSE, _OP_PING, _OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
#: A frame larger than this is not what the streaming server sends (it writes what the command wrote).
_MAX_FRAME = 64 << 20
_CHUNK = 32 << 10


# --- Errors -------------------------------------------------------------------------------


class CriError(RuntimeError):
    """Any failure of a CRI call; the message says which call and why."""


class StubsUnavailable(CriError):
    """No generated stubs, and nothing (grpc_tools, api.proto) to generate them from."""


class Unreachable(CriError):
    """Nothing answers at the endpoint: no socket, or connection refused."""


class DeadlineExceeded(CriError):
    """The call got no (complete) answer within its deadline."""


class BadReply(CriError):
    """The peer answered with something the CRI does not send."""


class StreamError(CriError):
    """The exec stream failed (upgrade refused, connection lost, a status that is no exit)."""


class RpcFailed(CriError):
    """The runtime answered the call with a gRPC error (``code`` is its name, e.g. ``UNKNOWN``)."""

    def __init__(self, method: str, code: str, details: str) -> None:
        super().__init__(f"{method}: {code}: {details}")
        self.method, self.code, self.details = method, code, details


class NotFound(RpcFailed):
    """The runtime does not know the object (gRPC NOT_FOUND)."""


# --- Stubs --------------------------------------------------------------------------------


def _version_of(distribution: str, module: str) -> str:
    """A distribution's version: pip's metadata, else the module's own (Debian's packages)."""
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(distribution)
    imported = __import__(module, fromlist=["__version__"])
    return str(getattr(imported, "__version__", "unknown"))


#: How generate_stubs edits the proto before compiling it: a new recipe gets new stubs.
_RECIPE = "r2"


def stubs_key(proto: str) -> str:
    """The cache key of ``proto``'s stubs: its sha256 and the generator's and runtime's versions.

    The generated code checks grpcio/protobuf versions when imported: a new
    grpc_tools or protobuf gets fresh stubs instead of an import error.
    """
    with open(proto, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:24]
    tools = _version_of("grpcio-tools", "grpc_tools")
    protobuf = _version_of("protobuf", "google.protobuf")
    return f"{digest}-{_RECIPE}-grpctools{tools}-protobuf{protobuf}"


def _without_debug_redact(text: str) -> str:
    """``api.proto`` without its ``[debug_redact = true]`` field options.

    protoc learnt that option in protobuf 22; Debian 12's grpc_tools (protoc 3.21)
    rejects the file with ``Option "debug_redact" unknown``. It only hides
    AuthConfig's secrets in text-format dumps: nothing on the wire, nothing we use.
    """
    text = re.sub(r"\s*\[\s*debug_redact\s*=\s*true\s*\]", "", text)
    text = re.sub(r",\s*debug_redact\s*=\s*true\b", "", text)
    return re.sub(r"\bdebug_redact\s*=\s*true\s*,\s*", "", text)


def generate_stubs(proto: str, cache_root: str = STUBS_CACHE) -> str:
    """``api_pb2.py`` and ``api_pb2_grpc.py`` of ``proto`` in the cache; their directory.

    Generated into a private temp dir and renamed into place: a concurrent
    generator (another xdist worker) either wins the rename or finds the
    finished directory, never a half-written one.
    """
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as e:
        raise StubsUnavailable(
            f"grpc_tools is not importable (pip grpcio-tools, or python3-grpc-tools): {e}"
        ) from e
    if not os.path.isfile(proto):
        raise StubsUnavailable(f"no CRI api.proto at {proto}")
    final = os.path.join(cache_root, stubs_key(proto))
    if os.path.isfile(os.path.join(final, "api_pb2_grpc.py")):
        return final
    os.makedirs(cache_root, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=".partial-", dir=cache_root)
    try:
        source = os.path.join(partial, "src")
        os.mkdir(source)
        # The generated modules are named after the file: api.proto -> api_pb2.
        with open(proto) as f:
            text = _without_debug_redact(f.read())
        with open(os.path.join(source, "api.proto"), "w") as f:
            f.write(text)
        out = os.path.join(partial, "out")
        os.mkdir(out)
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{source}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                "api.proto",
            ]
        )
        if status != 0:
            raise StubsUnavailable(f"grpc_tools.protoc exited {status} on {proto}")
        os.chmod(out, 0o755)
        try:
            os.rename(out, final)
        except OSError:
            if not os.path.isfile(os.path.join(final, "api_pb2_grpc.py")):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def find_stubs(stubs: str | None = None, proto: str | None = None) -> str:
    """The stubs directory: ``stubs``, $RUNC_GUARD_CRI_STUBS, or generated from ``proto`` / its env var."""
    stubs = stubs or os.environ.get(STUBS_ENV)
    if stubs:
        if not os.path.isfile(os.path.join(stubs, "api_pb2_grpc.py")):
            raise StubsUnavailable(f"no api_pb2_grpc.py in {stubs}")
        return stubs
    proto = proto or os.environ.get(PROTO_ENV)
    if proto:
        return generate_stubs(proto)
    raise StubsUnavailable(f"no CRI stubs: pass --stubs/--proto or set {STUBS_ENV} or {PROTO_ENV}")


@dataclass(frozen=True)
class Stubs:
    """The generated modules: messages (``pb2``) and service stubs (``pb2_grpc``)."""

    pb2: Any
    pb2_grpc: Any


_loaded: dict[str, Stubs] = {}
_load_lock = threading.Lock()


def load_stubs(directory: str) -> Stubs:
    """Import ``directory``'s api_pb2 / api_pb2_grpc (once per process, whatever the directory)."""
    directory = os.path.realpath(directory)
    with _load_lock:
        if directory in _loaded:
            return _loaded[directory]
        if _loaded:
            # Both register runtime.v1 in protobuf's default pool: a second set cannot load.
            return next(iter(_loaded.values()))
        modules = []
        try:
            for name in ("api_pb2", "api_pb2_grpc"):
                # api_pb2_grpc imports api_pb2 by that bare name: it must be in sys.modules first.
                spec = importlib.util.spec_from_file_location(name, os.path.join(directory, f"{name}.py"))
                if spec is None or spec.loader is None:
                    raise StubsUnavailable(f"cannot load {name} from {directory}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                spec.loader.exec_module(module)
                modules.append(module)
        except ImportError as e:
            raise StubsUnavailable(f"CRI stubs in {directory} do not import (grpcio/protobuf): {e}") from e
        except (RuntimeError, OSError) as e:
            raise StubsUnavailable(f"CRI stubs in {directory} do not load: {e}") from e
        stubs = Stubs(modules[0], modules[1])
        _loaded[directory] = stubs
        return stubs


# --- Messages <-> dicts ----------------------------------------------------------------------


def to_dict(message: Any) -> dict[str, Any]:
    """A reply as crictl prints it (jsonpb with EmitDefaults): lowerCamel names, defaults included."""
    from google.protobuf import json_format  # type: ignore[import-untyped]

    try:  # protobuf >= 5.26 renamed the option; 3.21 (Debian 12) knows only the old name
        return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)  # type: ignore[no-any-return]
    except TypeError:
        return json_format.MessageToDict(message, including_default_value_fields=True)  # type: ignore[call-arg,no-any-return,unused-ignore]


def from_dict(body: dict[str, Any], message: Any) -> Any:
    """``body`` (crictl's JSON config: proto or JSON names) into ``message``, unknown keys ignored."""
    from google.protobuf import json_format

    try:
        return json_format.ParseDict(body, message, ignore_unknown_fields=True)
    except json_format.ParseError as e:
        raise CriError(f"{type(message).__name__}: {e}") from e


def _parse_info(info: Any) -> dict[str, Any]:
    """A verbose reply's info map, each value parsed as JSON where it is JSON (crictl's rule)."""
    parsed: dict[str, Any] = {}
    for key in sorted(info):
        try:
            parsed[key] = json.loads(info[key])
        except ValueError:
            parsed[key] = info[key]
    return parsed


# --- The exec stream: a minimal RFC 6455 client ------------------------------------------


def _mask(data: bytes, key: bytes) -> bytes:
    """RFC 6455 §5.3 masking, as one big-integer XOR (a byte loop is ~50x slower)."""
    n = len(data)
    if not n:
        return data
    pad = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(pad, "big")).to_bytes(n, "big")


def _remaining(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(f"{what}: deadline exceeded")
    return left


class WebSocket:
    """A client WebSocket over one TCP (or TLS) connection: handshake, masked frames out, frames in."""

    def __init__(self, sock: socket.socket, buffered: bytes, protocol: str) -> None:
        self.sock, self._buf, self.protocol = sock, buffered, protocol
        self._send_lock = threading.Lock()
        self.closed = False

    @classmethod
    def connect(cls, url: str, protocols: Sequence[str], deadline: float) -> WebSocket:
        """Open ``url`` (http/https/ws/wss) and upgrade it, asking for ``protocols``."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            raise BadReply(f"exec stream: not an http URL: {url!r}")
        secure = parts.scheme in ("https", "wss")
        port = parts.port or (443 if secure else 80)
        where = f"{parts.scheme}://{parts.netloc}"
        try:
            sock = socket.create_connection((parts.hostname, port), timeout=_remaining(deadline, where))
        except OSError as e:
            raise StreamError(f"exec stream: cannot connect to {where}: {e}") from e
        try:
            if secure:
                import ssl

                # containerd's streaming certificate is self-signed; crictl without --tls-ca skips the check.
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(sock, server_hostname=parts.hostname)
            key = base64.b64encode(os.urandom(16)).decode()
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            request = (
                f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {', '.join(protocols)}\r\n\r\n"
            )
            sock.sendall(request.encode())
            head, rest = cls._read_head(sock, deadline, where)
            status_line, headers = cls._parse_head(head)
            if status_line.split(" ")[1:2] != ["101"]:
                body = rest[:300].decode(errors="replace").strip()
                raise StreamError(f"exec stream: {where} refused the upgrade: {status_line} {body}".strip())
            accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
            if headers.get("sec-websocket-accept") != accept:
                raise BadReply(f"exec stream: {where} answered a wrong Sec-WebSocket-Accept")
            protocol = headers.get("sec-websocket-protocol", "")
            if protocol and protocol not in protocols:
                raise BadReply(
                    f"exec stream: {where} chose protocol {protocol!r}, not one of {list(protocols)}"
                )
        except BaseException:
            sock.close()
            raise
        return cls(sock, rest, protocol)

    @staticmethod
    def _read_head(sock: socket.socket, deadline: float, where: str) -> tuple[bytes, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            if len(data) > 64 << 10:
                raise BadReply(f"exec stream: {where} sent no end of its HTTP head in 64 KiB")
            sock.settimeout(_remaining(deadline, f"exec stream: {where} upgrade"))
            try:
                chunk = sock.recv(4096)
            except TimeoutError as e:
                raise DeadlineExceeded(f"exec stream: {where} did not answer the upgrade") from e
            except OSError as e:
                raise StreamError(f"exec stream: {where}: {e}") from e
            if not chunk:
                raise StreamError(f"exec stream: {where} closed the connection during the upgrade")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        return head, rest

    @staticmethod
    def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return lines[0], headers

    def send(self, payload: bytes, opcode: int = _OP_BINARY) -> None:
        """One masked frame (clients must mask, RFC 6455 §5.1)."""
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        key = os.urandom(4)
        with self._send_lock:
            self.sock.sendall(header + key + _mask(payload, key))

    def _read(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            self.sock.settimeout(_remaining(deadline, "exec stream"))
            try:
                chunk = self.sock.recv(max(65536, n - len(self._buf)))
            except TimeoutError as e:
                raise DeadlineExceeded("exec stream: no end within the deadline") from e
            if not chunk:
                raise EOFError
            self._buf += chunk
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def receive(self, deadline: float) -> tuple[int, bytes] | None:
        """The next whole data message (opcode, payload); None once the peer closed."""
        opcode, parts = None, []
        try:
            while True:
                b0, b1 = self._read(2, deadline)
                length = b1 & 0x7F
                if length == 126:
                    (length,) = struct.unpack("!H", self._read(2, deadline))
                elif length == 127:
                    (length,) = struct.unpack("!Q", self._read(8, deadline))
                if length > _MAX_FRAME:
                    raise BadReply(f"exec stream: a frame of {length} bytes")
                key = self._read(4, deadline) if b1 & 0x80 else b""
                payload = self._read(length, deadline)
                if key:
                    payload = _mask(payload, key)
                op = b0 & 0x0F
                if op == _OP_CLOSE:
                    self.close(payload[:2])
                    return None
                if op == _OP_PING:
                    self.send(payload, _OP_PONG)
                    continue
                if op == _OP_PONG:
                    continue
                if op in (_OP_TEXT, _OP_BINARY):
                    opcode, parts = op, [payload]
                elif op == _OP_CONT and opcode is not None:
                    parts.append(payload)
                else:
                    raise BadReply(f"exec stream: unexpected frame opcode {op:#x}")
                if b0 & 0x80:
                    return opcode, b"".join(parts)
        except EOFError:
            return None
        except OSError as e:
            raise StreamError(f"exec stream: {e}") from e

    def close(self, code: bytes = b"\x03\xe8") -> None:
        """Answer/send a close frame (best effort) and close the connection."""
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            self.send(code, _OP_CLOSE)
        self.sock.close()


def exit_code_of(protocol: str, status: bytes) -> int:
    """The command's exit code from the error channel (v4: a metav1.Status as JSON; v1: plain text)."""
    text = status.decode(errors="replace").strip()
    if protocol.startswith("v4."):
        if not text:
            raise StreamError("exec stream ended without a status (the connection was lost)")
        try:
            body = json.loads(text)
        except ValueError as e:
            raise BadReply(f"exec stream: status is not JSON: {text[:300]!r}") from e
        if body.get("status") == "Success":
            return 0
        if body.get("reason") == "NonZeroExitCode":
            for cause in (body.get("details") or {}).get("causes") or []:
                if cause.get("reason") == "ExitCode":
                    try:
                        return int(cause.get("message"))
                    except (TypeError, ValueError):
                        break
        raise StreamError(f"exec stream: {body.get('message') or text[:300]}")
    if not text:
        return 0
    found = re.search(r"exit code (\d+)", text)
    if found:
        return int(found.group(1))
    raise StreamError(f"exec stream: {text[:300]}")


def stream_exec(
    url: str,
    stdin: bytes | IO[bytes] | None,
    stdout: IO[bytes],
    stderr: IO[bytes],
    deadline: float,
) -> int:
    """Run the exec behind ``url`` (from the CRI's Exec) to its end; the command's exit code.

    stdin is written from a thread (a command may fill stdout before it reads
    all of its input); it cannot be closed (see the module docstring).
    """
    ws = WebSocket.connect(url, EXEC_PROTOCOLS, deadline)
    writer: threading.Thread | None = None
    if stdin is not None:
        writer = threading.Thread(target=_feed, args=(ws, stdin), daemon=True)
        writer.start()
    status = bytearray()
    try:
        while True:
            message = ws.receive(deadline)
            if message is None:
                break
            opcode, data = message
            if not data:
                continue
            channel, body = data[0], data[1:]
            if opcode == _OP_TEXT:  # the base64 protocols: '0'+channel, then base64
                channel -= ord("0")
                body = base64.b64decode(body)
            if channel == STDOUT:
                stdout.write(body)
                stdout.flush()
            elif channel == STDERR:
                stderr.write(body)
                stderr.flush()
            elif channel == ERROR:
                status += body
    finally:
        ws.close()
    return exit_code_of(ws.protocol, bytes(status))


def _feed(ws: WebSocket, stdin: bytes | IO[bytes]) -> None:
    """Send stdin on channel 0 in chunks until it ends (then nothing: v4 has no half-close)."""
    try:
        if isinstance(stdin, bytes | bytearray):
            for i in range(0, len(stdin), _CHUNK):
                ws.send(bytes([STDIN]) + stdin[i : i + _CHUNK])
            return
        read = getattr(stdin, "read1", stdin.read)
        while True:
            chunk = read(_CHUNK)
            if not chunk:
                return
            ws.send(bytes([STDIN]) + chunk)
    except (OSError, ValueError):
        return  # the stream ended first: the reader reports how


def split_cri_log(lines: Iterable[bytes], stdout: IO[bytes], stderr: IO[bytes]) -> None:
    """CRI log lines (``<RFC 3339 time> <stdout|stderr> <P|F>[:tags] <content>``) back to two streams.

    ``F`` ends a line, ``P`` is a part of one the runtime split (kubelet's log format).
    """
    for line in lines:
        fields = line.rstrip(b"\n").split(b" ", 3)
        if len(fields) < 3:
            continue
        content = fields[3] if len(fields) == 4 else b""
        partial = b"P" in fields[2].split(b":")
        sink = stderr if fields[1] == b"stderr" else stdout
        sink.write(content if partial else content + b"\n")


# --- The client -------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecResult:
    """What an exec gave: the command's exit code and what it wrote (empty when streamed elsewhere)."""

    exit_code: int
    stdout: bytes
    stderr: bytes


def _socket_path(endpoint: str) -> str | None:
    if endpoint.startswith("unix://"):
        return endpoint[len("unix://") :]
    if endpoint.startswith("/"):
        return endpoint
    return None


class Cri:
    """A CRI client over ``endpoint`` with a deadline on every call (see the module docstring)."""

    def __init__(
        self,
        endpoint: str,
        stubs: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        proto: str | None = None,
        _shared: tuple[Any, Stubs, Any, Any] | None = None,
    ) -> None:
        self.endpoint, self.timeout = endpoint, timeout
        if _shared is not None:
            self._channel, self.stubs, self._runtime, self._images = _shared
            return
        try:
            import grpc  # type: ignore[import-untyped]
        except ImportError as e:
            raise StubsUnavailable(f"grpc is not importable (pip grpcio, or python3-grpcio): {e}") from e
        self.stubs = load_stubs(find_stubs(stubs, proto))
        path = _socket_path(endpoint)
        target = f"unix://{path}" if path is not None else endpoint
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
            ],
        )
        self._runtime = self.stubs.pb2_grpc.RuntimeServiceStub(self._channel)
        self._images = self.stubs.pb2_grpc.ImageServiceStub(self._channel)

    def with_timeout(self, timeout: float) -> Cri:
        """This client with another per-call deadline, on the same channel."""
        return Cri(
            self.endpoint, timeout=timeout, _shared=(self._channel, self.stubs, self._runtime, self._images)
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Cri:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one call ----------------------------------------------------------------------

    def _call(
        self, service: Any, method: str, request: Any, extra: float = 0.0, timeout: float | None = None
    ) -> Any:
        """``method`` with a deadline; every failure becomes a CriError that names the call."""
        import grpc

        path = _socket_path(self.endpoint)
        if path is not None and not os.path.exists(path):
            raise Unreachable(f"{method}: no CRI socket at {path} (is containerd running?)")
        deadline = (self.timeout if timeout is None else timeout) + extra
        try:
            return getattr(service, method)(request, timeout=deadline)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = (e.details() if hasattr(e, "details") else None) or str(e)
            name = code.name if code is not None else "UNKNOWN"
            if code == grpc.StatusCode.UNAVAILABLE:
                raise Unreachable(f"{method}: the CRI at {self.endpoint} is unreachable: {details}") from e
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise DeadlineExceeded(
                    f"{method}: no reply from {self.endpoint} within {deadline:g} s"
                ) from e
            if code == grpc.StatusCode.NOT_FOUND:
                raise NotFound(method, name, details) from e
            if code == grpc.StatusCode.INTERNAL and "deserializ" in details.lower():
                raise BadReply(
                    f"{method}: the reply from {self.endpoint} is no CRI message: {details}"
                ) from e
            raise RpcFailed(method, name, details) from e

    def _rt(self, method: str, deadline: float | None = None, extra: float = 0.0, **fields: Any) -> Any:
        """RuntimeService ``method`` with ``<method>Request(**fields)``; ``deadline`` overrides timeout."""
        request = getattr(self.stubs.pb2, f"{method}Request")(**fields)
        return self._call(self._runtime, method, request, extra, deadline)

    def _msg(self, name: str, body: dict[str, Any] | None) -> Any:
        return from_dict(body or {}, getattr(self.stubs.pb2, name)())

    @staticmethod
    def _need(reply: Any, field: str, method: str) -> Any:
        value = getattr(reply, field)
        if not value:
            raise BadReply(f"{method}: the reply has no {field}")
        return value

    # -- runtime ---------------------------------------------------------------------

    def version(self, timeout: float | None = None) -> dict[str, Any]:
        return to_dict(self._rt("Version", timeout, version="v1"))

    def status(self, verbose: bool = True, timeout: float | None = None) -> dict[str, Any]:
        """The runtime's status as crictl's ``info`` prints it: ``status`` plus each info key."""
        reply = self._rt("Status", timeout, verbose=verbose)
        return {"status": to_dict(reply.status), **_parse_info(reply.info)}

    def run_pod(self, config: dict[str, Any], handler: str = "", timeout: float | None = None) -> str:
        reply = self._rt(
            "RunPodSandbox", timeout, config=self._msg("PodSandboxConfig", config), runtime_handler=handler
        )
        return str(self._need(reply, "pod_sandbox_id", "RunPodSandbox"))

    def stop_pod(self, pod_id: str, timeout: float | None = None) -> None:
        self._rt("StopPodSandbox", timeout, pod_sandbox_id=pod_id)

    def remove_pod(self, pod_id: str, timeout: float | None = None) -> None:
        self._rt("RemovePodSandbox", timeout, pod_sandbox_id=pod_id)

    def pod_status(self, pod_id: str, verbose: bool = True, timeout: float | None = None) -> dict[str, Any]:
        """crictl's ``inspectp``: ``{"status": ..., "info": ...}``."""
        reply = self._rt("PodSandboxStatus", timeout, pod_sandbox_id=pod_id, verbose=verbose)
        if not reply.HasField("status"):
            raise BadReply("PodSandboxStatus: the reply has no status")
        return {"status": to_dict(reply.status), **_parse_info(reply.info)}

    def list_pods(
        self, filter: dict[str, Any] | None = None, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        reply = self._rt("ListPodSandbox", timeout, filter=self._msg("PodSandboxFilter", filter))
        return to_dict(reply).get("items", [])  # type: ignore[no-any-return]

    def create_container(
        self, pod_id: str, config: dict[str, Any], pod_config: dict[str, Any], timeout: float | None = None
    ) -> str:
        reply = self._rt(
            "CreateContainer",
            timeout,
            pod_sandbox_id=pod_id,
            config=self._msg("ContainerConfig", config),
            sandbox_config=self._msg("PodSandboxConfig", pod_config),
        )
        return str(self._need(reply, "container_id", "CreateContainer"))

    def start_container(self, container_id: str, timeout: float | None = None) -> None:
        self._rt("StartContainer", timeout, container_id=container_id)

    def stop_container(self, container_id: str, grace: int = 0, timeout: float | None = None) -> None:
        """StopContainer with ``grace`` s before SIGKILL; the deadline allows for the grace."""
        self._rt("StopContainer", timeout, extra=float(grace), container_id=container_id, timeout=grace)

    def remove_container(self, container_id: str, timeout: float | None = None) -> None:
        self._rt("RemoveContainer", timeout, container_id=container_id)

    def container_status(
        self, container_id: str, verbose: bool = True, timeout: float | None = None
    ) -> dict[str, Any]:
        """crictl's ``inspect``: ``{"status": ..., "info": ...}`` (``info.pid`` is the init's pid)."""
        reply = self._rt("ContainerStatus", timeout, container_id=container_id, verbose=verbose)
        if not reply.HasField("status"):
            raise BadReply("ContainerStatus: the reply has no status")
        return {"status": to_dict(reply.status), **_parse_info(reply.info)}

    def container_state(self, container_id: str, timeout: float | None = None) -> str | None:
        """CONTAINER_RUNNING / CONTAINER_EXITED / ..., None when the CRI no longer knows it."""
        try:
            reply = self._rt("ContainerStatus", timeout, container_id=container_id, verbose=False)
        except NotFound:
            return None
        return str(self.stubs.pb2.ContainerState.Name(reply.status.state))

    def list_containers(
        self, filter: dict[str, Any] | None = None, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        reply = self._rt("ListContainers", timeout, filter=self._msg("ContainerFilter", filter))
        return to_dict(reply).get("containers", [])  # type: ignore[no-any-return]

    def exec_sync(
        self, container_id: str, cmd: Sequence[str], exec_timeout: int = 0, timeout: float | None = None
    ) -> ExecResult:
        """ExecSync; ``exec_timeout`` s is the runtime's limit (0: none), the deadline allows for it."""
        reply = self._rt(
            "ExecSync",
            timeout,
            extra=float(exec_timeout),
            container_id=container_id,
            cmd=list(cmd),
            timeout=exec_timeout,
        )
        return ExecResult(reply.exit_code, reply.stdout, reply.stderr)

    def exec_url(
        self, container_id: str, cmd: Sequence[str], stdin: bool, timeout: float | None = None
    ) -> str:
        reply = self._rt(
            "Exec",
            timeout,
            container_id=container_id,
            cmd=list(cmd),
            stdin=stdin,
            stdout=True,
            stderr=True,
            tty=False,
        )
        return str(self._need(reply, "url", "Exec"))

    def exec(
        self,
        container_id: str,
        cmd: Sequence[str],
        stdin: bytes | IO[bytes] | None = None,
        stdout: IO[bytes] | None = None,
        stderr: IO[bytes] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """A streaming exec (the CRI's Exec, then WebSocket): the command's exit code and output.

        Output goes to ``stdout``/``stderr`` as it comes when given (then the
        result's are empty). The whole exec has the call's deadline.
        """
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        url = self.exec_url(container_id, cmd, stdin is not None, timeout)
        out, err = io.BytesIO(), io.BytesIO()
        code = stream_exec(url, stdin, stdout or out, stderr or err, deadline)
        return ExecResult(code, out.getvalue(), err.getvalue())

    def container_stats(self, container_id: str, timeout: float | None = None) -> dict[str, Any]:
        return to_dict(self._rt("ContainerStats", timeout, container_id=container_id).stats)

    def list_container_stats(
        self, filter: dict[str, Any] | None = None, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        reply = self._rt("ListContainerStats", timeout, filter=self._msg("ContainerStatsFilter", filter))
        return to_dict(reply).get("stats", [])  # type: ignore[no-any-return]

    def pod_stats(self, pod_id: str, timeout: float | None = None) -> dict[str, Any]:
        return to_dict(self._rt("PodSandboxStats", timeout, pod_sandbox_id=pod_id).stats)

    def list_pod_stats(
        self, filter: dict[str, Any] | None = None, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        reply = self._rt("ListPodSandboxStats", timeout, filter=self._msg("PodSandboxStatsFilter", filter))
        return to_dict(reply).get("stats", [])  # type: ignore[no-any-return]

    def update_container_resources(
        self, container_id: str, linux: dict[str, Any], timeout: float | None = None
    ) -> None:
        self._rt(
            "UpdateContainerResources",
            timeout,
            container_id=container_id,
            linux=self._msg("LinuxContainerResources", linux),
        )

    def reopen_container_log(self, container_id: str, timeout: float | None = None) -> None:
        self._rt("ReopenContainerLog", timeout, container_id=container_id)

    def container_logs(self, container_id: str, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        """The container's CRI log file (``<time> <stream> <P|F> <line>``) written back to its two streams."""
        path = self.container_status(container_id, verbose=False)["status"].get("logPath", "")
        if not path:
            raise CriError(f"container {container_id} has no log path")
        try:
            with open(path, "rb") as f:
                split_cri_log(f, stdout, stderr)
        except OSError as e:
            raise CriError(f"logs of {container_id}: {e}") from e

    # -- images ----------------------------------------------------------------------

    def image_status(self, image: str, timeout: float | None = None) -> dict[str, Any] | None:
        """crictl's ``inspecti``: ``{"status": ..., "info": ...}``; None when the runtime lacks it."""
        request = self.stubs.pb2.ImageStatusRequest(image=self.stubs.pb2.ImageSpec(image=image), verbose=True)
        reply = self._call(self._images, "ImageStatus", request, timeout=timeout)
        if not reply.HasField("image"):
            return None
        return {"status": to_dict(reply.image), **_parse_info(reply.info)}

    def list_images(self, timeout: float | None = None) -> list[dict[str, Any]]:
        reply = self._call(self._images, "ListImages", self.stubs.pb2.ListImagesRequest(), timeout=timeout)
        return to_dict(reply).get("images", [])  # type: ignore[no-any-return]


# --- CLI: a crictl-compatible subset -------------------------------------------------------


class UsageError(CriError):
    """A command line this CLI does not take."""


@dataclass(frozen=True)
class Verb:
    """A verb: its flags (alias -> (name, takes a value)), argument count, and what runs it."""

    run: Callable[[Cri, dict[str, Any], list[str], Streams], None]
    flags: dict[str, tuple[str, bool]]
    min_args: int
    max_args: int | None = None


@dataclass
class Streams:
    stdin: bytes | IO[bytes] | None
    stdout: IO[bytes]
    stderr: IO[bytes]

    def line(self, text: str) -> None:
        self.stdout.write(text.encode() + b"\n")

    def json(self, body: Any) -> None:
        self.line(json.dumps(body, indent=2))


def parse_verb_args(verb: Verb, argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Flags, then arguments (flags end at the first argument or ``--``, as crictl's urfave/cli)."""
    opts: dict[str, Any] = {}
    args: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            args.extend(argv[i:])
            break
        if not arg.startswith("-") or arg == "-":
            args.append(arg)
            args.extend(argv[i:])
            break
        name, eq, value = arg.partition("=")
        if name in verb.flags:
            dest, takes_value = verb.flags[name]
            if takes_value:
                if not eq:
                    if i >= len(argv):
                        raise UsageError(f"flag {name} needs a value")
                    value = argv[i]
                    i += 1
                opts[dest] = value
            elif eq:
                opts[dest] = value.lower() in ("1", "true", "yes")
            else:
                opts[dest] = True
        elif not arg.startswith("--") and all(
            f"-{c}" in verb.flags and not verb.flags[f"-{c}"][1] for c in arg[1:]
        ):
            for c in arg[1:]:  # combined short booleans: -aq
                opts[verb.flags[f"-{c}"][0]] = True
        else:
            raise UsageError(f"unknown flag {arg}")
    if len(args) < verb.min_args or (verb.max_args is not None and len(args) > verb.max_args):
        raise UsageError(f"wrong number of arguments: {args}")
    return opts, args


def _load_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            body = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {path}: {e}") from e
    if not isinstance(body, dict):
        raise UsageError(f"{path}: not a JSON object")
    return body


def _output(opts: dict[str, Any], default: str) -> str:
    fmt = str(opts.get("output", default))
    if fmt not in ("json", "table"):
        raise UsageError(f"unsupported output format {fmt!r} (json, table)")
    return fmt


def _int_flag(opts: dict[str, Any], name: str, default: int = 0) -> int:
    try:
        return int(opts.get(name, default))
    except ValueError as e:
        raise UsageError(f"--{name}: not an integer: {opts[name]!r}") from e


def _v_version(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    v = cri.version()
    io_.line(f"Version:  {v.get('version', '')}")
    io_.line(f"RuntimeName:  {v.get('runtimeName', '')}")
    io_.line(f"RuntimeVersion:  {v.get('runtimeVersion', '')}")
    io_.line(f"RuntimeApiVersion:  {v.get('runtimeApiVersion', '')}")


def _v_info(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    io_.json(cri.status(verbose=True))


def _v_runp(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    io_.line(cri.run_pod(_load_json(args[0]), opts.get("runtime", "")))


def _v_stopp(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    for pod in args:
        cri.stop_pod(pod)
        io_.line(f"Stopped sandbox {pod}")


def _v_rmp(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    for pod in args:
        if cri.pod_status(pod, verbose=False)["status"].get("state") == "SANDBOX_READY":
            if not opts.get("force"):
                raise CriError(f"pod sandbox {pod!r} is running, please stop it first")
            cri.stop_pod(pod)
        cri.remove_pod(pod)
        io_.line(f"Removed sandbox {pod}")


def _v_inspectp(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    _output(opts, "json")
    for pod in args:
        io_.json(cri.pod_status(pod))


def _table(io_: Streams, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        io_.line("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _v_pods(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    fmt = _output(opts, "table")
    pods = cri.list_pods({"id": opts["id"]} if opts.get("id") else None)
    if opts.get("quiet"):
        for pod in pods:
            io_.line(pod["id"])
    elif fmt == "json":
        io_.json({"items": pods})
    else:
        rows = [
            [p["id"][:13], p["metadata"].get("name", ""), p["state"], p.get("runtimeHandler", "")]
            for p in pods
        ]
        _table(io_, ["POD ID", "NAME", "STATE", "RUNTIME"], rows)


def _v_create(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    io_.line(cri.create_container(args[0], _load_json(args[1]), _load_json(args[2])))


def _v_start(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    for cid in args:
        cri.start_container(cid)
        io_.line(cid)


def _v_stop(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    for cid in args:
        cri.stop_container(cid, _int_flag(opts, "timeout"))
        io_.line(cid)


def _v_rm(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    for cid in args:
        if cri.container_status(cid, verbose=False)["status"].get("state") == "CONTAINER_RUNNING":
            if not opts.get("force"):
                raise CriError(f"container {cid!r} is running, please stop it first")
            cri.stop_container(cid, 0)
        cri.remove_container(cid)
        io_.line(cid)


def _v_inspect(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    _output(opts, "json")
    for cid in args:
        io_.json(cri.container_status(cid))


def _v_ps(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    fmt = _output(opts, "table")
    filt: dict[str, Any] = {}
    if opts.get("id"):
        filt["id"] = opts["id"]
    if opts.get("pod"):
        filt["podSandboxId"] = opts["pod"]
    if not opts.get("all"):
        filt["state"] = {"state": "CONTAINER_RUNNING"}
    containers = cri.list_containers(filt)
    if opts.get("quiet"):
        for c in containers:
            io_.line(c["id"])
    elif fmt == "json":
        io_.json({"containers": containers})
    else:
        rows = [
            [c["id"][:13], c["metadata"].get("name", ""), c["state"], c["podSandboxId"][:13]]
            for c in containers
        ]
        _table(io_, ["CONTAINER", "NAME", "STATE", "POD ID"], rows)


def _v_exec(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    cid, cmd = args[0], args[1:]
    if opts.get("sync"):
        result = cri.exec_sync(cid, cmd, _int_flag(opts, "timeout"))
        io_.stdout.write(result.stdout)
        io_.stderr.write(result.stderr)
        if result.exit_code != 0:
            raise CriError(
                f"execing command in container {cid} synchronously: command {' '.join(cmd)!r} "
                f"exited with {result.exit_code}: {result.stderr.decode(errors='replace').strip()}"
            )
        return
    stdin = io_.stdin if opts.get("interactive") else None
    if opts.get("interactive") and stdin is None:
        stdin = b""
    code = cri.exec(cid, cmd, stdin, io_.stdout, io_.stderr).exit_code
    if code != 0:
        raise CriError(
            f"execing command in container {cid}: command terminated with non-zero exit code {code}"
        )


def _v_logs(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    cri.container_logs(args[0], io_.stdout, io_.stderr)


def _v_stats(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    fmt = _output(opts, "table")
    cid = opts.get("id") or (args[0] if args else "")
    stats = cri.list_container_stats({"id": cid} if cid else None)
    if fmt == "json":
        io_.json({"stats": stats})
        return
    rows = [
        [
            s["attributes"]["id"][:13],
            str(s.get("cpu", {}).get("usageCoreNanoSeconds", {}).get("value", "")),
            str(s.get("memory", {}).get("workingSetBytes", {}).get("value", "")),
        ]
        for s in stats
    ]
    _table(io_, ["CONTAINER", "CPU NS", "MEM"], rows)


def _v_statsp(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    fmt = _output(opts, "table")
    stats = cri.list_pod_stats({"id": opts["id"]} if opts.get("id") else None)
    if fmt == "json":
        io_.json({"stats": stats})
        return
    _table(
        io_,
        ["POD ID", "NAME"],
        [[s["attributes"]["id"][:13], s["attributes"]["metadata"]["name"]] for s in stats],
    )


def _v_update(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    linux: dict[str, Any] = {}
    if "cpu_share" in opts:
        linux["cpu_shares"] = _int_flag(opts, "cpu_share")
    if "memory" in opts:
        linux["memory_limit_in_bytes"] = _int_flag(opts, "memory")
    for cid in args:
        cri.update_container_resources(cid, linux)
        io_.line(cid)


def _v_inspecti(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    _output(opts, "json")
    for image in args:
        status = cri.image_status(image)
        if status is None:
            raise CriError(f"no such image {image!r} present")
        io_.json(status)


def _v_images(cri: Cri, opts: dict[str, Any], args: list[str], io_: Streams) -> None:
    images = cri.list_images()
    if opts.get("quiet"):
        for image in images:
            io_.line(image["id"])
        return
    rows = [[tag, image["id"][:20]] for image in images for tag in image.get("repoTags") or ["<none>"]]
    _table(io_, ["IMAGE", "IMAGE ID"], rows)


_OUTPUT = {"-o": ("output", True), "--output": ("output", True)}
_QUIET = {"-q": ("quiet", False), "--quiet": ("quiet", False)}
_FORCE = {"-f": ("force", False), "--force": ("force", False)}
VERBS: dict[str, Verb] = {
    "version": Verb(_v_version, {}, 0, 0),
    "info": Verb(_v_info, _OUTPUT, 0, 0),
    "runp": Verb(_v_runp, {"-r": ("runtime", True), "--runtime": ("runtime", True)}, 1, 1),
    "stopp": Verb(_v_stopp, {}, 1),
    "rmp": Verb(_v_rmp, _FORCE, 1),
    "inspectp": Verb(_v_inspectp, _OUTPUT, 1),
    "pods": Verb(_v_pods, {**_QUIET, **_OUTPUT, "--id": ("id", True)}, 0, 0),
    "create": Verb(_v_create, {}, 3, 3),
    "start": Verb(_v_start, {}, 1),
    "stop": Verb(_v_stop, {"-t": ("timeout", True), "--timeout": ("timeout", True)}, 1),
    "rm": Verb(_v_rm, _FORCE, 1),
    "inspect": Verb(_v_inspect, _OUTPUT, 1),
    "ps": Verb(
        _v_ps,
        {
            "-a": ("all", False),
            "--all": ("all", False),
            **_QUIET,
            **_OUTPUT,
            "--id": ("id", True),
            "-p": ("pod", True),
            "--pod": ("pod", True),
        },
        0,
        0,
    ),
    "exec": Verb(
        _v_exec,
        {
            "-s": ("sync", False),
            "--sync": ("sync", False),
            "-i": ("interactive", False),
            "--interactive": ("interactive", False),
            "--timeout": ("timeout", True),
        },
        2,
    ),
    "logs": Verb(_v_logs, {}, 1, 1),
    "stats": Verb(_v_stats, {**_OUTPUT, "--id": ("id", True)}, 0, 1),
    "statsp": Verb(_v_statsp, {**_OUTPUT, "--id": ("id", True)}, 0, 0),
    "update": Verb(_v_update, {"--cpu-share": ("cpu_share", True), "--memory": ("memory", True)}, 1),
    "inspecti": Verb(_v_inspecti, _OUTPUT, 1),
    "images": Verb(_v_images, _QUIET, 0, 0),
}


def run(
    cri: Cri, argv: Sequence[str], stdin: bytes | IO[bytes] | None, stdout: IO[bytes], stderr: IO[bytes]
) -> int:
    """One CLI verb on ``cri``: 0, or 1 with the error on ``stderr`` (crictl's exit statuses)."""
    streams = Streams(stdin, stdout, stderr)
    try:
        if not argv or argv[0] not in VERBS:
            raise UsageError(f"unknown verb {argv[0] if argv else '(none)'}; verbs: {' '.join(VERBS)}")
        verb = VERBS[argv[0]]
        opts, args = parse_verb_args(verb, argv[1:])
        verb.run(cri, opts, args, streams)
    except CriError as e:
        stdout.flush()
        stderr.write(f"{argv[0] if argv else 'cri_client'}: {e}\n".encode())
        stderr.flush()
        return 1
    stdout.flush()
    return 0


def parse_duration(text: str) -> float:
    """crictl's --timeout: ``60s``, ``2m``, ``500ms`` or plain seconds."""
    found = re.fullmatch(r"\s*([0-9.]+)\s*(ms|s|m|h)?\s*", text)
    if not found:
        raise UsageError(f"not a duration: {text!r}")
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}[found.group(2)]
    return float(found.group(1)) * scale


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m labkit.cri_client --endpoint unix:///SOCK [--timeout 60s] [--stubs D] VERB ...``"""
    argv = list(sys.argv[1:] if argv is None else argv)
    endpoint, stubs, proto, timeout = (
        os.environ.get("CONTAINER_RUNTIME_ENDPOINT", ""),
        None,
        None,
        DEFAULT_TIMEOUT,
    )
    err = sys.stderr.buffer
    try:
        while argv and argv[0].startswith("-"):
            name, eq, value = argv.pop(0).partition("=")
            if name in ("-h", "--help"):
                sys.stdout.write((__doc__ or "") + "\n")
                return 0
            if name not in (
                "--endpoint",
                "-r",
                "--runtime-endpoint",
                "--timeout",
                "-t",
                "--stubs",
                "--proto",
            ):
                raise UsageError(f"unknown global flag {name}")
            if not eq:
                if not argv:
                    raise UsageError(f"flag {name} needs a value")
                value = argv.pop(0)
            if name in ("--timeout", "-t"):
                timeout = parse_duration(value)
            elif name == "--stubs":
                stubs = value
            elif name == "--proto":
                proto = value
            else:
                endpoint = value
        if not endpoint:
            raise UsageError("no --endpoint (unix:///path/to/containerd.sock)")
        cri = Cri(endpoint, stubs, timeout, proto=proto)
    except CriError as e:
        err.write(f"cri_client: {e}\n".encode())
        return 1
    with cri:
        return run(cri, argv, sys.stdin.buffer, sys.stdout.buffer, err)


if __name__ == "__main__":
    sys.exit(main())
