"""Settings: defaults, file, RUNC_GUARD_* overrides, validation, routing fallback and the start-up cache."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from runc_guard import routes
from runc_guard.errors import EXIT_CONFIG, ConfigError
from runc_guard.settings import (
    DEFAULT_DELETE_TIMEOUT,
    Settings,
    load,
    load_settings,
    read_settings_file,
    state_dir,
)


def env_for(tmp_path: os.PathLike[str], text: str | None = None, **extra: str) -> dict[str, str]:
    path = os.path.join(tmp_path, "config.toml")
    if text is not None:
        with open(path, "w") as f:
            f.write(text)
    return {"RUNC_GUARD_CONFIG": path, "RUNC_GUARD_CACHE_DIR": os.path.join(tmp_path, "cache"), **extra}


def test_defaults_fit_containerd_cleanup_budget(tmp_path: os.PathLike[str]) -> None:
    """Without a file: defaults, and the delete deadline leaves room in containerd's 5 s."""
    settings = load_settings(env_for(tmp_path))
    assert settings == Settings()
    assert settings.delete_timeout == DEFAULT_DELETE_TIMEOUT < 5.0


def test_file_then_environment(tmp_path: os.PathLike[str]) -> None:
    """The file sets values; RUNC_GUARD_<KEY> overrides them."""
    env = env_for(
        tmp_path,
        'delete_timeout = 2\npoll_interval = 0.05\nruntime = "/x/runc"\n',
        RUNC_GUARD_DELETE_TIMEOUT="4.5",
    )
    settings = load_settings(env)
    assert (settings.delete_timeout, settings.poll_interval, settings.runtime) == (4.5, 0.05, "/x/runc")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("delete_timout = 2\n", "unknown setting 'delete_timout'"),
        ('delete_timeout = "soon"\n', "delete_timeout"),
        ("delete_timeout = -1\n", "delete_timeout"),
        ("poll_interval = 0\n", "poll_interval"),
        ('pending_dir = "relative"\n', "pending_dir"),
        ('log_level = "loud"\n', "log_level"),
        ("kill_stragglers = 3\n", "kill_stragglers"),
        ("runtimes = 3\n", "runtimes"),
        ("delete_timeout = nan\n", "delete_timeout"),
        ("this is not toml\n", "cannot use settings file"),
    ],
)
def test_bad_settings_name_the_problem(tmp_path: os.PathLike[str], text: str, needle: str) -> None:
    """A bad file raises ConfigError (exit 78) whose message names the key."""
    with pytest.raises(ConfigError) as info:
        load_settings(env_for(tmp_path, text))
    assert needle in str(info.value)
    assert info.value.exit_code == EXIT_CONFIG == 78


def test_bad_environment_value(tmp_path: os.PathLike[str]) -> None:
    """A bad RUNC_GUARD_* value names the variable."""
    with pytest.raises(ConfigError, match="RUNC_GUARD_POLL_INTERVAL"):
        load_settings(env_for(tmp_path, RUNC_GUARD_POLL_INTERVAL="fast"))


def test_runtimes_from_environment(tmp_path: os.PathLike[str]) -> None:
    """RUNC_GUARD_RUNTIMES takes name=runtime pairs, and routing honours them."""
    settings = load_settings(env_for(tmp_path, RUNC_GUARD_RUNTIMES="a=runc,b=/usr/bin/crun"))
    assert settings.runtimes == {"a": "runc", "b": "/usr/bin/crun"}
    assert (settings.runtime_for("b"), settings.runtime_for("runc-guard")) == ("/usr/bin/crun", "runc")


def test_invoked_name_wins_over_runtime(tmp_path: os.PathLike[str]) -> None:
    """[runtimes] by the invoked name, then RUNC_GUARD_RUNTIME over the file's runtime."""
    env = env_for(tmp_path, 'runtime = "crun"\n[runtimes]\nrunc-guard-nvidia = "nvidia-container-runtime"\n',
                  RUNC_GUARD_RUNTIME="/opt/runc")
    settings = load(env)
    assert settings.runtime_for("runc-guard-nvidia") == "nvidia-container-runtime"
    assert settings.runtime_for("runc-guard") == "/opt/runc"


def test_lenient_load_keeps_defaults_and_lists_problems(tmp_path: os.PathLike[str]) -> None:
    """load (the shim's and the delete's) never raises: a bad key keeps its default, named in problems."""
    settings = load(env_for(tmp_path, 'delete_timeout = "soon"\nkill_stragglers = false\n'))
    assert (settings.delete_timeout, settings.kill_stragglers) == (DEFAULT_DELETE_TIMEOUT, False)
    assert len(settings.problems) == 1 and "delete_timeout" in settings.problems[0]
    assert settings.routing_problem is None


def test_broken_routing_uses_the_last_good_version(tmp_path: os.PathLike[str]) -> None:
    """A file that stops parsing (or whose routing turns invalid) routes by its last good version;
    with no such version only the default names may be routed."""
    env = env_for(tmp_path, '[runtimes]\nrunc-guard-nvidia = "nvidia-container-runtime"\n')
    assert load(env).runtime_for("runc-guard-nvidia") == "nvidia-container-runtime"
    for broken in ("[runtimes\n", "runtimes = 3\n"):
        with open(env["RUNC_GUARD_CONFIG"], "w") as f:
            f.write(broken)
        settings = load(env)
        assert settings.routing_from_last_good and "last good version" in str(settings.routing_problem)
        assert settings.runtime_for("runc-guard-nvidia") == "nvidia-container-runtime"
        assert settings.routing_problem in settings.problems
    fresh = load(env_for(tmp_path, "runtime = 3\n", RUNC_GUARD_CACHE_DIR=os.path.join(tmp_path, "c2")))
    assert fresh.routing_problem is not None and not fresh.routing_from_last_good
    assert fresh.runtime == "runc"


