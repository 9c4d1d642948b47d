"""Pure parsing of a runc command line: which subcommand, which global flags, which container.

This module is on the hot path of every runtime call, so it imports nothing and
builds no dataclass (``dataclasses`` alone costs ~6 ms, most of a bare interpreter
start). It never changes argv: the runtime always receives the original list.

runc 1.1 parses its global flags with Go's ``flag`` package (via urfave/cli v1):
``-x`` and ``--x`` are the same flag, ``--x=v`` and ``--x v`` both give a value,
boolean flags never consume the next word, and parsing stops at the first word
that is not a flag (the subcommand) or at ``--``. So ``--log delete delete c1``
is ``delete`` of ``c1`` with ``--log`` set to ``delete``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

#: Global flags that take a value (``--root X`` / ``--root=X``).
VALUE_FLAGS = frozenset({"root", "log", "log-format", "criu", "rootless"})
#: Global flags that are booleans (``--debug`` / ``--debug=false``).
BOOL_FLAGS = frozenset({"debug", "systemd-cgroup", "help", "h", "version", "v"})

#: Global flags urfave/cli acts on before any subcommand runs: runc prints its help or
#: version and exits 0, so ``runc --version delete x`` deletes nothing.
HELP_VERSION_FLAGS = ("help", "h", "version", "v")
#: strconv.ParseBool's false spellings; anything else set on those flags is not "off".
_FALSE = frozenset({"0", "f", "F", "false", "FALSE", "False"})
#: strconv.ParseBool's true spellings: runc refuses ``--force=tRue``, so it is no delete of ours.
_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})

#: runc's default state root when ``--root`` is absent (runc 1.1 main.go, as root).
DEFAULT_ROOT = "/run/runc"

_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+,-.")
#: Longest id we act on. runc has no limit, but an id is a file name in the state
#: root (NAME_MAX 255); longer ids cannot have state, so runc would reject them.
MAX_ID_LEN = 255


class Invocation:
    """What a runc command line asks for; immutable once built.

    ``globals`` maps flag names (without dashes) to their last value, as Go's
    ``flag`` package keeps the last occurrence. ``container_id`` is set only for
    ``delete`` with exactly one valid id, the only case runc-guard acts on.
    """

    __slots__ = ("args", "container_id", "force", "globals", "subcommand")

    globals: dict[str, str]
    subcommand: str | None
    args: tuple[str, ...]
    container_id: str | None
    force: bool

    def __init__(
        self,
        globals_: dict[str, str],
        subcommand: str | None,
        args: tuple[str, ...],
        container_id: str | None = None,
        force: bool = False,
    ) -> None:
        object.__setattr__(self, "globals", globals_)
        object.__setattr__(self, "subcommand", subcommand)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "container_id", container_id)
        object.__setattr__(self, "force", force)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Invocation is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Invocation):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.globals.items())), *self._key()[1:]))

    def __repr__(self) -> str:
        return (
            f"Invocation(globals={self.globals!r}, subcommand={self.subcommand!r}, "
            f"args={self.args!r}, container_id={self.container_id!r}, force={self.force!r})"
        )

    def _key(self) -> tuple[object, ...]:
        return (self.globals, self.subcommand, self.args, self.container_id, self.force)

    @property
    def root(self) -> str:
        """The runtime's state root, as runc resolves it."""
        return self.globals.get("root") or DEFAULT_ROOT

    @property
    def log_path(self) -> str | None:
        return self.globals.get("log") or None

    @property
    def log_format(self) -> str:
        return self.globals.get("log-format") or "text"

    @property
    def is_delete(self) -> bool:
        """True when runc-guard must interpose: a ``delete`` of exactly one valid id.

        Not when ``-h/--help/-v/--version`` stands before the subcommand: runc
        then only prints and exits, and so must runc-guard (pure passthrough).
        """
        if self.subcommand != "delete" or self.container_id is None:
            return False
        return all(self.globals.get(flag, "false") in _FALSE for flag in HELP_VERSION_FLAGS)

    @property
    def systemd_cgroup(self) -> bool:
        return self.globals.get("systemd-cgroup", "false") not in _FALSE

    def global_args(self, *, with_log: bool = True) -> list[str]:
        """Global flags to repeat on another runtime call for the same state root.

        Rebuilt from the parsed values (``--root``, ``--systemd-cgroup``, ``--log``...),
        in runc's ``--name=value`` form so no value can be taken for a subcommand.
        """
        out = []
        for name in ("root", "log", "log-format", "rootless", "criu", "systemd-cgroup", "debug"):
            if name in self.globals and (with_log or name not in ("log", "log-format")):
                out.append(f"--{name}={self.globals[name]}")
        return out


