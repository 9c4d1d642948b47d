"""The launcher (the real binary): what it routes itself, what it hands to the Python entry, and
that the runtime starts exactly as it would alone (through a tracer runtime)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator

import pytest

from runc_guard.routes import routes_file
from tests.launcher import builds

STRACE = shutil.which("strace")


@pytest.fixture(scope="module")
def tracer(tmp_path_factory: pytest.TempPathFactory) -> str:
    return builds.tracer(str(tmp_path_factory.mktemp("tracer")))


class Node:
    """One test's private runc-guard paths, a settings file and two tracer runtimes (a, b)."""

    def __init__(self, tmp: str, launcher: str, tracer: str) -> None:
        self.tmp = tmp
        self.launcher = launcher
        self.config = os.path.join(tmp, "config.toml")
        self.cache = os.path.join(tmp, "cache")
        self.state = os.path.join(self.cache, "state")
        self.trace = os.path.join(tmp, "trace")
        self.root = os.path.join(tmp, "runc-root")
        self.pending = os.path.join(tmp, "pending")
        os.makedirs(self.root)
        for name in ("runtime-a", "runtime-b"):
            shutil.copy2(tracer, os.path.join(tmp, name))

    def runtime(self, name: str) -> str:
        return os.path.join(self.tmp, f"runtime-{name}")

    def settings(self, text: str) -> None:
        with open(self.config, "w") as f:
            f.write(text + f'\npending_dir = "{self.pending}"\n')

    @property
    def routes(self) -> str:
        return routes_file(self.state, self.config)

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "RUNC_GUARD_CONFIG": self.config,
            "RUNC_GUARD_CACHE_DIR": self.cache,
            "RUNC_GUARD_JOURNAL_SOCKET": os.path.join(self.tmp, "no-journald"),
            "RUNC_GUARD_LOG_FILE": os.path.join(self.tmp, "events.jsonl"),
            "RUNC_GUARD_STATS_FILE": os.path.join(self.tmp, "stats.jsonl"),
            "RUNC_GUARD_REPORTER_LINGER": "0",
            "TRACE_TO": self.trace,
            **extra,
        }

    def call(
        self, args: list[str], binary: str | None = None, cwd: str | None = None, **extra: str
    ) -> tuple[int, list[str], str]:
        """(exit status, the programs exec'd in the called process after the first, stderr)."""
        assert STRACE, "strace is an apt dependency of the tests (make deps)"
        log = os.path.join(self.tmp, "strace.log")
        proc = subprocess.run(
            [STRACE, "-qq", "-e", "trace=execve", "-e", "signal=none", "-o", log,
             binary or self.launcher, *args],
            env=self.env(**extra), capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
        )
        with open(log) as f:
            execs = [line.split('"')[1] for line in f if "execve(" in line and "= 0" in line]
        os.unlink(log)
        return proc.returncode, [os.path.basename(p) for p in execs[1:]], proc.stderr

    def traced(self) -> str | None:
        """argv[0] the tracer was started as (which runtime ran), or None; clears the trace."""
        if not os.path.exists(self.trace):
            return None
        with open(self.trace) as f:
            first = f.readline().split()[1]
        os.unlink(self.trace)
        return os.path.basename(bytes.fromhex(first).decode())


@pytest.fixture
def node(tmp_path: os.PathLike[str], shim_binary: str, tracer: str) -> Iterator[Node]:
    return Node(str(tmp_path), shim_binary, tracer)


DIRECT = ["runtime-a"]  # the launcher exec'd the runtime itself
PYTHON = ["runc-guard.py", "runtime-a"]  # ... handed the call to the Python entry, which exec'd it


def warm(node: Node, text: str | None = None) -> None:
    """Settings routing to runtime-a, and one call that writes the routing cache."""
    node.settings(text if text is not None else f'runtime = "{node.runtime("a")}"')
    assert node.call(["state", "c1"])[:2] == (0, PYTHON)
    assert node.traced() == "runtime-a"
    assert node.call(["state", "c1"])[:2] == (0, DIRECT)
    assert node.traced() == "runtime-a"


