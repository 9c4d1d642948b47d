"""Passthrough fidelity of the real `runc-guard` binary, through a recording runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HEAVY = ("click", "structlog", "psutil", "tenacity", "tomllib", "dataclasses", "re", "subprocess")


@pytest.fixture
def recorder(tmp_path: os.PathLike[str]) -> str:
    """An executable runtime stand-in that records argv/env/fds/pid/SigIgn."""
    src = os.path.join(os.path.dirname(__file__), "recorder.py")
    path = os.path.join(tmp_path, "fake-runc")
    # A shell front: it records SigIgn before CPython (which ignores SIGPIPE itself) starts.
    with open(path, "w") as out:
        out.write(
            "#!/bin/sh\n"
            'grep SigIgn: /proc/$$/status > "$RECORD_TO.sig"\n'
            'cat /proc/$$/environ > "$RECORD_TO.env"\n'
            f'exec {sys.executable} -I {src} "$@"\n'
        )
    os.chmod(path, 0o755)
    return path


def isolated_env(tmp: str | os.PathLike[str], extra: dict[str, str]) -> dict[str, str]:
    """Every runc-guard path inside the test's tmp dir (never /run/runc-guard), plus ``extra``."""
    env = {
        "PATH": os.environ["PATH"],
        "RUNC_GUARD_CONFIG": os.path.join(tmp, "none.toml"),
        "RUNC_GUARD_CACHE_DIR": os.path.join(tmp, "cache"),
        "RUNC_GUARD_JOURNAL_SOCKET": os.path.join(tmp, "no-journald"),
        "RUNC_GUARD_PENDING_DIR": os.path.join(tmp, "pending"),
        "RUNC_GUARD_LOG_FILE": os.path.join(tmp, "events.jsonl"),
        "RUNC_GUARD_REPORTER_LINGER": "0",
        "RUNC_GUARD_STATS_FILE": os.path.join(tmp, "stats.jsonl"),
    }
    env.update(extra)
    return env


def run_shim(
    shim: str, args: list[bytes | str], recorder: str, tmp: str, **kw: object
) -> tuple[subprocess.CompletedProcess[bytes], dict]:  # type: ignore[type-arg]
    record = os.path.join(tmp, "record.json")
    env = isolated_env(tmp, {"RUNC_GUARD_RUNTIME": recorder, "RECORD_TO": record, "ODD_VAR": "x=y\nz"})
    proc = subprocess.run([shim, *args], env=env, capture_output=True, check=False, **kw)  # type: ignore[call-overload]
    with open(record) as f:
        return proc, json.load(f)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--version"],
        ["--help"],
        ["features"],
        ["--root", "/run/containerd/runc/k8s.io", "state", "c1"],
        ["--log", "delete", "state", "c1"],
        ["--unknown-flag", "delete", "c1"],
        ["exec", "--pid-file", "/p", "--process", "/x.json", "-d", "c1"],
        ["delete", "../escape"],
        ["delete", "a", "b"],
        ["", "=", "--", "-", "a=b", "--x=", "\u00e9"],
    ],
)
def test_passthrough_is_exact(
    shim_binary: str, recorder: str, tmp_path: os.PathLike[str], args: list[str]
) -> None:
    """argv after argv[0], env and stdout reach the runtime unchanged, in the same process."""
    proc, rec = run_shim(shim_binary, args, recorder, str(tmp_path))
    assert [bytes.fromhex(a).decode() for a in rec["argv"]] == args
    assert rec["env"]["ODD_VAR"] == "x=y\nz" and rec["env"]["RUNC_GUARD_RUNTIME"] == recorder
    assert proc.stdout == b"recorder-stdout\n"
    assert proc.stderr == b""
    assert proc.returncode == 0


