"""The routing cache the launcher reads: its format, and when the settings load (re)writes it."""

from __future__ import annotations

import os

from runc_guard import routes
from runc_guard.settings import Settings, load, state_dir

ADMISSION = {key: getattr(Settings(), key) for key in routes.ADMISSION_KEYS}


def env_for(tmp: str, text: str | None) -> dict[str, str]:
    config = os.path.join(tmp, "config.toml")
    if text is not None:
        with open(config, "w") as f:
            f.write(text)
    return {"RUNC_GUARD_CONFIG": config, "RUNC_GUARD_CACHE_DIR": os.path.join(tmp, "cache")}


def test_render_and_last_good_round_trip(tmp_path: os.PathLike[str]) -> None:
    """What render writes, last_good reads back (the identity is ignored there: it is the last *good* one)."""
    table = {"runc-guard-nvidia": "nvidia"}
    blob = routes.render("/etc/c.toml", (1, 2, 3, 4, 5), "crun", table, "/p", True, ADMISSION)
    assert blob is not None and blob.endswith(b"\nend\n")
    assert b"file\t1 2 3 4 5\n" in blob and b"debug\t1\n" in blob
    assert b"\ndebug\t1\ntimeout\t4.0\nfinish\t" in blob
    assert b"\nlogfile\t/var/log/runc-guard/events.jsonl\n" in blob
    routes.keep(str(tmp_path), "/etc/c.toml", blob)
    assert routes.last_good(str(tmp_path), "/etc/c.toml") == {
        "runtime": "crun", "runtimes": {"runc-guard-nvidia": "nvidia"},
    }
    assert routes.last_good(str(tmp_path), "/etc/other.toml") is None


def test_values_the_launcher_cannot_parse_are_not_cached() -> None:
    """A tab, newline or NUL in a value, or more names than the launcher holds: no cache, Python routes."""
    for runtime in ("a\tb", "a\nb", "a\0b", ""):
        assert routes.render("/c", (1, 2, 3, 4, 5), runtime, {}, "/p", False, ADMISSION) is None
    for journal in ("/j\tx", "/j\nx", ""):
        bad = {**ADMISSION, "journal_socket": journal}
        assert routes.render("/c", (1, 2, 3, 4, 5), "runc", {}, "/p", False, bad) is None
    many = {f"n{i}": "r" for i in range(routes.MAX_NAMES + 1)}
    assert routes.render("/c", (1, 2, 3, 4, 5), "runc", many, "/p", False, ADMISSION) is None


def test_load_writes_the_cache_from_the_file_alone(tmp_path: os.PathLike[str]) -> None:
    """The settings load writes the file's routing (never RUNC_GUARD_RUNTIME's) bound to its identity."""
    env = env_for(str(tmp_path), 'runtime = "crun"\n[runtimes]\nrunc-guard-x = "x-runtime"\n')
    load({**env, "RUNC_GUARD_RUNTIME": "/elsewhere"})
    path = routes.routes_file(state_dir(env), env["RUNC_GUARD_CONFIG"])
    with open(path) as f:
        text = f.read()
    st = os.stat(env["RUNC_GUARD_CONFIG"])
    key = f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"
    assert f"file\t{key}\n" in text and "runtime\tcrun\n" in text
    assert "name\trunc-guard-x\tx-runtime\n" in text
    assert "/elsewhere" not in text
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_a_broken_or_absent_file_keeps_the_last_good_copy(tmp_path: os.PathLike[str]) -> None:
    """A file that no longer parses, or whose routing is invalid, never overwrites the last good copy."""
    env = env_for(str(tmp_path), 'runtime = "crun"\n')
    load(env)
    path = routes.routes_file(state_dir(env), env["RUNC_GUARD_CONFIG"])
    with open(path, "rb") as f:
        good = f.read()
    for broken in ('runtime = "crun\n', "runtime = 3\n"):
        with open(env["RUNC_GUARD_CONFIG"], "w") as f:
            f.write(broken)
        settings = load(env)
        assert settings.routing_from_last_good and settings.runtime == "crun"
        with open(path, "rb") as f:
            assert f.read() == good


def test_state_dir_follows_the_cache_unless_set(tmp_path: os.PathLike[str]) -> None:
    """RUNC_GUARD_STATE_DIR wins; a moved cache takes the state with it; else /var/lib/runc-guard."""
    assert state_dir({}) == "/var/lib/runc-guard"
    assert state_dir({"RUNC_GUARD_CACHE_DIR": "/c"}) == "/c/state"
    assert state_dir({"RUNC_GUARD_CACHE_DIR": "/c", "RUNC_GUARD_STATE_DIR": "/s"}) == "/s"


def test_a_foreign_state_directory_is_never_written(tmp_path: os.PathLike[str]) -> None:
    """A state directory someone else may write: the load leaves it alone (the launcher distrusts it too)."""
    env = env_for(str(tmp_path), 'runtime = "crun"\n')
    os.makedirs(state_dir(env))
    os.chmod(state_dir(env), 0o777)
    load(env)
    assert os.listdir(state_dir(env)) == []


def test_an_upgrade_with_a_broken_file_routes_by_the_copy_in_run(tmp_path: os.PathLike[str]) -> None:
    """A node upgraded while its settings file is broken has no persistent copy yet: the last good
    routing the earlier runc-guard kept in its cache directory (/run) still routes it, not exit 78."""
    import marshal

    tmp = str(tmp_path)
    env = env_for(tmp, "runtime = [\n")  # a syntax error
    config = env["RUNC_GUARD_CONFIG"]
    cache = env["RUNC_GUARD_CACHE_DIR"]
    os.makedirs(cache, mode=0o700)
    previous = os.path.join(cache, "routing" + config.replace("/", "%") + ".last-good")
    with open(previous, "wb") as f:
        f.write(marshal.dumps((config, {"runtime": "crun", "runtimes": {"runc-guard-nvidia": "nvidia"}})))
    os.chmod(previous, 0o600)
    settings = load(env)
    assert settings.routing_from_last_good and settings.runtime == "crun"
    assert settings.runtime_for("runc-guard-nvidia") == "nvidia"
    os.chmod(previous, 0o666)  # writable by others: never unmarshalled
    assert not load(env).routing_from_last_good