def test_trusted_cache_routes_without_python(node: Node) -> None:
    """A trusted, current cache: the runtime directly; the cache is root's 0600 in a 0700 directory."""
    warm(node)
    assert os.stat(node.routes).st_mode & 0o777 == 0o600
    assert os.stat(node.state).st_mode & 0o777 == 0o700


def test_no_settings_file_routes_the_defaults(node: Node) -> None:
    """No settings file, no cache: runc-guard's own name reaches `runc` on PATH, without Python."""
    bindir = os.path.join(node.tmp, "bin")
    os.mkdir(bindir)
    os.symlink(node.runtime("a"), os.path.join(bindir, "runc"))
    status, execs, _ = node.call(["state", "c1"], PATH=bindir)
    assert (status, execs, node.traced()) == (0, ["runc"], "runc")


@pytest.mark.parametrize("entry", ["", ".", "bin"], ids=["empty", "dot", "relative"])
def test_a_relative_path_entry_never_finds_the_runtime(node: Node, entry: str) -> None:
    """PATH=<relative>:/usr/bin with a `runc` below the working directory (the bundle): Go's
    exec.LookPath refuses such a match since 1.19 (ErrDot); so do the launcher and the Python
    entry (exit 69, naming it), and the `runc` found there never runs."""
    bundle = os.path.join(node.tmp, "bundle")
    os.makedirs(os.path.join(bundle, "bin"))
    shutil.copy2(node.runtime("a"), os.path.join(bundle, entry or ".", "runc"))
    status, execs, stderr = node.call(["state", "c1"], cwd=bundle, PATH=f"{entry}:/usr/bin")
    assert (status, execs) == (69, ["runc-guard.py"]), stderr
    assert "relative PATH entry" in stderr and node.traced() is None, stderr


def _chown(path: str) -> None:
    os.chown(path, 1000, 1000)


def _chmod(mode: int) -> Callable[[str], None]:
    return lambda path: os.chmod(path, mode)


def _rewrite(change: Callable[[bytes], bytes]) -> Callable[[str], None]:
    def apply(path: str) -> None:
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(change(data))

    return apply


def _symlink(path: str) -> None:
    os.rename(path, path + ".real")
    os.symlink(path + ".real", path)


DISTRUST: dict[str, tuple[str, Callable[[str], None]]] = {
    "missing": ("file", os.unlink),
    "foreign file": ("file", _chown),
    "foreign directory": ("dir", _chown),
    "group-writable file": ("file", _chmod(0o620)),
    "other-writable file": ("file", _chmod(0o602)),
    "group-writable directory": ("dir", _chmod(0o770)),
    "other-writable directory": ("dir", _chmod(0o703)),
    "symlink": ("file", _symlink),
    "other version": ("file", _rewrite(lambda d: d.replace(b"runc-guard-routes 2", b"runc-guard-routes 3"))),
    "earlier version": ("file", _rewrite(lambda d: d.replace(b"routes 2\n", b"routes 1\n"))),
    "admission line missing": ("file", _rewrite(lambda d: re.sub(rb"\nfinish\t[^\n]*", b"", d))),
    "admission value corrupt": ("file", _rewrite(lambda d: d.replace(b"\ntimeout\t4.0", b"\ntimeout\t-4"))),
    "truncated": ("file", _rewrite(lambda d: d[: d.rindex(b"end\n")])),
    "truncated mid-line": ("file", _rewrite(lambda d: d[:-2])),
    "corrupt": ("file", _rewrite(lambda d: d.replace(b"\ndebug\t0", b"\ndebug\t7"))),
    "NUL byte": ("file", _rewrite(lambda d: d.replace(b"runtime\t", b"runtime\t\0"))),
    "over-long": ("file", _rewrite(lambda d: d.replace(b"\nend\n", b"\n" + b"#" * 70000 + b"\nend\n"))),
    "empty": ("file", _rewrite(lambda d: b"")),
    "another settings path": ("file", _rewrite(lambda d: d.replace(b"config.toml", b"config.tom"))),
    "stale identity": ("file", _rewrite(lambda d: d.replace(b"\nfile\t", b"\nfile\t1"))),
}


