"""The one settings object: defaults in code, then the TOML file, then RUNC_GUARD_* variables.

Read once and validated once per process, by the shim (every runtime call),
the delete path and runc-guardctl alike; passed down explicitly. Settings are
untrusted input: unknown keys and bad values are problems that name the key.
A problem never changes where a call goes or how a delete ends: an invalid key
keeps its default and is reported (journal once per file version, metrics,
doctor, audit); a file that no longer parses routes by the last version that
did (``routes.last_good``, persistent); runc-guardctl refuses to act on settings it
cannot honour (``load_settings``).

On the hot path: importing ``tomllib`` costs ~10-15 ms, more than a bare
interpreter start, so the parsed file is cached in the one settings cache both
the launcher and Python read (``routes``: plain text and JSON, in the state
directory), bound to the file's device, inode, size, mtime and ctime. ctime
cannot be set from user space, so an edited file always misses. The cache is
trusted only if it is owned by us and not writable by group or others.
Stdlib only.
"""

from __future__ import annotations

import os

from runc_guard import routes
from runc_guard.atomic import read_trusted
from runc_guard.errors import ConfigError
from runc_guard.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and collections.abc cost imports the hot path does not pay
    from collections.abc import Mapping

DEFAULT_CONFIG = "/etc/runc-guard/config.toml"
DEFAULT_RUNTIME = "runc"
#: containerd gives the dead-shim cleanup (the shim's whole ``delete``, runc
#: included) 5 s by default (io.containerd.timeout.shim.cleanup), counted from
#: the shim's start; runc-guard counts from its own process start. 4 s leaves the
#: shim ~1 s to unmount the rootfs after we return, and is what a 3-4 s teardown
#: needs: under the systemd driver stock runc waits on systemd's stop job and
#: finishes such teardowns inside containerd's 5 s, so a shorter deadline would
#: leave more behind than the runtime alone (measured in the systemd lab).
DEFAULT_DELETE_TIMEOUT = 4.0
#: The serving shim's delete (kubelet stopped the container; the live shim runs ``runc
#: delete`` for CRI's exit handler) runs under CRI's handleEventTimeout, 10 s from the exit
#: event, not under the dead-shim 5 s: stock runc waiting on systemd's stop job finishes
#: there after 4 s too. Before us the shim waits up to 2 s (containerd 1.6) for the init's
#: stdio to drain, ~2.2 s in CRI's 1.6 cells where stragglers hold it: 7 s leaves ~0.8 s
#: of the 10 for stopping the runtime, our reply and the shim's unmount (docs/deadline.md).
#: ``delete_timeout`` still applies when it is longer.
SERVING_SHIM_DELETE_TIMEOUT = 7.0
#: The range accepted for ``delete_timeout`` (seconds).
MAX_DELETE_TIMEOUT = 600.0
#: After a deadline cut a delete short, or a delete stepped aside at start-up overload, a
#: finisher completes it once its cgroups empty: for this long once no new record appeared for
#: 5 s (node.finisher_process.QUIET). On by default since the launcher admits deletes itself: in the
#: 200-crash storm (containerd 2.2.2 + runc 1.3.4, docs/storm.md) containerd then finished every
#: task, as with stock runc, and 60 s later nothing was left, where stock leaked 46-54
#: containers. 0 leaves it all to ``runc-guardctl sweep``.
DEFAULT_FINISH_WINDOW = 60.0
MAX_FINISH_WINDOW = 3600.0
#: Where the delete path keeps its durable records (Settings.pending_dir's default).
DEFAULT_PENDING_DIR = "/run/runc-guard/pending"
DEFAULT_CACHE_DIR = "/run/runc-guard"
#: The routing cache (runc_guard.routes): persistent, since it is also the last good routing.
DEFAULT_STATE_DIR = "/var/lib/runc-guard"
DEFAULT_JOURNAL_SOCKET = "/run/systemd/journal/socket"
DEFAULT_LOG_FILE = "/var/log/runc-guard/events.jsonl"
MAX_CONFIG_BYTES = 1 << 20