def test_passthrough_keeps_pid_fds_and_signals(
    shim_binary: str, recorder: str, tmp_path: os.PathLike[str]
) -> None:
    """Same pid (exec, not fork), inherited fds kept, no SIG_IGN left over from CPython."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        proc = subprocess.Popen(
            [shim_binary, "state", "c1"],
            pass_fds=(w,),
            env=isolated_env(
                tmp_path,
                {
                    "RUNC_GUARD_RUNTIME": recorder,
                    "RECORD_TO": os.path.join(tmp_path, "rec"),
                },
            ),
            stdout=subprocess.DEVNULL,
        )
        proc.wait()
    finally:
        os.close(r)
        os.close(w)
    with open(os.path.join(tmp_path, "rec")) as f:
        rec = json.load(f)
    with open(os.path.join(tmp_path, "rec.sig")) as f:
        sigign = int(f.read().split()[1], 16)
    assert rec["pid"] == proc.pid
    assert w in rec["fds"]
    # SIGPIPE is signal 13, SIGXFSZ 25: both must be default, as under the Go shim.
    assert sigign & ((1 << 12) | (1 << 24)) == 0


@pytest.mark.parametrize("status", [1, 2, 42, 255])
def test_exit_status_passes_through(
    shim_binary: str, recorder: str, tmp_path: os.PathLike[str], status: int
) -> None:
    """The runtime's exit status is the caller's exit status."""
    proc = subprocess.run(
        [shim_binary, "state", "c1"],
        env=isolated_env(
            tmp_path,
            {
                "RUNC_GUARD_RUNTIME": recorder,
                "RECORD_EXIT": str(status),
                "RECORD_TO": os.path.join(tmp_path, "rec"),
            },
        ),
        capture_output=True,
        check=False,
    )
    assert proc.returncode == status


def test_non_utf8_argv_is_byte_identical(shim_binary: str, recorder: str, tmp_path: os.PathLike[str]) -> None:
    """Bytes that are not UTF-8 survive the trip (surrogateescape both ways)."""
    args = [b"state", b"\xff\xfe-not-utf8", b"caf\xc3\xa9"]
    _proc, rec = run_shim(shim_binary, args, recorder, str(tmp_path))
    assert [bytes.fromhex(a) for a in rec["argv"]] == args


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(min_size=0, max_size=40).filter(lambda b: b"\0" not in b), max_size=40))
def test_any_argv_is_passed_byte_identical(
    shim_binary: str, recorder: str, tmp_path: os.PathLike[str], args: list[bytes]
) -> None:
    """Property: whatever argv containerd could send (minus NUL, which execve cannot carry) arrives intact."""
    if args and args[0] == b"delete":
        args = [b"state", *args]  # an interposed delete is covered by the kernel tests
    _proc, rec = run_shim(shim_binary, args, recorder, str(tmp_path))
    assert [bytes.fromhex(a) for a in rec["argv"]] == args


def test_very_long_argv(shim_binary: str, recorder: str, tmp_path: os.PathLike[str]) -> None:
    """Thousands of arguments pass through in order."""
    args = ["exec", *(f"--arg{i}" for i in range(5000))]
    _proc, rec = run_shim(shim_binary, args, recorder, str(tmp_path))
    assert [bytes.fromhex(a).decode() for a in rec["argv"]] == args


def with_importtime(shim_binary: str) -> list[str]:
    """The shim run by its own shebang line plus ``-X importtime`` (-I ignores PYTHONPROFILEIMPORTTIME)."""
    with open(shim_binary) as f:
        interpreter = f.readline()[2:].split()
    return [*interpreter, "-X", "importtime", shim_binary]


def test_the_shim_runs_isolated_and_without_site(python_entry: str) -> None:
    """As the .deb's Python entry: python -IS, so no .pth file, sitecustomize or
    PYTHON* variable in containerd's environment runs on a runtime call."""
    with open(python_entry) as f:
        assert f.readline().split()[1:] == ["-IS"]