@pytest.mark.parametrize("reason", list(DISTRUST))
def test_every_distrusted_cache_goes_to_python(node: Node, reason: str) -> None:
    """Each reason to distrust the cache hands the call to the Python entry, which still reaches
    the configured runtime (never plain runc) and rewrites a cache the launcher trusts again."""
    warm(node)
    target, change = DISTRUST[reason]
    change(node.routes if target == "file" else node.state)
    status, execs, stderr = node.call(["state", "c1"])
    assert (status, execs, stderr, node.traced()) == (0, PYTHON, "", "runtime-a")
    if target == "dir":  # the Python side never writes into a directory it does not trust either
        os.chown(node.state, 0, 0)
        os.chmod(node.state, 0o700)
        node.call(["state", "c1"])
    assert node.call(["state", "c1"])[:2] == (0, DIRECT)


def test_settings_edit_takes_effect_on_the_next_call(node: Node) -> None:
    """An edit changes the file's ctime: the very next call goes to Python and reaches the new runtime."""
    warm(node)
    node.settings(f'runtime = "{node.runtime("b")}"')
    assert node.call(["state", "c1"])[:2] == (0, ["runc-guard.py", "runtime-b"])
    assert node.traced() == "runtime-b"
    assert node.call(["state", "c1"])[:2] == (0, ["runtime-b"])


@pytest.mark.parametrize(
    ("variables", "args", "routes"),
    [
        ({"RUNC_GUARD_RUNTIME": "a"}, ["state", "c1"], True),
        ({"RUNC_GUARD_RUNTIMES": "other=b"}, ["state", "c1"], True),
        ({"RUNC_GUARD_PENDING_DIR": "relative/pending"}, ["delete", "c1"], True),
        ({"RUNC_GUARD_LOG_LEVEL": "Debug"}, ["delete", "c1"], True),
        ({"RUNC_GUARD_LOG_LEVEL": "loud"}, ["delete", "c1"], True),
        ({"RUNC_GUARD_PENDING_DIR": "/elsewhere", "RUNC_GUARD_LOG_LEVEL": "WARNING"}, ["delete", "c1"],
         True),
        ({"RUNC_GUARD_LOG_LEVEL": ""}, ["delete", "c1"], True),
        ({"RUNC_GUARD_PENDING_DIR": "relative/pending"}, ["state", "c1"], False),
        ({"RUNC_GUARD_DELETE_TIMEOUT": "3", "RUNC_GUARD_TEST_RUNTIMES": "/x"}, ["delete", "c1"], False),
        ({"RUNC_GUARD_RUNTIMESX": "/x", "RUNC_GUARD_RUNTIM": "/x"}, ["state", "c1"], False),
    ],
)
def test_routing_variables(node: Node, variables: dict[str, str], args: list[str], routes: bool) -> None:
    """RUNC_GUARD_RUNTIME(S) on any call; on a delete, the pending dir or log level, which decide
    whether the container is known: the Python entry, which parses them, decides. The launcher
    parses none. Other variables do not route an unknown container's delete."""
    warm(node)
    values = {k: node.runtime(v) if k == "RUNC_GUARD_RUNTIME" else v for k, v in variables.items()}
    if "RUNC_GUARD_RUNTIMES" in values:
        values["RUNC_GUARD_RUNTIMES"] = f"other={node.runtime('b')}"
    status, execs, _ = node.call(["--root", node.root, *args], **values)
    # the delete path runs the runtime as a child: only the hand-over is an exec of this process
    assert (status, execs[:1]) == (0, ["runc-guard.py"] if routes else DIRECT)