def _split_flag(word: str) -> tuple[str, str | None] | None:
    """``--root=x`` -> ("root", "x"); ``-debug`` -> ("debug", None); non-flags -> None."""
    if len(word) < 2 or word[0] != "-" or word == "--":
        return None
    name = word[2:] if word.startswith("--") else word[1:]
    if not name or name[0] == "-":
        return None
    if "=" in name:
        key, value = name.split("=", 1)
        return key, value
    return name, None


def parse(argv: Sequence[str]) -> Invocation:
    """Parse ``argv`` (without argv[0]) the way runc 1.1 does.

    Unknown global flags make the whole line opaque (subcommand ``None``): runc
    will reject it, and runc-guard must not guess what it meant.
    """
    globals_: dict[str, str] = {}
    i = 0
    n = len(argv)
    while i < n:
        word = argv[i]
        if word == "--":
            i += 1
            break
        split = _split_flag(word)
        if split is None:
            break
        name, value = split
        if name in BOOL_FLAGS:
            globals_[name] = "true" if value is None else value
            i += 1
        elif name in VALUE_FLAGS:
            if value is None:
                if i + 1 >= n:
                    return Invocation(globals_, None, tuple(argv[i:]))
                value = argv[i + 1]
                i += 2
            else:
                i += 1
            globals_[name] = value
        else:
            return Invocation(globals_, None, tuple(argv[i:]))
    if i >= n:
        return Invocation(globals_, None, ())
    subcommand = argv[i]
    args = tuple(argv[i + 1 :])
    if subcommand != "delete":
        return Invocation(globals_, subcommand, args)
    container_id, force = _parse_delete_args(args)
    return Invocation(globals_, subcommand, args, container_id, force)


def _parse_delete_args(args: Sequence[str]) -> tuple[str | None, bool]:
    """Container id and ``--force`` of ``runc delete``; id None unless runc would accept it.

    urfave/cli v1 reorders flags before positionals, so ``delete c1 --force`` works;
    runc then requires exactly one argument.
    """
    force = False
    positionals: list[str] = []
    flags_done = False
    for word in args:
        split = None if flags_done else _split_flag(word)
        if word == "--" and not flags_done:
            flags_done = True
            continue
        if split is None:
            positionals.append(word)
            continue
        name, value = split
        if name in ("force", "f"):
            if value is None or value in _TRUE:
                force = True
            elif value in _FALSE:
                force = False
            else:
                return None, False
        else:
            # --help or an unknown flag: runc prints help or refuses; nothing to do.
            return None, False
    if len(positionals) != 1 or not valid_container_id(positionals[0]):
        return None, force
    return positionals[0], force


def valid_container_id(container_id: str) -> bool:
    """runc's own rule (libcontainer validateID): ``^[\\w+-\\.]+$`` in ASCII, not ``.``/``..``.

    In that Go regex ``+-\\.`` is the range ``+`` ... ``.``, i.e. ``+ , - .``.
    An id that fails this is one runc refuses, so runc-guard never builds a path from it.
    """
    if not container_id or len(container_id) > MAX_ID_LEN:
        return False
    if container_id in (".", ".."):
        return False
    return all(c in _ID_CHARS for c in container_id)
