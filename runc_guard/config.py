"""The one settings object: defaults in code, then the TOML file, then RUNC_GUARD_* variables.

Used by the delete path and the admin tool; the passthrough path only needs the
runtime and reads it straight from the cached file (see ``settings_file``).
Settings are untrusted input: unknown keys and bad values are errors that name
the key, never silently ignored (a typo in ``delete_timeout`` must not quietly
fall back to a default on a whole fleet).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from runc_guard.errors import ConfigError
from runc_guard.settings_file import (
    DEFAULT_DELETE_TIMEOUT,
    DEFAULT_JOURNAL_SOCKET,
    DEFAULT_LOG_FILE,
    DEFAULT_PENDING_DIR,
    MAX_DELETE_TIMEOUT,
    cache_dir,
    config_path,
    read_settings_file,
)
from runc_guard.values import Value

LOG_LEVELS = ("debug", "info", "warning", "error")


class Settings(Value):
    """Effective settings; build with :func:`load_settings`, pass down explicitly."""

    __slots__ = (
        "container_cgroup_patterns",
        "delete_timeout",
        "journal_socket",
        "kill_stragglers",
        "log_file",
        "log_level",
        "pending_dir",
        "poll_interval",
        "reporter_linger",
        "runtime",
        "runtimes",
        "source",
        "stats_file",
    )
    #: Every key of the file; ``source`` (where the values came from) is no setting.
    _compared = tuple(n for n in __slots__ if n != "source")
    runtime: str
    runtimes: Mapping[str, str]
    delete_timeout: float
    poll_interval: float
    pending_dir: str
    journal_socket: str
    log_file: str
    log_level: str
    kill_stragglers: bool
    stats_file: str
    #: fnmatch patterns (``{id}`` = the container id) of cgroup names that belong to a
    #: container, besides the id itself and ``<prefix>-<id>.scope`` (paths.names_container).
    container_cgroup_patterns: tuple[str, ...]
    #: How long a detached reporter waits for more deletes' entries before it exits.
    reporter_linger: float
    source: str

    def __init__(
        self,
        runtime: str = "runc",
        runtimes: Mapping[str, str] | None = None,
        delete_timeout: float = DEFAULT_DELETE_TIMEOUT,
        poll_interval: float = 0.02,
        pending_dir: str = DEFAULT_PENDING_DIR,
        journal_socket: str = DEFAULT_JOURNAL_SOCKET,
        log_file: str = DEFAULT_LOG_FILE,
        log_level: str = "info",
        kill_stragglers: bool = True,
        stats_file: str = "/run/runc-guard/deletes.jsonl",
        container_cgroup_patterns: tuple[str, ...] = (),
        reporter_linger: float = 2.0,
        source: str = "(defaults)",
    ) -> None:
        runtimes = {} if runtimes is None else runtimes
        self._init(locals())

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self._compared}


_KEYS = frozenset(Settings._compared)


def _to_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _to_seconds(key: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{key}: expected a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{key}: expected a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or not low <= seconds <= high:
        raise ConfigError(f"{key}: {seconds:g} s is outside {low:g}..{high:g} s")
    return seconds


def _to_path(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise ConfigError(f"{key}: expected an absolute path, got {value!r}")
    return os.path.normpath(value)


def _to_runtimes(value: object) -> dict[str, str]:
    if isinstance(value, str):  # RUNC_GUARD_RUNTIMES="nvidia-runc-guard=nvidia-container-runtime,..."
        pairs = [item.split("=", 1) for item in value.split(",") if item]
        if any(len(p) != 2 for p in pairs):
            raise ConfigError(f"runtimes: expected name=runtime[,name=runtime], got {value!r}")
        value = dict(pairs)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()
    ):
        raise ConfigError(f'runtimes: expected a table of name = "runtime", got {value!r}')
    return dict(value)


def _to_patterns(value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # RUNC_GUARD_CONTAINER_CGROUP_PATTERNS="a-{id},b-{id}.scope"
        value = [item for item in value.split(",") if item]
    if not isinstance(value, list) or not all(
        isinstance(p, str) and "{id}" in p and "/" not in p for p in value
    ):
        raise ConfigError(
            "container_cgroup_patterns: expected a list of names with {id},"
            f' like ["ctr-{{id}}"], got {value!r}'
        )
    return tuple(value)


def _convert(key: str, value: object) -> object:
    if key in ("delete_timeout",):
        return _to_seconds(key, value, 0.0, MAX_DELETE_TIMEOUT)
    if key == "poll_interval":
        return _to_seconds(key, value, 0.001, 5.0)
    if key == "reporter_linger":
        return _to_seconds(key, value, 0.0, 60.0)
    if key in ("pending_dir", "journal_socket", "log_file", "stats_file"):
        return _to_path(key, value)
    if key == "kill_stragglers":
        return _to_bool(key, value)
    if key == "runtimes":
        return _to_runtimes(value)
    if key == "container_cgroup_patterns":
        return _to_patterns(value)
    if key == "log_level":
        if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
            raise ConfigError(f"log_level: expected one of {', '.join(LOG_LEVELS)}, got {value!r}")
        return value.lower()
    if key == "runtime":
        if not isinstance(value, str) or not value or "\0" in value:
            raise ConfigError(f"runtime: expected a command name or path, got {value!r}")
        return value
    raise AssertionError(key)


def lenient_settings(
    raw: Mapping[str, object], environ: Mapping[str, str], source: str
) -> tuple[Settings, list[str]]:
    """Every valid key applied, every problem listed: what the delete path runs with.

    A typo or a bad value on a fleet must never change how a delete ends, so an
    invalid key keeps its default and the problem is reported (journal once per
    file version, metrics, doctor, audit) instead of failing every delete.
    """
    problems = [f"{source}: unknown setting {key!r}" for key in sorted(set(raw) - set(_KEYS))]
    values: dict[str, object] = {}
    for key, value in raw.items():
        if key not in _KEYS:
            continue
        try:
            values[key] = _convert(key, value)
        except ConfigError as exc:
            problems.append(f"{source}: {exc}")
    for key in _KEYS:
        env_value = environ.get(f"RUNC_GUARD_{key.upper()}")
        if env_value is not None and env_value != "":
            try:
                values[key] = _convert(key, env_value)
            except ConfigError as exc:
                problems.append(f"RUNC_GUARD_{key.upper()}: {exc}")
    return Settings(**values, source=source), problems  # type: ignore[arg-type]


def settings_from(raw: Mapping[str, object], environ: Mapping[str, str], source: str) -> Settings:
    """Validate ``raw`` (the file) and overlay ``RUNC_GUARD_<KEY>`` variables; the first problem raises.

    For the admin tool, which must refuse to act on settings it cannot honour.
    """
    settings, problems = lenient_settings(raw, environ, source)
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else "; ".join(problems))
    return settings


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from the file at RUNC_GUARD_CONFIG (default /etc/runc-guard/config.toml)."""
    env = os.environ if environ is None else environ
    path = config_path(env)
    try:
        raw = read_settings_file(path, cache_dir(env))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot use settings file {path}: {exc}") from exc
    source = path if os.path.exists(path) else f"{path} (absent: defaults)"
    return settings_from(raw, env, source)


def load_settings_leniently(environ: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """Like :func:`load_settings`, but every problem is listed instead of raised.

    For the node tools that must still report (audit, metrics, doctor) when the
    settings file is broken: valid keys apply, the rest keep their defaults.
    """
    env = os.environ if environ is None else environ
    path = config_path(env)
    try:
        raw = read_settings_file(path, cache_dir(env))
        problems: list[str] = []
    except (OSError, ValueError) as exc:
        raw, problems = {}, [f"cannot use settings file {path}: {exc}"]
    settings, more = lenient_settings(raw, env, path)
    return settings, problems + more