def test_a_pending_dir_from_the_environment_is_where_records_are_looked_up(node: Node) -> None:
    """RUNC_GUARD_PENDING_DIR wins over the file's pending_dir, for the launcher as for settings.py."""
    warm(node)
    elsewhere = os.path.join(node.tmp, "elsewhere")
    os.makedirs(elsewhere)
    with open(os.path.join(elsewhere, "c1@0123456789ab.json"), "w"):
        pass
    delete = ["--root", node.root, "delete", "c1"]
    assert node.call(delete)[:2] == (0, DIRECT)
    assert node.call(delete, RUNC_GUARD_PENDING_DIR=elsewhere)[1][0] == "runc-guard.py"


def test_invoked_names(node: Node) -> None:
    """A mapped name reaches its own runtime directly; an unmapped one goes to Python, which refuses
    it (exit 78, one line) rather than run the default runtime."""
    warm(node, f'runtime = "{node.runtime("a")}"\n[runtimes]\nrunc-guard-nvidia = "{node.runtime("b")}"')
    for name in ("runc-guard-nvidia", "runc-guard-other"):
        os.symlink(node.launcher, os.path.join(node.tmp, name))
    assert node.call(["state", "c1"], os.path.join(node.tmp, "runc-guard-nvidia"))[:2] == (0, ["runtime-b"])
    assert node.traced() == "runtime-b"
    status, execs, stderr = node.call(["state", "c1"], os.path.join(node.tmp, "runc-guard-other"))
    assert (status, execs, node.traced()) == (78, ["runc-guard.py"], None)
    assert stderr.startswith("runc-guard: invoked as 'runc-guard-other'") and stderr.count("\n") == 1


def test_deletes(node: Node) -> None:
    """An unknown container's delete: the runtime directly. Known (state.json, crun's status, a pending
    record) or at log level debug: the Python entry's delete path."""
    warm(node)
    delete = ["--root", node.root, "delete", "--force", "c1"]
    assert node.call(delete)[:2] == (0, DIRECT)
    assert node.call(["--root", node.root, "--help", "delete", "c1"])[:2] == (0, DIRECT)
    os.makedirs(node.pending)
    with open(os.path.join(node.pending, "c10@0123456789ab.json"), "w"):
        pass  # another id's record
    assert node.call(delete)[:2] == (0, DIRECT)
    for known in ("c1/state.json", "c1/status"):
        os.makedirs(os.path.join(node.root, "c1"), exist_ok=True)
        with open(os.path.join(node.root, known), "w"):
            pass
        assert node.call(delete)[1][0] == "runc-guard.py"
        os.unlink(os.path.join(node.root, known))
    with open(os.path.join(node.pending, "c1@0123456789ab.json"), "w"):
        pass
    assert node.call(delete)[1][0] == "runc-guard.py"
    os.unlink(os.path.join(node.pending, "c1@0123456789ab.json"))
    node.settings(f'runtime = "{node.runtime("a")}"\nlog_level = "debug"')
    node.call(["state", "c1"])
    assert node.call(delete)[1][0] == "runc-guard.py"


def test_runtime_problems_go_to_python(node: Node) -> None:
    """A runtime that is missing, or is runc-guard itself: the Python entry reports it (exit 69)."""
    node.settings(f'runtime = "{node.runtime("gone")}"')
    status, execs, stderr = node.call(["state", "c1"])
    assert (status, execs) == (69, ["runc-guard.py"]) and "missing or not an executable" in stderr
    node.settings(f'runtime = "{node.launcher}"')
    status, execs, stderr = node.call(["state", "c1"])
    assert (status, execs) == (69, ["runc-guard.py"]) and "runc-guard itself" in stderr