def config_path(environ: Mapping[str, str]) -> str:
    return environ.get("RUNC_GUARD_CONFIG") or DEFAULT_CONFIG


def cache_dir(environ: Mapping[str, str]) -> str:
    return environ.get("RUNC_GUARD_CACHE_DIR") or DEFAULT_CACHE_DIR


def state_dir(environ: Mapping[str, str]) -> str:
    """Where the routing cache (the last good routing) persists across reboots.

    RUNC_GUARD_STATE_DIR; else ``<RUNC_GUARD_CACHE_DIR>/state`` when only the
    cache is moved (a test's or a lab's private paths never touch the node's);
    else /var/lib/runc-guard. The launcher derives it the same way.
    """
    explicit = environ.get("RUNC_GUARD_STATE_DIR")
    if explicit:
        return explicit
    moved = environ.get("RUNC_GUARD_CACHE_DIR")
    return os.path.join(moved, "state") if moved else DEFAULT_STATE_DIR


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


#: Keys that decide where a call goes; kept from the last file that parsed (runc_guard.routes).
ROUTING_KEYS = ("runtime", "runtimes")


def first_report(cache_directory: str | None, path: str, problem: str) -> bool:
    """True the first time ``problem`` is seen for this version of ``path`` (once per edit).

    A broken settings file is reported to the journal once, not by every runtime
    call of every container: the marker's name holds the file's stat key and a
    checksum of the problem, so an edit (new ctime) or a new problem reports again.
    """
    if not cache_directory:
        return True
    import binascii

    try:
        key = "-".join(str(k) for k in _stat_key(os.stat(path)))
    except OSError:
        key = "absent"
    crc = binascii.crc32(problem.encode("utf-8", "surrogateescape"))
    marker = os.path.join(cache_directory, f"reported{path.replace('/', '%')}-{key}-{crc:08x}")
    try:
        os.makedirs(cache_directory, mode=0o700, exist_ok=True)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True


def read_settings_file(path: str, state_directory: str | None) -> dict[str, object]:
    """The settings file as a dict; ``{}`` when it does not exist. ``state_directory``: where
    the settings cache is (routes.cached_settings), None for none.

    Raises ``OSError`` when it exists but cannot be read and ``ValueError`` when
    it is not valid TOML; the caller turns both into a ConfigError.
    """
    return _read_settings(path, state_directory)[0]