def test_hot_path_imports_no_heavy_modules(python_entry: str, tmp_path: os.PathLike[str]) -> None:
    """A passthrough loads none of click/structlog/psutil/tenacity/tomllib/dataclasses/re."""
    env = isolated_env(tmp_path, {})
    argv = [*with_importtime(python_entry), "--version"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert "site" not in {line.split("|")[-1].strip() for line in proc.stderr.splitlines()}
    imported = {
        line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")
    }
    assert "runc_guard.shim.entry" in imported
    assert not imported & set(HEAVY), imported & set(HEAVY)
    assert "runc version" in proc.stdout


def test_hot_path_with_warm_settings_cache(python_entry: str, tmp_path: os.PathLike[str]) -> None:
    """With a settings file present, the second call reads the cache and skips tomllib."""
    config = os.path.join(tmp_path, "config.toml")
    with open(config, "w") as f:
        f.write('runtime = "runc"\n')
    env = isolated_env(tmp_path, {"RUNC_GUARD_CONFIG": config})
    runs = [
        subprocess.run([*with_importtime(python_entry), "--version"], env=env, capture_output=True, text=True,
                       check=True)
        for _ in range(2)
    ]
    assert "tomllib" in runs[0].stderr
    assert "tomllib" not in runs[1].stderr


def test_loop_to_itself_is_refused(shim_binary: str, tmp_path: os.PathLike[str]) -> None:
    """A runtime setting that points at runc-guard itself fails clearly (exit 69), no exec loop."""
    link = os.path.join(tmp_path, "runc")
    os.symlink(shim_binary, link)
    for runtime, path in ((shim_binary, os.environ["PATH"]), ("runc", str(tmp_path))):
        proc = subprocess.run(
            [shim_binary, "--version"],
            env=isolated_env(
                tmp_path,
                {
                    "PATH": path,
                    "RUNC_GUARD_RUNTIME": runtime,
                },
            ),
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
        assert proc.returncode == 69, proc.stderr
        assert "runc-guard itself" in proc.stderr
        assert proc.stdout == ""


def test_shadowed_runc_on_path_reaches_real_one(
    shim_binary: str, recorder: str, tmp_path: os.PathLike[str]
) -> None:
    """runc-guard installed as `runc` early on PATH skips itself and finds the next runc."""
    first = os.path.join(tmp_path, "first")
    second = os.path.join(tmp_path, "second")
    os.mkdir(first)
    os.mkdir(second)
    os.symlink(shim_binary, os.path.join(first, "runc"))
    os.symlink(recorder, os.path.join(second, "runc"))
    proc = subprocess.run(
        [os.path.join(first, "runc"), "list"],
        env=isolated_env(
            tmp_path,
            {
                "PATH": f"{first}:{second}",
                "RUNC_GUARD_CONFIG": os.path.join(tmp_path, "n"),
                "RECORD_TO": os.path.join(tmp_path, "rec"),
            },
        ),
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"recorder-stdout\n"


@pytest.mark.parametrize(
    ("runtime", "needle"),
    [("/nonexistent/runc", "missing or not an executable"), ("no-such-runtime-xyz", "not found on PATH")],
)
def test_missing_runtime(shim_binary: str, tmp_path: os.PathLike[str], runtime: str, needle: str) -> None:
    """A missing runtime is exit 69 with a message naming it; nothing on stdout."""
    proc = subprocess.run(
        [shim_binary, "state", "c1"],
        env=isolated_env(
            tmp_path,
            {
                "PATH": "/usr/bin:/bin",
                "RUNC_GUARD_RUNTIME": runtime,
            },
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (69, "")
    assert needle in proc.stderr


def test_runtime_chosen_by_invoked_name(shim_binary: str, recorder: str, tmp_path: os.PathLike[str]) -> None:
    """[runtimes] maps the name runc-guard was invoked as (e.g. a symlink) to its runtime."""
    config = os.path.join(tmp_path, "config.toml")
    with open(config, "w") as f:
        f.write(f'runtime = "/nonexistent"\n[runtimes]\nnvidia-runc-guard = "{recorder}"\n')
    link = os.path.join(tmp_path, "nvidia-runc-guard")
    os.symlink(shim_binary, link)
    proc = subprocess.run(
        [link, "state", "c1"],
        env=isolated_env(
            tmp_path,
            {
                "RUNC_GUARD_CONFIG": config,
                "RECORD_TO": os.path.join(tmp_path, "rec"),
            },
        ),
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"recorder-stdout\n"


def test_broken_settings_file_still_passes_through(
    shim_binary: str, recorder: str, tmp_path: os.PathLike[str]
) -> None:
    """An unparseable settings file does not stop `state`: defaults are used, stdout stays clean."""
    config = os.path.join(tmp_path, "config.toml")
    with open(config, "w") as f:
        f.write("this is [not toml\n")
    proc = subprocess.run(
        [shim_binary, "state", "c1"],
        env=isolated_env(
            tmp_path,
            {
                "RUNC_GUARD_RUNTIME": recorder,
                "RUNC_GUARD_CONFIG": config,
                "RECORD_TO": os.path.join(tmp_path, "rec"),
            },
        ),
        capture_output=True,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"recorder-stdout\n", b"")


def test_bad_runtime_type_is_config_error(shim_binary: str, tmp_path: os.PathLike[str]) -> None:
    """`runtime = 3` under a non-default name cannot be guessed around: exit 78 naming the key."""
    config = os.path.join(tmp_path, "config.toml")
    with open(config, "w") as f:
        f.write("runtime = 3\n")
    link = os.path.join(tmp_path, "runc-guard-nvidia")
    os.symlink(shim_binary, link)
    proc = subprocess.run(
        [link, "state", "c1"],
        env=isolated_env(
            tmp_path,
            {
                "RUNC_GUARD_CONFIG": config,
            },
        ),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 78
    assert "runtime" in proc.stderr


def test_environment_is_byte_identical(shim_binary: str, recorder: str, tmp_path: os.PathLike[str]) -> None:
    """The runtime's environment is exactly the caller's: no LC_CTYPE from CPython's locale coercion."""
    env = isolated_env(tmp_path, {"RUNC_GUARD_RUNTIME": recorder, "RECORD_TO": os.path.join(tmp_path, "rec")})
    assert not any(k.startswith(("LC_", "LANG")) for k in env)  # the C locale: coercion would apply
    env_b = {k.encode(): v.encode() for k, v in env.items()}
    env_b[b"BINARY_VALUE"] = b"\xff\xfe"
    subprocess.run([shim_binary, "state", "c1"], env=env_b, capture_output=True, check=True)
    with open(os.path.join(tmp_path, "rec.env"), "rb") as f:
        got = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if item)
    assert got == env_b


def test_unmapped_handler_name_fails_and_never_reaches_the_default(
    shim_binary: str, recorder: str, tmp_path: os.PathLike[str]
) -> None:
    """Invoked as runc-guard-nvidia with no [runtimes] entry (the file absent): exit 78 with one clear
    stderr line; the default runtime (the recorder) is never run. The same call under runc-guard's own
    name still reaches it; a settings file nested too deep for the parser is no traceback either."""
    link = os.path.join(tmp_path, "runc-guard-nvidia")
    os.symlink(shim_binary, link)
    record = os.path.join(tmp_path, "rec")
    env = isolated_env(tmp_path, {"RUNC_GUARD_RUNTIME": recorder, "RECORD_TO": record})
    proc = subprocess.run(
        [link, "state", "c1"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 78 and not os.path.exists(record)
    assert proc.stderr.startswith("runc-guard: invoked as 'runc-guard-nvidia'")
    assert proc.stderr.count("\n") == 1
    deep = os.path.join(tmp_path, "deep.toml")
    with open(deep, "w") as f:
        f.write("x = " + "[" * 2000 + "]" * 2000 + "\n")
    proc = subprocess.run(
        [shim_binary, "state", "c1"], env={**env, "RUNC_GUARD_CONFIG": deep}, capture_output=True, text=True,
        timeout=30, check=False,
    )
    assert proc.returncode == 0 and proc.stderr == "" and os.path.exists(record)