def test_unreadable_file(tmp_path: os.PathLike[str]) -> None:
    """A settings path that cannot be read (a directory here) is a ConfigError, not a traceback."""
    env = env_for(tmp_path)
    os.mkdir(env["RUNC_GUARD_CONFIG"])
    with pytest.raises(ConfigError, match="cannot use settings file"):
        load_settings(env)


def test_cache_hit_returns_same_data_and_edit_invalidates(tmp_path: os.PathLike[str]) -> None:
    """The settings cache (routes.cached_settings, written by the load) returns the parsed file;
    any edit of the file misses it."""
    env = env_for(tmp_path, 'runtime = "a"\ndelete_timeout = 2.5\n[runtimes]\nx = "y"\n')
    path, state = env["RUNC_GUARD_CONFIG"], state_dir(env)
    load(env)
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    first = routes.cached_settings(state, path, key)
    assert first == {"runtime": "a", "delete_timeout": 2.5, "runtimes": {"x": "y"}}
    assert read_settings_file(path, state) == first
    with open(path, "w") as f:
        f.write('runtime = "b"\n')
    assert read_settings_file(path, state) == {"runtime": "b"}


def test_cache_hit_does_not_import_tomllib(tmp_path: os.PathLike[str]) -> None:
    """A warm cache keeps tomllib (~10 ms) off the shim's start-up."""
    env = env_for(tmp_path, 'runtime = "a"\n')
    code = (
        "import sys; from runc_guard.settings import load;"
        f"load({env!r});"
        "print('tomllib' in sys.modules)"
    )
    outs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    ]
    assert outs == ["True\n", "False\n"]


def test_untrusted_cache_is_ignored(tmp_path: os.PathLike[str]) -> None:
    """A cache writable by others is never read: the file is parsed instead."""
    env = env_for(tmp_path, 'runtime = "a"\n')
    load(env)
    cache = routes.routes_file(state_dir(env), env["RUNC_GUARD_CONFIG"])
    with open(cache) as f:
        text = f.read()
    with open(cache, "w") as f:
        f.write(text.replace('"runtime": "a"', '"runtime": "z"'))
    assert read_settings_file(env["RUNC_GUARD_CONFIG"], state_dir(env)) == {"runtime": "z"}  # ours: read
    os.chmod(cache, 0o666)
    assert read_settings_file(env["RUNC_GUARD_CONFIG"], state_dir(env)) == {"runtime": "a"}


def test_what_json_cannot_carry_is_parsed_each_time(tmp_path: os.PathLike[str]) -> None:
    """A TOML date has no JSON form: the routing is still cached for the launcher, the file is parsed."""
    env = env_for(tmp_path, 'runtime = "a"\nwhen = 1979-05-27\n')
    load(env)
    with open(routes.routes_file(state_dir(env), env["RUNC_GUARD_CONFIG"])) as f:
        text = f.read()
    assert "runtime\ta\n" in text and "settings\t" not in text
    assert str(read_settings_file(env["RUNC_GUARD_CONFIG"], state_dir(env))["when"]) == "1979-05-27"


@pytest.mark.parametrize(
    "body",
    [
        "delete_timeout = 1" + "0" * 320,  # an integer beyond a double: OverflowError
        "x = " + "[" * 2000 + "]" * 2000,  # nested past the parser's recursion limit
        "container_cgroup_patterns = " + "[" * 200 + "]" * 200,  # deep, parses, repr of it is cut
        "delete_timeout = " + "9" * 5000,  # past int's digit limit: ValueError inside tomllib
    ],
)
def test_hostile_values_never_escape_load(tmp_path: Any, body: str) -> None:
    """A value that overflows or nests deeply is a problem that keeps the default, never a traceback:
    load() runs on every runtime call, create and start included."""
    config = os.path.join(tmp_path, "config.toml")
    with open(config, "w") as f:
        f.write(body + "\n")
    settings = load({"RUNC_GUARD_CONFIG": config, "RUNC_GUARD_CACHE_DIR": os.path.join(tmp_path, "c")})
    assert settings.delete_timeout == 4.0 and settings.problems
    assert all(len(p) < 1000 for p in settings.problems)


def test_unmapped_handler_name_is_a_problem_not_a_fallback(tmp_path: Any) -> None:
    """runc-guard-nvidia with no [runtimes] entry must not reach the default runtime; runc-guard's own
    names (its .pyz file too) and runc route to the default."""
    from runc_guard.settings import unmapped_problem

    settings = load({"RUNC_GUARD_CONFIG": os.path.join(tmp_path, "absent.toml")})
    problem = unmapped_problem(settings, "runc-guard-nvidia")
    assert problem is not None and "runc-guard-nvidia" in problem and "[runtimes]" in problem
    assert [unmapped_problem(settings, n) for n in ("runc-guard", "runc", "runc-guard.pyz")] == [None] * 3
    mapped = settings.replace(runtimes={"runc-guard-nvidia": "nvidia-container-runtime"})
    assert unmapped_problem(mapped, "runc-guard-nvidia") is None
