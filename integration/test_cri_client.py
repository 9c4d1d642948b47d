"""labkit.cri_client, the CRI client every CRI test and bench drives containerd with.

Its own behaviour, first without containerd: stubs compiled once and atomically,
an import that needs nothing but the standard library, clear errors (no socket,
connection refused, a peer that never answers, a reply that is no CRI message),
the crictl-style argv, and the WebSocket exec stream against a fake streaming
server (handshake, masking, channels, exit statuses, a refused upgrade). Then
against a real containerd (Debian's 1.6): the CLI as its own process, a large
exec output, and a containerd that is gone. The CRI lifecycle suite
(test_cri_lifecycle.py) runs every verb on containerd 1.6, 1.7 and 2.1.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from labkit import containerd as cl
from labkit import cri as cr
from labkit import cri_client as cc

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
ROOT = str(Path(__file__).resolve().parent.parent)


@pytest.fixture(scope="module")
def stubs() -> str:
    return cr.require_stubs()


# --- Stubs and import hygiene -----------------------------------------------------------


def test_stubs_are_generated_once_and_atomically(tmp_path: Path) -> None:
    """Four generators at once into an empty cache end with one complete directory, no leftovers."""
    from labkit import runtimes

    proto = runtimes.require(runtimes.CRI_API_PROTO)
    cr.require_stubs()  # grpc_tools present (else stopped here, by labkit.prereq)
    with ThreadPoolExecutor(4) as pool:
        dirs = list(pool.map(lambda _: cc.generate_stubs(proto, str(tmp_path)), range(4)))
    assert len(set(dirs)) == 1, dirs
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(dirs[0])]
    assert sorted(os.listdir(dirs[0])) == ["api_pb2.py", "api_pb2_grpc.py"]
    assert os.path.basename(dirs[0]) == cc.stubs_key(proto)


def test_import_needs_only_the_standard_library() -> None:
    """Importing it loads no grpc, protobuf, runc_guard or other labkit module (the VM guest's rule)."""
    code = (
        "import sys, labkit.cri_client\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'google', 'runc_guard')"
        " or (m.startswith('labkit.') and m != 'labkit.cri_client')]\n"
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=30
    )
    assert out.stdout.strip() == "[]", out


# --- Errors: never a hang, always a message ----------------------------------------------


def test_no_socket_is_unreachable(stubs: str, tmp_path: Path) -> None:
    """A socket path that does not exist: Unreachable at once, naming the path."""
    cri = cc.Cri(f"unix://{tmp_path}/none.sock", stubs, timeout=5)
    t = time.monotonic()
    with pytest.raises(cc.Unreachable, match="no CRI socket at"):
        cri.version()
    assert time.monotonic() - t < 1


def test_connection_refused_is_unreachable(stubs: str, tmp_path: Path) -> None:
    """A socket nobody listens on (containerd gone, its socket left): Unreachable, inside the deadline."""
    path = str(tmp_path / "dead.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.close()  # the file stays; connect() is refused
    cri = cc.Cri(f"unix://{path}", stubs, timeout=10)
    t = time.monotonic()
    with pytest.raises(cc.Unreachable, match="unreachable"):
        cri.list_pods()
    assert time.monotonic() - t < 5


def test_silent_peer_hits_the_deadline(stubs: str, tmp_path: Path) -> None:
    """A peer that accepts and never answers: DeadlineExceeded after the call's timeout, not a hang."""
    path = str(tmp_path / "silent.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)
    try:
        cri = cc.Cri(f"unix://{path}", stubs, timeout=1.0)
        t = time.monotonic()
        with pytest.raises((cc.DeadlineExceeded, cc.Unreachable)):
            cri.version()
        assert time.monotonic() - t < 4
    finally:
        server.close()


def test_garbage_reply_is_a_bad_reply(stubs: str, tmp_path: Path) -> None:
    """A gRPC server whose reply is no CRI message: BadReply naming the call."""
    import grpc  # type: ignore[import-untyped]

    def handler(request: bytes, context: object) -> bytes:
        return b"\xff\xff\xff\xff"

    server = grpc.server(ThreadPoolExecutor(2))
    methods = {"Version": grpc.unary_unary_rpc_method_handler(handler)}
    service = grpc.method_handlers_generic_handler("runtime.v1.RuntimeService", methods)
    server.add_generic_rpc_handlers([service])
    path = str(tmp_path / "garbage.sock")
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        with pytest.raises(cc.BadReply, match="Version"):
            cc.Cri(f"unix://{path}", stubs, timeout=5).version()
    finally:
        server.stop(0)


def test_cli_error_is_exit_1_with_the_reason(stubs: str, tmp_path: Path) -> None:
    """The CLI as crictl: exit status 1, the reason on stderr, nothing on stdout."""
    proc = subprocess.run(
        [sys.executable, "-m", "labkit.cri_client", "--endpoint", f"unix://{tmp_path}/none.sock",
         "--stubs", stubs, "--timeout", "5s", "ps", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc
    assert "no CRI socket at" in proc.stderr and proc.stdout == "", proc


# --- The argv, as crictl takes it -------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "argv", "opts", "args"),
    [
        ("exec", ["-s", "--timeout", "1", "c", "sleep"], {"sync": True, "timeout": "1"}, ["c", "sleep"]),
        ("exec", ["c1", "sh", "-c", "exit 3"], {}, ["c1", "sh", "-c", "exit 3"]),
        ("exec", ["-i", "c1", "--", "x"], {"interactive": True}, ["c1", "--", "x"]),
        ("ps", ["-aq", "--id=abc"], {"all": True, "quiet": True, "id": "abc"}, []),
        ("ps", ["-a", "-o", "json", "--pod", "p1"], {"all": True, "output": "json", "pod": "p1"}, []),
        ("rm", ["-f", "c1", "c2"], {"force": True}, ["c1", "c2"]),
        ("stop", ["-t", "0", "c1"], {"timeout": "0"}, ["c1"]),
        ("runp", ["--runtime", "stock", "pod.json"], {"runtime": "stock"}, ["pod.json"]),
        ("update", ["--cpu-share", "5", "--memory", "64", "c1"], {"cpu_share": "5", "memory": "64"}, ["c1"]),
    ],
)  # fmt: skip
def test_verb_argv(verb: str, argv: list[str], opts: dict[str, object], args: list[str]) -> None:
    """Flags until the first argument (urfave/cli's rule); the rest is arguments, exec's command untouched."""
    assert cc.parse_verb_args(cc.VERBS[verb], argv) == (opts, args)


@pytest.mark.parametrize(
    ("verb", "argv"),
    [("ps", ["--bogus"]), ("exec", ["c1"]), ("create", ["p", "c.json"]), ("stop", ["-t"]), ("pods", ["x"])],
)
def test_verb_argv_rejected(verb: str, argv: list[str]) -> None:
    """Unknown flags, a missing flag value and wrong argument counts are usage errors."""
    with pytest.raises(cc.UsageError):
        cc.parse_verb_args(cc.VERBS[verb], argv)


@pytest.mark.parametrize(
    ("protocol", "status", "code"),
    [
        ("v4.channel.k8s.io", b'{"metadata":{},"status":"Success"}', 0),
        ("v4.channel.k8s.io", json.dumps({"status": "Failure", "reason": "NonZeroExitCode", "details": {
            "causes": [{"reason": "ExitCode", "message": "3"}]}}).encode(), 3),
        ("channel.k8s.io", b"", 0),
        ("channel.k8s.io", b"command terminated: error executing command [x], exit code 7", 7),
    ],
)  # fmt: skip
def test_exit_code_of_status(protocol: str, status: bytes, code: int) -> None:
    """The error channel's status, v4 JSON or v1 text, gives the command's exit code."""
    assert cc.exit_code_of(protocol, status) == code


@pytest.mark.parametrize(
    "status", [b"", b"not json", b'{"status":"Failure","reason":"InternalError","message":"boom"}']
)
def test_status_without_exit_is_an_error(status: bytes) -> None:
    """No status (connection lost), no JSON, or a failure that is no exit code: StreamError/BadReply."""
    with pytest.raises((cc.StreamError, cc.BadReply)):
        cc.exit_code_of("v4.channel.k8s.io", status)


def test_replies_keep_their_defaults(stubs: str) -> None:
    """Fields at their default still appear (crictl's EmitDefaults): a created container's state
    and exit code 0 are there, named as crictl prints them."""
    pb2 = cc.load_stubs(stubs).pb2
    body = cc.to_dict(pb2.ContainerStatus(id="c1"))
    assert (body["state"], body["exitCode"], body["createdAt"]) == ("CONTAINER_CREATED", 0, "0")


def test_configs_take_crictl_json(stubs: str) -> None:
    """A crictl JSON config (proto names, enums as numbers, unknown keys) parses as Go's json did."""
    pb2 = cc.load_stubs(stubs).pb2
    body = {"metadata": {"name": "p", "uid": "u", "attempt": 1}, "log_directory": "/l", "bogus": 1,
            "linux": {"security_context": {"namespace_options": {"network": 2, "pid": 1}}}}  # fmt: skip
    config = cc.from_dict(body, pb2.PodSandboxConfig())
    assert (config.metadata.attempt, config.log_directory) == (1, "/l")
    assert config.linux.security_context.namespace_options.pid == pb2.CONTAINER


def test_cri_log_lines_go_back_to_their_streams() -> None:
    """kubelet's log format: stream by the second field, P lines joined, F lines ended."""
    log = [
        b"2026-12-07T07:00:00.1Z stdout F hello\n",
        b"2026-12-07T07:00:00.2Z stderr P par\n",
        b"2026-12-07T07:00:00.3Z stderr F t\n",
        b"2026-12-07T07:00:00.4Z stdout F\n",
        b"garbage\n",
    ]
    out, err = io.BytesIO(), io.BytesIO()
    cc.split_cri_log(log, out, err)
    assert (out.getvalue(), err.getvalue()) == (b"hello\n\n", b"part\n")


# --- The exec stream against a fake streaming server ----------------------------------


def _server_frame(payload: bytes, opcode: int = 2) -> bytes:
    n = len(payload)
    if n < 126:
        return struct.pack("!BB", 0x80 | opcode, n) + payload
    if n < 1 << 16:
        return struct.pack("!BBH", 0x80 | opcode, 126, n) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, n) + payload


def _read_client_frame(conn: socket.socket) -> tuple[int, bytes]:
    def exact(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    b0, b1 = exact(2)
    assert b1 & 0x80, "a client frame must be masked (RFC 6455 5.1)"
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", exact(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", exact(8))
    key = exact(4)
    data = exact(n)
    return b0 & 0x0F, bytes(b ^ key[i % 4] for i, b in enumerate(data))


@pytest.fixture
def fake_stream() -> Iterator[Callable[[Callable[[socket.socket, dict[str, str]], None]], str]]:
    """A one-connection HTTP server on 127.0.0.1 whose handler does the rest; yields a URL factory."""
    servers: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def start(handler: Callable[[socket.socket, dict[str, str]], None]) -> str:
        server = socket.create_server(("127.0.0.1", 0))
        servers.append(server)

        def serve() -> None:
            conn, _ = server.accept()
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                lines = head.decode().split("\r\n")
                fields = (line.partition(":") for line in lines[1:] if line)
                headers = {k.strip().lower(): v.strip() for k, _, v in fields}
                headers[":request"] = lines[0]
                handler(conn, headers)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return f"http://127.0.0.1:{server.getsockname()[1]}/exec/tok3n"

    yield start
    for server in servers:
        server.close()
    for thread in threads:
        thread.join(5)


def _upgrade(conn: socket.socket, headers: dict[str, str], protocol: str = "v4.channel.k8s.io") -> None:
    accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
    conn.sendall(
        (
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n"
        ).encode()
    )


def test_exec_stream_channels_stdin_and_exit_code(fake_stream: Callable[..., str]) -> None:
    """Handshake as the kubelet streaming server wants it, stdin masked on channel 0, stdout/stderr
    demultiplexed (one 70 KiB frame, one fragmented), the v4 status's exit code returned."""
    seen: dict[str, object] = {}

    def handler(conn: socket.socket, headers: dict[str, str]) -> None:
        seen.update(headers)
        _upgrade(conn, headers)
        conn.sendall(_server_frame(b"\x01"))  # the server's "connected" empty write
        opcode, data = _read_client_frame(conn)
        seen["stdin"] = (opcode, data)
        conn.sendall(_server_frame(b"\x01" + b"o" * 70000))
        # One message in two fragments: binary without FIN, then a FIN continuation.
        conn.sendall(struct.pack("!BB", 0x02, 3) + b"\x02er" + struct.pack("!BB", 0x80, 2) + b"r\n")
        conn.sendall(_server_frame(b"\x09", opcode=0x9))  # a ping, answered with a pong
        seen["pong"] = _read_client_frame(conn)
        status = {"status": "Failure", "reason": "NonZeroExitCode",
                  "details": {"causes": [{"reason": "ExitCode", "message": "42"}]}}  # fmt: skip
        conn.sendall(_server_frame(b"\x03" + json.dumps(status).encode()))
        conn.sendall(_server_frame(b"\x03\xe8", opcode=0x8))

    url = fake_stream(handler)
    out, err = io.BytesIO(), io.BytesIO()
    code = cc.stream_exec(url, b"hello\n", out, err, time.monotonic() + 10)
    assert code == 42
    assert out.getvalue() == b"o" * 70000 and err.getvalue() == b"err\n"
    assert seen[":request"] == "GET /exec/tok3n HTTP/1.1"
    assert seen["upgrade"] == "websocket" and seen["sec-websocket-version"] == "13"
    assert str(seen["sec-websocket-protocol"]).startswith("v4.channel.k8s.io")
    assert seen["stdin"] == (2, b"\x00hello\n")
    assert seen["pong"] == (0xA, b"\x09")


def test_exec_stream_refused_upgrade(fake_stream: Callable[..., str]) -> None:
    """An expired token (404 instead of 101): StreamError with the status line."""

    def handler(conn: socket.socket, headers: dict[str, str]) -> None:
        conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found")

    with pytest.raises(cc.StreamError, match="404 Not Found"):
        cc.stream_exec(fake_stream(handler), None, io.BytesIO(), io.BytesIO(), time.monotonic() + 10)


def test_exec_stream_silent_server_hits_the_deadline(fake_stream: Callable[..., str]) -> None:
    """A stream that upgrades and then says nothing: DeadlineExceeded at the deadline."""
    done = threading.Event()

    def handler(conn: socket.socket, headers: dict[str, str]) -> None:
        _upgrade(conn, headers)
        done.wait(10)

    t = time.monotonic()
    try:
        with pytest.raises(cc.DeadlineExceeded):
            cc.stream_exec(fake_stream(handler), None, io.BytesIO(), io.BytesIO(), time.monotonic() + 1)
    finally:
        done.set()
    assert time.monotonic() - t < 4


def test_exec_stream_lost_connection_is_an_error(fake_stream: Callable[..., str]) -> None:
    """The connection ends before any status: StreamError, not exit code 0."""

    def handler(conn: socket.socket, headers: dict[str, str]) -> None:
        _upgrade(conn, headers)
        conn.sendall(_server_frame(b"\x01partial"))

    out = io.BytesIO()
    with pytest.raises(cc.StreamError, match="without a status"):
        cc.stream_exec(fake_stream(handler), None, out, io.BytesIO(), time.monotonic() + 10)
    assert out.getvalue() == b"partial"


# --- Against a real containerd ----------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cr.CriLab]:
    with cr.lab_for(cl.CONTAINERD_16, tmp_path_factory) as lab:
        yield lab


@pytest.mark.kernel
def test_cli_process_and_large_exec_output(lab: cr.CriLab, stubs: str) -> None:
    """``python -m labkit.cri_client`` as its own process lists the container; 3 MiB come through
    the exec stream intact; exec_sync and a streamed exec agree on a non-zero exit code."""
    with lab.pod(cr.GUARD_HANDLER, cr.CONTAINER) as pod:
        ctr = lab.create(pod, ["sleep", "1000"])
        proc = subprocess.run(
            [sys.executable, "-m", "labkit.cri_client", "--endpoint", "unix://" + lab.containerd.address,
             "--stubs", stubs, "ps", "-q", "--pod", pod.id],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (proc.returncode, proc.stdout.split()) == (0, [ctr.id]), proc
        result = lab.client.exec(ctr.id, ["head", "-c", str(3 << 20), "/dev/zero"])
        assert (result.exit_code, len(result.stdout), result.stdout.count(0)) == (0, 3 << 20, 3 << 20)
        assert lab.client.exec(ctr.id, ["sh", "-c", "exit 5"]).exit_code == 5
        assert lab.client.exec_sync(ctr.id, ["sh", "-c", "exit 5"]).exit_code == 5
        with pytest.raises(cc.NotFound):
            lab.client.container_status("0" * 64)
        assert lab.client.container_state("0" * 64) is None


@pytest.mark.kernel
def test_gone_containerd_is_a_clear_error(tmp_path_factory: pytest.TempPathFactory) -> None:
    """containerd stopped under a client: the next call is Unreachable within its deadline, no hang."""
    with cr.lab_for(cl.CONTAINERD_16, tmp_path_factory) as lab:
        client = lab.client.with_timeout(10)
        assert client.version()["runtimeName"] == "containerd"
        lab.containerd.stop()
        t = time.monotonic()
        with pytest.raises(cc.Unreachable):
            client.list_containers()
        assert time.monotonic() - t < 5