def _read_settings(
    path: str, state_directory: str | None
) -> tuple[dict[str, object], tuple[int, ...] | None]:
    """:func:`read_settings_file`, and the identity of the file it read (None: absent)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {}, None
    key = _stat_key(st)
    if state_directory:
        cached = routes.cached_settings(state_directory, path, key)
        if cached is not None:
            return cached, key
    if st.st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    import tomllib  # ~10 ms: only on a cache miss

    with open(path, "rb") as f:
        data: dict[str, object] = tomllib.load(f)
    return data, key


LOG_LEVELS = ("debug", "info", "warning", "error")
#: How much of a bad value a problem message quotes.
_SHOWN_CHARS = 80


def _show(value: object) -> str:
    """``repr(value)``, cut short: a value can be 2000 lists deep or 1 MiB long.

    repr of a deeply nested list raises RecursionError, and an int of thousands
    of digits raises ValueError (sys.int_info's conversion limit): neither may
    escape while a problem is only being described.
    """
    try:
        shown = repr(value)
    except (RecursionError, ValueError):
        shown = f"<{type(value).__name__} too large to show>"
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 3] + "..."


def _reason(exc: BaseException) -> str:
    """An exception's message for a problem line, cut short; its type when it has none."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 4 * _SHOWN_CHARS else text[: 4 * _SHOWN_CHARS - 3] + "..."



class Settings(Value):
    """Effective settings and where they came from; build with :func:`load`, pass down explicitly."""

    __slots__ = (
        "cache_dir",
        "config_file",
        "container_cgroup_patterns",
        "delete_timeout",
        "finish_window",
        "journal_socket",
        "kill_stragglers",
        "log_file",
        "log_level",
        "pending_dir",
        "poll_interval",
        "problems",
        "reporter_linger",
        "routing_from_last_good",
        "routing_problem",
        "runtime",
        "runtimes",
        "source",
        "stats_file",
    )
    #: The keys of the file (and of RUNC_GUARD_<KEY>); the rest says where they came from.
    _compared = (
        "container_cgroup_patterns", "delete_timeout", "finish_window", "journal_socket", "kill_stragglers",
        "log_file",
        "log_level", "pending_dir", "poll_interval", "reporter_linger", "runtime", "runtimes", "stats_file",
    )
    runtime: str
    #: Invocation name (a ``runc-guard-nvidia`` symlink) -> runtime; wins over ``runtime``.
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
    #: How long the finisher keeps completing what deadlines cut short (0: never started).
    finish_window: float
    #: The settings file (RUNC_GUARD_CONFIG) and the cache beside it (RUNC_GUARD_CACHE_DIR).
    config_file: str
    cache_dir: str
    source: str
    #: Every problem found, each naming its key; none of them changed an outcome.
    problems: tuple[str, ...]
    #: Why the file's routing (runtime, [runtimes]) could not be used as written, if so.
    routing_problem: str | None
    #: ... and then it came from the last version of the file that parsed.
    routing_from_last_good: bool

    def __init__(
        self,
        runtime: str = DEFAULT_RUNTIME,
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
        finish_window: float = DEFAULT_FINISH_WINDOW,
        config_file: str = DEFAULT_CONFIG,
        cache_dir: str = DEFAULT_CACHE_DIR,
        source: str = "(defaults)",
        problems: tuple[str, ...] = (),
        routing_problem: str | None = None,
        routing_from_last_good: bool = False,
    ) -> None:
        runtimes = {} if runtimes is None else runtimes
        self._init(locals())

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self._compared}

    def runtime_for(self, invoked_as: str) -> str:
        """The runtime this call fronts: ``[runtimes]`` by the name we were invoked as, else ``runtime``."""
        return self.runtimes.get(invoked_as) or self.runtime


_KEYS = frozenset(Settings._compared)
#: The names runc-guard may be invoked as when its routing cannot be trusted: the default runtime.
DEFAULT_NAMES = frozenset({"runc-guard", DEFAULT_RUNTIME})


def is_default_name(invoked_as: str) -> bool:
    """A name that fronts the default ``runtime``: runc-guard's own (``runc-guard.pyz`` too) or ``runc``.

    Any other name is a handler's link (``runc-guard-nvidia``) and must be mapped
    in ``[runtimes]``: falling back to the default would start GPU pods on plain runc.
    """
    return invoked_as in DEFAULT_NAMES or invoked_as.partition(".")[0] == "runc-guard"


def unmapped_problem(settings: Settings, invoked_as: str) -> str | None:
    """Why a call under ``invoked_as`` has no runtime of its own, or None when it has one."""
    if invoked_as in settings.runtimes or is_default_name(invoked_as):
        return None
    return (
        f"invoked as {invoked_as!r}, which [runtimes] in {settings.config_file} does not map:"
        f" refusing to run the default runtime {settings.runtime!r} in its place"
    )


def _to_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {_show(value)}")