def test_no_python_entry_is_one_line_and_the_documented_code(node: Node, tmp_path: os.PathLike[str]) -> None:
    """A launcher without its Python entry: what it routes still runs; what it cannot is one stderr
    line, a journal entry and exit 78 (routing untrusted) or 69 (a delete to interpose)."""
    lone = os.path.join(tmp_path, "lone")
    os.mkdir(lone)
    launcher = os.path.join(lone, "runc-guard")
    shutil.copy2(node.launcher, launcher)
    node.settings(f'runtime = "{node.runtime("a")}"')
    status, _, stderr = node.call(["state", "c1"], launcher)
    assert (status, stderr.count("\n")) == (78, 1)
    assert stderr.startswith("runc-guard: no routing cache to trust; cannot exec the Python entry")
    warm(node)
    assert node.call(["state", "c1"], launcher)[:2] == (0, ["runtime-a"])
    os.makedirs(os.path.join(node.root, "c1"))
    with open(os.path.join(node.root, "c1", "state.json"), "w"):
        pass
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        journal.bind(os.path.join(node.tmp, "journal.sock"))
        journal.settimeout(5)
        status, _, stderr = node.call(["--root", node.root, "delete", "c1"], launcher,
                                      RUNC_GUARD_JOURNAL_SOCKET=os.path.join(node.tmp, "journal.sock"))
        assert (status, stderr.count("\n")) == (69, 1) and "a delete to interpose" in stderr
        entry = dict(line.split("=", 1) for line in journal.recv(8192).decode().splitlines())
    finally:
        journal.close()
    assert (entry["EVENT"], entry["PRIORITY"]) == ("runtime_unavailable", "3")
    assert entry["SYSLOG_IDENTIFIER"] == "runc-guard"
    assert entry["MESSAGE"] == "runtime_unavailable: " + stderr.removeprefix("runc-guard: ").rstrip("\n")


# -- exactness: the runtime alone, through the launcher, through the Python entry --------------

LINES = [
    ["--version"],
    ["features"],
    ["--root", "/run/containerd/runc/k8s.io", "--log", "/l.json", "--log-format", "json", "state", "c1"],
    ["exec", "--process", "/p.json", "--detach", "--pid-file", "/e.pid", "c1"],
    ["--log", "delete", "state", "c1"],
    ["", "=", "--", "-", "a=b", "\u00e9"],
]


def _start_as_caller(ignore: tuple[int, ...], block: tuple[int, ...]) -> Callable[[], None]:
    def setup() -> None:
        for sig in ignore:
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, block)

    return setup


def _trace(node: Node, argv: list[str], env: dict[str, str], ignore: tuple[int, ...],
           block: tuple[int, ...], keep: int) -> tuple[int, list[str]]:
    cwd = os.path.join(node.tmp, "bundle")
    os.makedirs(cwd, exist_ok=True)
    with open(os.path.join(node.tmp, "io"), "ab") as io:  # the same stdout/stderr file every run
        proc = subprocess.run(argv, env=env, cwd=cwd, pass_fds=(keep,), stdout=io, stderr=io,
                              preexec_fn=_start_as_caller(ignore, block), timeout=60, check=False)
    with open(node.trace) as f:
        lines = [line for line in f.read().splitlines() if not line.startswith("pid ")]
    os.unlink(node.trace)
    return proc.returncode, lines


@pytest.mark.parametrize(
    ("ignore", "block"),
    [((), ()), ((signal.SIGINT,), (signal.SIGUSR1, signal.SIGTERM)), ((signal.SIGINT, signal.SIGHUP,
                                                                       signal.SIGTERM), ())],
    ids=["inherited defaults", "SIGINT ignored, signals blocked", "INT HUP TERM ignored"],
)
def test_runtime_starts_exactly_as_alone(node: Node, python_entry: str, ignore: tuple[int, ...],
                                         block: tuple[int, ...]) -> None:
    """argv, environment bytes, cwd, fds, SigIgn, SigBlk and exit status: launcher, Python entry and
    the runtime alone identical, also with signals ignored and blocked by the caller."""
    warm(node)
    env = {**node.env(), "TRACE_EXIT": "7", "ODD": "x=y\nz"}
    r, w = os.pipe()
    try:
        for line in LINES:
            alone = _trace(node, [node.runtime("a"), *line], env, ignore, block, w)
            assert alone[0] == 7 and any(f"fd {w} pipe:" in x for x in alone[1])
            assert _trace(node, [node.launcher, *line], env, ignore, block, w) == alone, line
            assert _trace(node, [python_entry, *line], env, ignore, block, w) == alone, line
    finally:
        os.close(r)
        os.close(w)


def test_the_hand_over_leaves_no_trace_in_the_runtime(node: Node) -> None:
    """Launcher -> Python entry -> runtime (RUNC_GUARD_RUNTIME makes the launcher hand over): the
    runtime still starts exactly as alone, RUNC_GUARD_HANDOVER gone from its environment, even when
    the caller had set a variable of that name itself."""
    warm(node)
    r, w = os.pipe()
    try:
        for extra in ({}, {"RUNC_GUARD_HANDOVER": "callers-own/value"}):
            env = {**node.env(), "RUNC_GUARD_RUNTIME": node.runtime("a"), "TRACE_EXIT": "3", **extra}
            caller = (signal.SIGINT,), (signal.SIGUSR2,)
            for line in LINES:
                alone = _trace(node, [node.runtime("a"), *line], env, *caller, w)
                assert _trace(node, [node.launcher, *line], env, *caller, w) == alone, (line, extra)
    finally:
        os.close(r)
        os.close(w)


def test_an_ignored_sigpipe_is_kept_by_the_launcher_only(node: Node, python_entry: str) -> None:
    """CPython ignores SIGPIPE itself at start, so the Python entry restores the default (docs/launcher.md):
    a caller's ignored SIGPIPE reaches the runtime through the launcher, not through the Python entry."""
    warm(node)
    env = node.env()
    r, w = os.pipe()
    try:
        alone = _trace(node, [node.runtime("a"), "state"], env, (signal.SIGPIPE,), (), w)
        assert _trace(node, [node.launcher, "state"], env, (signal.SIGPIPE,), (), w) == alone
        python = _trace(node, [python_entry, "state"], env, (signal.SIGPIPE,), (), w)
    finally:
        os.close(r)
        os.close(w)
    sigign = {line.split(":")[0]: int(line.split()[1], 16) for line in (*alone[1], *python[1]) if ":" in line}
    differ = [(a, p) for a, p in zip(alone[1], python[1], strict=True) if a != p]
    assert len(differ) == 1 and differ[0][0].startswith("SigIgn:")
    assert int(differ[0][0].split()[1], 16) ^ int(differ[0][1].split()[1], 16) == 1 << (signal.SIGPIPE - 1)
    assert sigign


def test_the_hand_over_keeps_the_pid(node: Node) -> None:
    """Launcher -> Python entry -> runtime is one process: the pid (and so its start time and parent,
    which procinfo.deadline_origin reads for containerd's budget) is the one the caller started."""
    node.settings(f'runtime = "{node.runtime("a")}"')  # no cache yet: the Python entry runs
    proc = subprocess.Popen([node.launcher, "state", "c1"], env=node.env(), stdout=subprocess.DEVNULL)
    assert proc.wait(timeout=60) == 0
    with open(node.trace) as f:
        assert f"pid {proc.pid}\n" in f.readlines()


def test_the_hand_over_names_the_invoked_name_and_the_launcher(tmp_path: os.PathLike[str]) -> None:
    """RUNC_GUARD_HANDOVER=<name>/<path>: the name (no "/") and the launcher's path, taken out of the
    environment; without it, this script's own argv[0]."""
    import sys

    from runc_guard.shim.entry import handed_over

    env = {"RUNC_GUARD_HANDOVER": "runc-guard-nvidia//usr/bin/runc-guard", "OTHER": "x"}
    assert handed_over(env) == ("runc-guard-nvidia", "/usr/bin/runc-guard", [])  # type: ignore[arg-type]
    assert env == {"OTHER": "x"}
    assert handed_over(env) == (os.path.basename(sys.argv[0]), sys.argv[0], [])  # type: ignore[arg-type]
    env = {"RUNC_GUARD_HANDOVER": "runc-guard//usr/bin/runc-guard\nadmitted 5 1234 dead_shim"}
    assert handed_over(env) == ("runc-guard", "/usr/bin/runc-guard", ["admitted", "5", "1234", "dead_shim"])  # type: ignore[arg-type]