def _to_seconds(key: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{key}: expected a number of seconds, got {_show(value)}")
    try:
        seconds = float(value)
    except (ValueError, OverflowError):  # OverflowError: an integer beyond a double (1 and 320 zeros)
        raise ConfigError(f"{key}: expected a number of seconds within range, got {_show(value)}") from None
    if seconds - seconds != 0.0 or not low <= seconds <= high:  # nan or inf (no math import)
        raise ConfigError(f"{key}: {seconds:g} s is outside {low:g}..{high:g} s")
    return seconds


def _to_path(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        raise ConfigError(f"{key}: expected an absolute path, got {_show(value)}")
    return os.path.normpath(value)


def _to_runtimes(value: object) -> dict[str, str]:
    if isinstance(value, str):  # RUNC_GUARD_RUNTIMES="nvidia-runc-guard=nvidia-container-runtime,..."
        pairs = [item.split("=", 1) for item in value.split(",") if item]
        if any(len(p) != 2 for p in pairs):
            raise ConfigError(f"runtimes: expected name=runtime[,name=runtime], got {_show(value)}")
        value = dict(pairs)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()
    ):
        raise ConfigError(f'runtimes: expected a table of name = "runtime", got {_show(value)}')
    return dict(value)


def _to_patterns(value: object) -> tuple[str, ...]:
    if isinstance(value, str):  # RUNC_GUARD_CONTAINER_CGROUP_PATTERNS="a-{id},b-{id}.scope"
        value = [item for item in value.split(",") if item]
    if not isinstance(value, list) or not all(
        isinstance(p, str) and "{id}" in p and "/" not in p for p in value
    ):
        raise ConfigError(
            "container_cgroup_patterns: expected a list of names with {id},"
            f' like ["ctr-{{id}}"], got {_show(value)}'
        )
    return tuple(value)


def _convert(key: str, value: object) -> object:
    if key in ("delete_timeout",):
        return _to_seconds(key, value, 0.0, MAX_DELETE_TIMEOUT)
    if key == "poll_interval":
        return _to_seconds(key, value, 0.001, 5.0)
    if key == "reporter_linger":
        return _to_seconds(key, value, 0.0, 60.0)
    if key == "finish_window":
        return _to_seconds(key, value, 0.0, MAX_FINISH_WINDOW)
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
            raise ConfigError(f"log_level: expected one of {', '.join(LOG_LEVELS)}, got {_show(value)}")
        return value.lower()
    if key == "runtime":
        if not isinstance(value, str) or not value or "\0" in value:
            raise ConfigError(f"runtime: expected a command name or path, got {_show(value)}")
        return value
    raise AssertionError(key)


def _validated(
    raw: Mapping[str, object], environ: Mapping[str, str], source: str
) -> tuple[dict[str, object], list[tuple[str, str]]]:
    """Every valid key of ``raw``, then of RUNC_GUARD_<KEY>; every problem as (key, message)."""
    problems = [(key, f"{source}: unknown setting {_show(key)}") for key in sorted(set(raw) - _KEYS)]
    values: dict[str, object] = {}
    for key, value in raw.items():
        if key in _KEYS:
            try:
                values[key] = _convert(key, value)
            except ConfigError as exc:
                problems.append((key, f"{source}: {exc}"))
    for key in Settings._compared:
        env_value = environ.get(f"RUNC_GUARD_{key.upper()}")
        if env_value is not None and env_value != "":
            try:
                values[key] = _convert(key, env_value)
            except ConfigError as exc:
                problems.append((key, f"RUNC_GUARD_{key.upper()}: {exc}"))
    return values, problems


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings this process runs with: every valid key applied, every problem listed.

    Never raises: settings are untrusted input read on every runtime call, and a
    traceback here would fail ``create`` and ``start`` too. Anything unforeseen
    (a parser's RecursionError, MemoryError) leaves the defaults, with the
    routing treated as broken (only the default names route) and the problem listed.
    """
    env = os.environ if environ is None else environ
    try:
        return _load(env)
    except Exception as exc:  # noqa: BLE001 - see above: the defaults, and the problem, instead
        path = config_path(env)
        problem = f"cannot use settings file {path}: {type(exc).__name__}: {_reason(exc)}"
        return Settings(
            config_file=path,
            cache_dir=cache_dir(env),
            source=f"{path} (unusable: defaults)",
            problems=(problem,),
            routing_problem=problem,
        )


def _load(env: Mapping[str, str]) -> Settings:
    """:func:`load` proper: every valid key applied, every problem listed.

    What the shim, the delete path and the reporting tools use. An invalid key
    keeps its default. Routing is the exception, since a default could send a
    GPU pod's call to plain runc: when the file cannot be read or its
    ``runtime``/``[runtimes]`` are invalid, routing comes from the last version
    of the file that parsed (``routing_from_last_good``); with none, only the
    default names may be routed (``routing_problem`` says why).
    """
    path, cache, state = config_path(env), cache_dir(env), state_dir(env)
    try:
        raw, identity = _read_settings(path, state)
        read_problem = None
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: arrays nested ~1000 deep
        raw, identity, read_problem = {}, None, f"cannot use settings file {path}: {_reason(exc)}"
    values, found = _validated(raw, env, path)
    routing_problem = read_problem or next((m for k, m in found if k in ROUTING_KEYS), None)
    if identity is not None and routing_problem is None:
        _keep_routes(state, path, identity, raw)
    from_last_good = False
    if routing_problem is not None:
        for key in ROUTING_KEYS:
            values.pop(key, None)
        last = routes.last_good(state, path) or _previous_last_good(cache, path)
        if last is not None:
            kept, _ = _validated({k: v for k, v in last.items() if k in ROUTING_KEYS}, env, path)
            values.update({k: v for k, v in kept.items() if k in ROUTING_KEYS})
            from_last_good = True
        else:  # RUNC_GUARD_RUNTIME(S) still apply: they are no part of the broken file
            env_only, _ = _validated({}, env, path)
            values.update({k: v for k, v in env_only.items() if k in ROUTING_KEYS})
    problems = ([read_problem] if read_problem else []) + [m for _k, m in found]
    if routing_problem is not None and from_last_good:
        noted = routing_problem + "; routing by its last good version"
        problems = [noted if m == routing_problem else m for m in problems]
        routing_problem = noted
    source = path if os.path.exists(path) else f"{path} (absent: defaults)"
    return Settings(
        **values,  # type: ignore[arg-type]
        config_file=path,
        cache_dir=cache,
        source=source,
        problems=tuple(problems),
        routing_problem=routing_problem,
        routing_from_last_good=from_last_good,
    )


def _previous_last_good(cache: str, path: str) -> dict[str, object] | None:
    """The last good routing as runc-guard kept it before the launcher: ``<cache>/routing<path>.last-good``.

    A node upgraded while its settings file is broken has no persistent copy yet;
    the one in /run (until the next reboot) still knows where its calls went, so
    the upgrade does not turn every call into exit 78. ``marshal`` of a file that
    is ours and writable by nobody else only (read_trusted), as the old writer wrote it:
    read, never written any more.
    """
    import marshal

    blob = read_trusted(os.path.join(cache, "routing" + path.replace("/", "%") + ".last-good"), 1 << 20)
    if blob is None:
        return None
    try:
        kept_path, routing = marshal.loads(blob)
    except (ValueError, EOFError, TypeError):
        return None
    if kept_path != path or not isinstance(routing, dict):
        return None
    runtime, table = routing.get("runtime", DEFAULT_RUNTIME), routing.get("runtimes", {})
    if not isinstance(runtime, str) or not runtime or not isinstance(table, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in table.items()):
        return None
    return {"runtime": runtime, "runtimes": dict(table)}


_DEFAULTS = Settings()


def _keep_routes(state: str, path: str, identity: tuple[int, ...], raw: Mapping[str, object]) -> None:
    """Write the settings cache from the file alone: its routing for the launcher (RUNC_GUARD_*
    never goes in it: the launcher hands calls with routing variables to the Python entry) and
    the parsed file for the next Python process."""
    own, found = _validated(raw, {}, path)
    if any(k in ROUTING_KEYS for k, _m in found):
        return
    blob = routes.render(
        path,
        identity,
        str(own.get("runtime", DEFAULT_RUNTIME)),
        own.get("runtimes", {}),  # type: ignore[arg-type]
        str(own.get("pending_dir", DEFAULT_PENDING_DIR)),
        own.get("log_level") == "debug",
        {key: own.get(key, getattr(_DEFAULTS, key)) for key in routes.ADMISSION_KEYS},
        raw,
    )
    if blob is not None:
        routes.keep(state, path, blob)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Like :func:`load`, but the first problem raises ConfigError (exit 78).

    For runc-guardctl's commands that act (sweep, configure), which must refuse
    to act on settings they cannot honour.
    """
    settings = load(environ)
    if settings.problems:
        raise ConfigError("; ".join(settings.problems))
    return settings
