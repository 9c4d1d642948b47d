/*
 * runc-guard launcher: the binary containerd runs as its runtime BinaryName.
 *
 * Every runtime call of every container passes through here (each `runc exec` of an
 * exec probe, every `state`, `create`, `start`, `kill`), so this program routes and
 * execs, at the cost of one execve, and does one more thing only for a delete:
 *
 *   - any call but an interposed delete: execve of the real runtime, with the same
 *     argv[1:], the environment byte for byte, the fds, and the signal dispositions and
 *     mask it inherited (this file never touches either; everything it opens is
 *     O_CLOEXEC);
 *   - `delete` of a container nobody knows (no <root>/<id>/state.json, no
 *     <root>/<id>/status, no pending record): the runtime, directly;
 *   - `delete` of a known container: the start-up admission of runc_guard/shim/entry.py
 *     _startup_slot (a delete slot, containerd's budget). Admitted: execve of the Python
 *     entry with the slot handed over. Not admitted (a crash storm): step aside at C's
 *     cost -- one line for Python (runc_guard/delete/stepaside.py) in the spool, the detached
 *     reporter (and finisher) started once per storm, which turn that line into the
 *     aside record, the journal entry and the report -- then execve of the runtime alone;
 *   - everything this file cannot trust: execve of the Python entry (runc-guard.py), the
 *     source of truth, which routes, reports and rewrites the routing cache.
 *
 * The runtime comes from the routing cache the Python side writes when it loads the
 * settings (runc_guard/routes.py: the format, and why each check exists), bound to the
 * settings file's identity (dev, ino, size, mtime_ns, ctime_ns: ctime cannot be set from
 * user space, so an edit always misses). The cases the launcher does not trust are the
 * table of docs/launcher.md; each is a test of tests/test_launcher.py.
 *
 * The Python entry learns the invoked name and this binary's path from one variable put
 * in front of its environment, RUNC_GUARD_HANDOVER=<invoked name>/<path of this binary>
 * (first, because CPython's os.environ keeps the first of two equal names: a caller's own
 * variable of that name comes after it and reaches the runtime); the entry removes it
 * before the runtime sees the environment. A line after it says what was decided here:
 * "admitted <slot fd> <origin ns> <caller>" or "helper" (shim/entry.py handed_over).
 *
 * Never writes to stdout. Exit codes, its own (runc_guard/errors.py), each with one
 * stderr line and a journal datagram (bail, the one fatal path):
 *   69 (EXIT_RUNTIME_UNAVAILABLE)  neither the runtime nor the Python entry could be
 *                                  executed for a call it could route;
 *   78 (EXIT_CONFIG)               it could not trust its routing and the Python entry
 *                                  could not be executed.
 * Anything else is the runtime's (or the Python entry's) own status.
 * Build: launcher/build.sh (one rule, used by every install path). libc only.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define EXIT_RUNTIME_UNAVAILABLE 69
#define EXIT_CONFIG 78

#define DEFAULT_CONFIG "/etc/runc-guard/config.toml"
#define DEFAULT_STATE_DIR "/var/lib/runc-guard"
#define DEFAULT_RUNTIME "runc"
#define DEFAULT_PENDING_DIR "/run/runc-guard/pending"
#define DEFAULT_CACHE_DIR "/run/runc-guard"
#define DEFAULT_ROOT "/run/runc"
#define DEFAULT_JOURNAL_SOCKET "/run/systemd/journal/socket"
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define ROUTES_HEADER "runc-guard-routes 2"
/* The step-aside's line for Python (runc_guard/delete/stepaside.py), in <spool>/<ns>-<pid>.aside. */
#define ASIDE_HEADER "runc-guard-aside 1"
#define ASIDE_SUFFIX ".aside"
/* The Python entry, relative to this binary's directory unless absolute. */
#ifndef PY_ENTRY
#define PY_ENTRY "runc-guard.py"
#endif
#define HANDOVER "RUNC_GUARD_HANDOVER="
/* runc-guard's own rule (invocation.py MAX_ID_LEN): longer ids cannot have state. */
#define MAX_ID_LEN 255
/* Larger than any routing a settings file (1 MiB at most) sensibly has. */
#define MAX_ROUTES 65536
#define MAX_NAMES 256
/* runc_guard/deadline.py */
#define MIN_BUDGET_SHARE 0.25
/* runc_guard/overload.py and shim/startup.py */
#define STORM_HOLD 5.0
#define STORM_MARK "storm"
#define COST_FILE "cost"
#define COST_MAX_MS 1000000
#define COST_SHARE (1.0 / 16)
/* runc_guard/delete/bounds.py CROWDED_DIR_BYTES: past it the Python writer prunes. */
#define CROWDED_DIR_BYTES (64 << 10)
#define FINISHER_LOCK "finisher.lock"
/* runc_guard/spool.py HELPER_NICE */
#define HELPER_NICE 19
#define TEXT_OF(x) #x
#define TEXT(x) TEXT_OF(x)
#define REPORTER_LOCK ".reporter.lock"

extern char **environ;

/* This call: its argv (argv[0] is rewritten for each exec), the name it was invoked by, and
 * this binary's path (/proc/self/exe; argv[0] until that is read). */
static struct {
	char **argv;
	const char *invoked;
	const char *self_path;
} call;

/* environ's value of `key` ("RUNC_GUARD_CONFIG=") or NULL; "" counts as unset, as in settings.py. */
static const char *env_value(const char *key)
{
	size_t n = strlen(key);

	for (char **e = environ; *e; e++)
		if (strncmp(*e, key, n) == 0)
			return (*e)[n] ? *e + n : NULL;
	return NULL;
}

/* The caller's environment with `first` put in front (the hand-over), or NULL (ENOMEM). */
static char **environment_with(const char *first)
{
	size_t count = 0;
	char **env;

	while (environ[count])
		count++;
	env = malloc((count + 2) * sizeof(*env));
	if (env == NULL)
		return NULL;
	env[0] = (char *)first;
	memcpy(env + 1, environ, count * sizeof(*env));
	env[count + 1] = NULL;
	return env;
}

/*
 * journal.send_minimal: one datagram to journald's socket, never waited for (a full or
 * absent journald loses the entry, never the call). MESSAGE is "<event>: <message>".
 */
static void journal_minimal(const char *socket_path, const char *event, const char *message, int priority)
{
	char msg[4096];
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	int fd, n = snprintf(msg, sizeof(msg),
			     "MESSAGE=%s: %s\nPRIORITY=%d\nSYSLOG_IDENTIFIER=runc-guard\nEVENT=%s\nRUNC_GUARD_PID=%d\n",
			     event, message, priority, event, (int)getpid());

	if (n < 0 || (size_t)n >= sizeof(msg) || strlen(socket_path) >= sizeof(addr.sun_path))
		return;
	strcpy(addr.sun_path, socket_path);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	/* EAGAIN (journald's queue full), ENOENT, ECONNREFUSED: reporting never changes the call */
	(void)sendto(fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&addr, sizeof(addr));
	close(fd);
}

/* The one fatal path: one line on stderr naming the program (and %m), the journal; then exit. */
__attribute__((noreturn, format(printf, 2, 3))) static void bail(int code, const char *fmt, ...)
{
	const char *socket_path = env_value("RUNC_GUARD_JOURNAL_SOCKET=");
	char line[1024] = "runc-guard: ", *why = line + 12;
	size_t room = sizeof(line) - 12 - 1, n;
	va_list ap;
	int len;

	va_start(ap, fmt);
	len = vsnprintf(why, room, fmt, ap);
	va_end(ap);
	n = len < 0 ? 0 : (size_t)len < room ? (size_t)len : room - 1;
	why[n] = '\0';
	journal_minimal(socket_path ? socket_path : DEFAULT_JOURNAL_SOCKET, "runtime_unavailable", why, 3);
	why[n] = '\n';
	if (write(STDERR_FILENO, line, 12 + n + 1) < 0)
		_exit(code); /* EBADF (stderr closed): the exit status is all that is left */
	_exit(code);
}

/* The Python entry's path: beside this binary unless PY_ENTRY is absolute. */
static int python_entry(char *out, size_t size)
{
	const char *slash = strrchr(call.self_path, '/');
	int n;

	if (PY_ENTRY[0] == '/' || slash == NULL)
		n = snprintf(out, size, "%s", PY_ENTRY);
	else
		n = snprintf(out, size, "%.*s/%s", (int)(slash - call.self_path), call.self_path, PY_ENTRY);
	return n >= 0 && (size_t)n < size ? 0 : -1;
}

/* RUNC_GUARD_HANDOVER=<invoked>/<self_path><tail> in buf; -1 when it does not fit. A newline
 * cannot end a path readlink gave us unnoticed: the entry splits the tail off at the last one. */
static int handover_of(char *buf, size_t size, const char *tail)
{
	int n = snprintf(buf, size, HANDOVER "%s/%s%s", call.invoked, call.self_path, tail);

	return n >= 0 && (size_t)n < size ? 0 : -1;
}

/*
 * Replace this process with the Python entry, the source of truth, for whatever the
 * launcher cannot do or trust (`why`, said only if the entry cannot be executed). `tail`:
 * "" for a plain hand-over, "\nadmitted ..." for an admitted delete. One allocation: the
 * environment is the caller's size, no stack buffer fits every one.
 */
__attribute__((noreturn)) static void to_python(int code, const char *why, const char *tail)
{
	char entry[PATH_MAX], handover[PATH_MAX + NAME_MAX + sizeof(HANDOVER) + 96], **env;

	if (python_entry(entry, sizeof(entry)) != 0)
		bail(code, "%s; the Python entry's path is too long", why);
	if (handover_of(handover, sizeof(handover), tail) != 0)
		bail(code, "%s; the invoked name is too long to hand over", why);
	env = environment_with(handover);
	if (env == NULL)
		bail(code, "%s; cannot start the Python entry: %m", why);
	call.argv[0] = entry;
	execve(entry, call.argv, env);
	bail(code, "%s; cannot exec the Python entry %s: %m", why, entry);
}

/*
 * Replace this process with the runtime: same pid, argv[1:], environment, fds, signal
 * dispositions and mask. One that cannot be exec'd the Python entry reports, in its words,
 * with its journal entry.
 */
__attribute__((noreturn)) static void exec_runtime(const char *path)
{
	call.argv[0] = (char *)path;
	execve(path, call.argv, environ);
	to_python(EXIT_RUNTIME_UNAVAILABLE, "cannot exec the runtime", "");
}

/* ---- the command line, exactly as runc_guard/invocation.py parses it ----------------------- */

struct invocation {
	const char *subcommand;   /* NULL: no subcommand, or a line runc-guard must not guess at */
	const char *container_id; /* delete with exactly one valid id, else NULL */
	const char *root;         /* --root's last value ("" when given empty) or NULL */
	int force;
	int is_delete;            /* invocation.py Invocation.is_delete: runc-guard interposes */
};

static const char *const value_flags[] = {"root", "log", "log-format", "criu", "rootless", NULL};
static const char *const bool_flags[] = {"debug", "systemd-cgroup", "help", "h", "version", "v", NULL};

/* Is the flag name [name, name+len) in the NULL-terminated list? */
static int in_list(const char *const *list, const char *name, size_t len)
{
	for (; *list; list++)
		if (strlen(*list) == len && memcmp(*list, name, len) == 0)
			return 1;
	return 0;
}

/* strconv.ParseBool's false spellings (invocation.py _FALSE). */
static int false_spelling(const char *v)
{
	static const char *const spellings[] = {"0", "f", "F", "false", "FALSE", "False", NULL};

	return in_list(spellings, v, strlen(v));
}

/* strconv.ParseBool's true spellings (invocation.py _TRUE): runc refuses "tRue", so must we. */
static int true_spelling(const char *v)
{
	static const char *const spellings[] = {"1", "t", "T", "true", "TRUE", "True", NULL};

	return in_list(spellings, v, strlen(v));
}

/*
 * invocation.py _split_flag: "--root=x" -> name "root", value "x"; "-debug" -> "debug",
 * no value; anything that is not a flag (a word, "-", "--", "---x") -> 0.
 */
static int split_flag(const char *word, const char **name, size_t *len, const char **value)
{
	const char *eq;

	if (word[0] != '-' || word[1] == '\0' || strcmp(word, "--") == 0)
		return 0;
	*name = word[1] == '-' ? word + 2 : word + 1;
	if (**name == '\0' || **name == '-')
		return 0;
	eq = strchr(*name, '=');
	*len = eq ? (size_t)(eq - *name) : strlen(*name);
	*value = eq ? eq + 1 : NULL;
	return 1;
}

/* libcontainer's validateID (invocation.py valid_container_id): [A-Za-z0-9_+,-.]+, not "." or "..". */
static int valid_container_id(const char *id)
{
	size_t n = strlen(id);

	if (n == 0 || n > MAX_ID_LEN || strcmp(id, ".") == 0 || strcmp(id, "..") == 0)
		return 0;
	for (; *id; id++) {
		char c = *id;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
		      c == '+' || c == ',' || c == '-' || c == '.'))
			return 0;
	}
	return 1;
}

/* invocation.py _parse_delete_args: the id and --force of `runc delete`. */
static void parse_delete_args(char *const *args, struct invocation *inv)
{
	const char *positional = NULL, *name, *value;
	int positionals = 0, flags_done = 0;
	size_t len;

	for (; *args; args++) {
		if (!flags_done && strcmp(*args, "--") == 0) {
			flags_done = 1;
			continue;
		}
		if (flags_done || !split_flag(*args, &name, &len, &value)) {
			positional = *args;
			positionals++;
			continue;
		}
		if ((len == 5 && memcmp(name, "force", 5) == 0) || (len == 1 && name[0] == 'f')) {
			if (value == NULL || true_spelling(value)) {
				inv->force = 1;
			} else if (false_spelling(value)) {
				inv->force = 0;
			} else {
				inv->force = 0;
				return;
			}
		} else {
			inv->force = 0; /* --help or an unknown flag: runc prints help or refuses */
			return;
		}
	}
	if (positionals == 1 && valid_container_id(positional))
		inv->container_id = positional;
}

/* invocation.py parse: global flags until the first word that is not one (or "--"), then the subcommand. */
static void parse(char *const *argv, struct invocation *inv)
{
	const char *name, *value;
	size_t len;
	int i = 0, help_or_version = 0;

	memset(inv, 0, sizeof(*inv));
	while (argv[i]) {
		if (strcmp(argv[i], "--") == 0) {
			i++;
			break;
		}
		if (!split_flag(argv[i], &name, &len, &value))
			break;
		if (in_list(bool_flags, name, len)) {
			/* -h/--help/-v/--version (the last four): runc prints and exits, deletes nothing */
			for (int k = 2; bool_flags[k]; k++)
				if (strlen(bool_flags[k]) == len && memcmp(bool_flags[k], name, len) == 0)
					help_or_version = value == NULL || !false_spelling(value) ?
						help_or_version | 1 << k : help_or_version & ~(1 << k);
			i++;
		} else if (in_list(value_flags, name, len)) {
			if (value == NULL) {
				if (argv[i + 1] == NULL)
					return; /* a value flag at the end: opaque */
				value = argv[i + 1];
				i += 2;
			} else {
				i++;
			}
			if (len == 4 && memcmp(name, "root", 4) == 0)
				inv->root = value;
		} else {
			return; /* an unknown global flag: runc rejects the line, runc-guard must not guess */
		}
	}
	if (argv[i] == NULL)
		return;
	inv->subcommand = argv[i];
	if (strcmp(argv[i], "delete") == 0)
		parse_delete_args(argv + i + 1, inv);
	inv->is_delete = inv->container_id != NULL && help_or_version == 0;
}

/* The runtime's state root, as runc resolves it (invocation.py Invocation.root). */
static const char *state_root(const struct invocation *inv)
{
	return inv->root && *inv->root ? inv->root : DEFAULT_ROOT;
}

/* ---- the routing cache (format: runc_guard/routes.py) ------------------------------------- */

struct routes {
	const char *runtime;
	const char *pending_dir;
	int debug;
	/* what the start-up admission of a delete reads: the file's own values */
	double timeout, finish_window, linger;
	int names;
	const char *name[MAX_NAMES];
	const char *name_runtime[MAX_NAMES];
};

/* Owned by the euid and writable by nobody else: only then may its bytes route a call. */
static int trusted(const struct stat *st)
{
	return st->st_uid == geteuid() && !(st->st_mode & 022);
}

/* The next '\n'-terminated line of [*cur, end) as a C string, or NULL at a truncated end. */
static char *next_line(char **cur, char *end)
{
	char *line = *cur, *nl = memchr(line, '\n', (size_t)(end - line));

	if (nl == NULL)
		return NULL;
	*nl = '\0';
	*cur = nl + 1;
	return line;
}

/* "key\tvalue" -> value, when the line's key is `key` and the value is not empty. */
static char *field(char *line, const char *key)
{
	size_t n = strlen(key);

	if (line == NULL || strncmp(line, key, n) != 0 || line[n] != '\t' || line[n + 1] == '\0')
		return NULL;
	return line + n + 1;
}

/* A float the Python side wrote (repr), finite and >= 0, that is the whole word; or -1. */
static int parse_seconds(const char *s, double *out)
{
	char *end;

	if (s == NULL || *s < '0' || *s > '9')
		return -1;
	errno = 0;
	*out = strtod(s, &end);
	return errno == 0 && *end == '\0' && *out >= 0 && *out < 1e9 ? 0 : -1;
}

/* The file line: "file\t<dev> <ino> <size> <mtime_ns> <ctime_ns>" equal to `st`? (routes.py
 * writes it in an owner-only file: a loose spelling can only miss, never match another file.) */
static int same_identity(const char *value, const struct stat *st)
{
	unsigned long long want[5];
	int end = 0;

#define NS(t) ((unsigned long long)(t).tv_sec * 1000000000ULL + (unsigned long long)(t).tv_nsec)
	return sscanf(value, "%llu %llu %llu %llu %llu%n", &want[0], &want[1], &want[2], &want[3], &want[4],
		      &end) == 5 && value[end] == '\0' && want[0] == (unsigned long long)st->st_dev &&
	       want[1] == (unsigned long long)st->st_ino && want[2] == (unsigned long long)st->st_size &&
	       want[3] == NS(st->st_mtim) && want[4] == NS(st->st_ctim);
#undef NS
}

/*
 * The whole of `name` (relative to `dirfd`) into buf, NUL-terminated: its length, or -1 when it
 * cannot be opened or read, or may be cut (it filled buf). `ours`: only a regular file, never
 * through a symlink, that is trusted -- what may route or admit a call.
 */
static ssize_t read_file(int dirfd, const char *name, int ours, char *buf, size_t size)
{
	struct stat st;
	size_t total = 0;
	ssize_t got = 0;
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | (ours ? O_NOFOLLOW : 0));

	if (fd < 0) /* ENOENT; ELOOP: a symlink is never ours */
		return -1;
	if (ours && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !trusted(&st)))
		got = -1;
	while (got >= 0 && total < size - 1 && (got = read(fd, buf + total, size - 1 - total)) != 0) {
		if (got > 0)
			total += (size_t)got;
		else if (errno == EINTR)
			got = 0;
	}
	close(fd);
	if (got < 0 || total == size - 1)
		return -1;
	buf[total] = '\0';
	return (ssize_t)total;
}

/*
 * Read and check the routing cache for settings file `config` (stat'ed as `st`) into `r`.
 * 0: trusted; -1: anything else (the caller hands the call to the Python entry).
 * `buf` holds the strings `r` points into.
 */
static int read_routes(const char *state_dir, const char *config, const struct stat *st, char *buf,
		       size_t size, struct routes *r)
{
	char name[NAME_MAX + 1], *cur = buf, *end, *line, *v, *tab;
	struct stat dst;
	ssize_t total;
	int dfd, n;

	n = snprintf(name, sizeof(name), "routes%s", config);
	if (n < 0 || (size_t)n >= sizeof(name))
		return -1;
	for (char *p = name; *p; p++)
		if (*p == '/')
			*p = '%';
	dfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) /* ENOENT: never written (a fresh node, a wiped /var/lib) */
		return -1;
	total = fstat(dfd, &dst) == 0 && trusted(&dst) ? read_file(dfd, name, 1, buf, size) : -1;
	close(dfd);
	if (total <= 0 || strlen(buf) != (size_t)total)
		return -1; /* unreadable, empty, over-long, or not text */
	end = buf + total;
	memset(r, 0, sizeof(*r));
	line = next_line(&cur, end);
	if (line == NULL || strcmp(line, ROUTES_HEADER) != 0)
		return -1; /* another version: only the Python entry knows what it means */
	v = field(next_line(&cur, end), "config");
	if (v == NULL || strcmp(v, config) != 0)
		return -1;
	v = field(next_line(&cur, end), "file");
	if (v == NULL || !same_identity(v, st))
		return -1;
	r->runtime = field(next_line(&cur, end), "runtime");
	r->pending_dir = field(next_line(&cur, end), "pending");
	v = field(next_line(&cur, end), "debug");
	if (r->runtime == NULL || r->pending_dir == NULL || v == NULL || (strcmp(v, "0") && strcmp(v, "1")))
		return -1;
	r->debug = v[0] == '1';
	if (parse_seconds(field(next_line(&cur, end), "timeout"), &r->timeout) != 0 ||
	    parse_seconds(field(next_line(&cur, end), "finish"), &r->finish_window) != 0 ||
	    parse_seconds(field(next_line(&cur, end), "linger"), &r->linger) != 0)
		return -1;
	/* the entries' sink: Python's to use (delete/stepaside.py), here only checked for */
	if (field(next_line(&cur, end), "journal") == NULL || field(next_line(&cur, end), "logfile") == NULL)
		return -1;
	while ((line = next_line(&cur, end)) != NULL && strcmp(line, "end") != 0) {
		if (field(line, "settings") != NULL)
			continue; /* the Python side's cache of the parsed file */
		v = field(line, "name");
		tab = v ? strchr(v, '\t') : NULL;
		if (tab == NULL || tab == v || tab[1] == '\0' || r->names == MAX_NAMES)
			return -1;
		*tab = '\0';
		r->name[r->names] = v;
		r->name_runtime[r->names++] = tab + 1;
	}
	return line != NULL && cur == end ? 0 : -1; /* "end" must be the last line: not truncated */
}

/* settings.py is_default_name: runc-guard's own names (runc-guard.pyz too) and runc. */
static int default_name(const char *name)
{
	size_t stem = strcspn(name, ".");

	return strcmp(name, DEFAULT_RUNTIME) == 0 || (stem == 10 && strncmp(name, "runc-guard", 10) == 0);
}

/* The runtime this call fronts (Settings.runtime_for), or NULL when the name is not mapped. */
static const char *runtime_for(const struct routes *r, const char *invoked)
{
	for (int i = 0; i < r->names; i++)
		if (strcmp(r->name[i], invoked) == 0)
			return r->name_runtime[i];
	return default_name(invoked) ? r->runtime : NULL;
}

/* ---- the settings' environment variables (settings.py: a variable wins over the file) ---- */

/*
 * Is RUNC_GUARD_<name> set ("" included) for a name in `names`, or, with `names` NULL, for any
 * name but the three that locate the files? The launcher parses no such value: where one may
 * bear on the call, the Python entry, which parses them, decides.
 */
static int settings_variable(const char *const *names)
{
	static const char *const located[] = {"CONFIG", "STATE_DIR", "CACHE_DIR", NULL};
	const char *name, *eq;

	for (char **e = environ; *e; e++) {
		if (strncmp(*e, "RUNC_GUARD_", 11) != 0 || (eq = strchr(*e, '=')) == NULL)
			continue;
		name = *e + 11;
		if (names ? in_list(names, name, (size_t)(eq - name)) : !in_list(located, name, (size_t)(eq - name)))
			return 1;
	}
	return 0;
}

/* ---- the runtime, found like runc_guard/runtime.py resolve_runtime ------------------------- */

/* A regular file we may execute (runtime.py _usable); its identity in `st`. */
static int usable(const char *path, struct stat *st)
{
	return stat(path, st) == 0 && S_ISREG(st->st_mode) && access(path, X_OK) == 0;
}

/*
 * The runtime's path in `out`, never runc-guard itself (`self`, by device and inode): an
 * install that shadows `runc` on PATH must still reach the real one. -1: not found, or a
 * loop; the Python entry then says which, in its words, with its journal entry.
 */
static int resolve_runtime(const char *runtime, const struct stat *self, char *out, size_t size)
{
	const char *path, *dir, *colon;
	struct stat st;
	size_t dlen;
	int n;

	if (strchr(runtime, '/')) {
		if (!usable(runtime, &st) || (st.st_dev == self->st_dev && st.st_ino == self->st_ino))
			return -1;
		n = snprintf(out, size, "%s", runtime);
		return n >= 0 && (size_t)n < size ? 0 : -1;
	}
	path = env_value("PATH=");
	for (dir = path ? path : DEFAULT_PATH;; dir = colon + 1) {
		colon = strchr(dir, ':');
		dlen = colon ? (size_t)(colon - dir) : strlen(dir);
		if (dlen == 0) /* os.path.join(directory or ".", name) */
			n = snprintf(out, size, "./%s", runtime);
		else
			n = snprintf(out, size, "%.*s%s%s", (int)dlen, dir, dir[dlen - 1] == '/' ? "" : "/", runtime);
		if (n >= 0 && (size_t)n < size && usable(out, &st) &&
		    !(st.st_dev == self->st_dev && st.st_ino == self->st_ino))
			return out[0] == '/' ? 0 : -1; /* relative: Go's ErrDot; the Python entry says so */
		if (colon == NULL)
			return -1;
	}
}

/* ---- who knows the container (shim/entry.py _known_to_anyone) ---------------------------- */

/* Does `<dir>/<id><suffix>` exist (os.path.exists: stat follows links)? */
static int exists_in(const char *dir, const char *id, const char *suffix)
{
	char path[PATH_MAX];
	struct stat st;
	int n = snprintf(path, sizeof(path), "%s/%s%s", dir, id, suffix);

	return n < 0 || (size_t)n >= sizeof(path) || stat(path, &st) == 0;
}

/*
 * A pending record of this id under any runtime root (`<id>@<root hash>.json`, delete/
 * pending.py record_path): wider than the Python check, which hashes the root, and so never
 * misses one. A directory it cannot read counts as a record: the Python entry decides then.
 */
static int pending_record(const char *pending_dir, const char *id)
{
	size_t n = strlen(id);
	struct dirent *d;
	DIR *dir;
	int found = 0, fd = open(pending_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return errno != ENOENT; /* ENOENT: no delete kept a record yet */
	dir = fdopendir(fd);
	if (dir == NULL) {
		close(fd);
		return 1;
	}
	while (!found && (d = readdir(dir)) != NULL)
		found = strncmp(d->d_name, id, n) == 0 && d->d_name[n] == '@';
	closedir(dir);
	return found;
}

/* Does the runtime or a pending record know this container? Cheap stats only. */
static int known_to_anyone(const struct invocation *inv, const struct routes *r)
{
	const char *root = state_root(inv);

	return exists_in(root, inv->container_id, "/state.json") || exists_in(root, inv->container_id, "/status") ||
	       r->debug || pending_record(r->pending_dir, inv->container_id);
}

/* ---- the budget's origin and the caller (runc_guard/procinfo.py delete_caller) ------------ */

static double clock_s(clockid_t id)
{
	struct timespec ts;

	if (clock_gettime(id, &ts) != 0)
		return -1;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The start time (clock ticks since boot) of /proc/<pid>/stat: field 22, the 20th after the ")". */
static int start_ticks(const char *pid, unsigned long long *out)
{
	char path[64], buf[4096], *p;

	snprintf(path, sizeof(path), "/proc/%s/stat", pid);
	if (read_file(AT_FDCWD, path, 0, buf, sizeof(buf)) < 0 || (p = strrchr(buf, ')')) == NULL)
		return -1;
	return sscanf(p + 1, "%*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
		      out) == 1 ? 0 : -1;
}

/* procinfo.started_monotonic: when `pid` started, on CLOCK_MONOTONIC; -1 when unreadable. */
static double started_monotonic(const char *pid)
{
	unsigned long long start;
	long ticks = sysconf(_SC_CLK_TCK);
	double age, boot = clock_s(CLOCK_BOOTTIME), mono = clock_s(CLOCK_MONOTONIC);

	if (ticks <= 0 || boot < 0 || mono < 0 || start_ticks(pid, &start) != 0)
		return -1;
	age = boot - (double)start / (double)ticks;
	return mono - (age > 0 ? age : 0);
}

/* procinfo.shim_role of a command line (NUL-separated words, empty ones dropped). */
static const char *shim_role(char *cmdline, size_t len)
{
	const char *args[512], *base;
	size_t n = 0, i = 0;

	while (i < len && n < sizeof(args) / sizeof(*args)) {
		if (cmdline[i])
			args[n++] = cmdline + i;
		i += strlen(cmdline + i) + 1;
	}
	if (i < len || n < 2)
		return "unknown"; /* more words than we hold, or too few: not a shim's line */
	base = strrchr(args[0], '/') ? strrchr(args[0], '/') + 1 : args[0];
	if (strncmp(base, "containerd-shim", 15) != 0)
		return "unknown";
	if (strcmp(args[n - 1], "delete") == 0)
		return "dead_shim";
	if (strncmp(base, "containerd-shim-runc-v", 22) != 0)
		return "unknown";
	for (i = 0; i < n; i++)
		if (strcmp(args[i], "-id") == 0)
			return strcmp(args[n - 1], "start") == 0 ? "unknown" : "serving_shim";
	return "unknown";
}

/* procinfo.delete_caller: (role, origin); origin -1 when even our own start is unreadable. */
static const char *delete_caller(double *origin)
{
	static char cmdline[65536];
	char parent[32];
	const char *role;
	double shim;
	ssize_t len;

	*origin = started_monotonic("self");
	snprintf(parent, sizeof(parent), "/proc/%d/cmdline", (int)getppid());
	len = read_file(AT_FDCWD, parent, 0, cmdline, sizeof(cmdline));
	if (len < 0)
		return "unknown";
	role = shim_role(cmdline, (size_t)len);
	if (strcmp(role, "dead_shim") != 0)
		return role;
	snprintf(parent, sizeof(parent), "%d", (int)getppid());
	shim = started_monotonic(parent);
	if (*origin < 0 || (shim >= 0 && shim < *origin))
		*origin = shim;
	return role;
}

/* ---- the start-up slots and the storm mark (runc_guard/shim/startup.py) ------------------- */

/* `path` (<cache>/startup, <cache>/spool) a directory, it and its parent made 0700 if missing. */
static int make_dir(const char *path)
{
	char parent[PATH_MAX];
	const char *slash = strrchr(path, '/');
	struct stat st;

	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		return 0; /* the common case: one stat */
	if (slash != NULL && (size_t)snprintf(parent, sizeof(parent), "%.*s", (int)(slash - path), path) <
				     sizeof(parent))
		(void)mkdir(parent, 0700); /* EEXIST; ENOENT: a level above missing, left to the Python entry */
	if (mkdir(path, 0700) != 0 && errno != EEXIST)
		return -1;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/* startup.cpus: the CPUs this process may run on. */
static int cpu_count(void)
{
	cpu_set_t set;
	long online;

	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		return CPU_COUNT(&set);
	online = sysconf(_SC_NPROCESSORS_ONLN);
	return online > 0 ? (int)online : 1;
}

/* startup.slots: two per CPU, fewer when the path's measured cost says so; 0 when one alone is too costly. */
static int slot_count(const char *startup, double timeout, int cpus)
{
	char path[PATH_MAX], buf[32], *end;
	long long cost = 0, afford;
	int most = cpus < 1 ? 2 : 2 * cpus, n = snprintf(path, sizeof(path), "%s/" COST_FILE, startup);
	/* overload.read_cost: "<ms>\n" in a file of ours, or no measurement */
	ssize_t len = n > 0 && (size_t)n < sizeof(path) ? read_file(AT_FDCWD, path, 1, buf, sizeof(buf)) : -1;

	if (len > 1 && buf[len - 1] == '\n' && buf[0] >= '0' && buf[0] <= '9') {
		buf[len - 1] = '\0';
		errno = 0;
		cost = strtoll(buf, &end, 10);
		if (errno != 0 || *end != '\0' || cost > COST_MAX_MS)
			cost = 0;
	}
	if (cost <= 0)
		return most;
	afford = (long long)(COST_SHARE * cpus * timeout * 1000) / cost;
	return afford > most ? most : (int)afford;
}

/* startup.runnable: the R of /proc/loadavg's R/T (tasks runnable now, node-wide), or -1. */
static long runnable_now(void)
{
	char buf[256], *field, *end;
	long running;
	int i;

	if (read_file(AT_FDCWD, "/proc/loadavg", 0, buf, sizeof(buf)) < 0)
		return -1;
	for (field = buf, i = 0; i < 3 && field; i++)
		if ((field = strchr(field, ' ')) != NULL)
			field++;
	if (field == NULL || *field < '0' || *field > '9')
		return -1;
	errno = 0;
	running = strtol(field, &end, 10);
	return errno != 0 || *end != '/' || end[1] < '0' || end[1] > '9' ? -1 : running;
}

/* An flock on <dir>/<name> (close-on-exec), or -1: held by another (EWOULDBLOCK), or unusable. */
static int try_lock(const char *dir, const char *name, int *held)
{
	char path[PATH_MAX];
	int fd, n = snprintf(path, sizeof(path), "%s/%s", dir, name);

	*held = 0;
	if (n < 0 || (size_t)n >= sizeof(path))
		return -1;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		*held = errno == EWOULDBLOCK;
		close(fd);
		return -1;
	}
	return fd;
}

/* startup.acquire: one free slot's fd (close-on-exec cleared: the Python entry inherits it),
 * -1: no slots usable here (go on without), -2: every slot held. */
static int acquire(const char *startup, int count)
{
	char name[32];
	int fd, held;

	for (int i = 0; i < count; i++) {
		snprintf(name, sizeof(name), "slot-%d", i);
		fd = try_lock(startup, name, &held);
		if (fd < 0 && held)
			continue;
		if (fd < 0)
			return -1;
		if (fcntl(fd, F_SETFD, 0) != 0) {
			close(fd);
			return -1;
		}
		return fd;
	}
	return -2;
}

/* startup.storm_marked: did a delete find every slot held within STORM_HOLD (the mark's mtime,
 * wall clock)? A mark in the future or unreadable is no storm. */
static int storm_marked(const char *mark)
{
	struct stat st;
	double now = clock_s(CLOCK_REALTIME), age;

	if (now < 0 || stat(mark, &st) != 0)
		return 0;
	age = now - ((double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9);
	return age >= 0 && age < STORM_HOLD;
}

/* startup.mark_storm: every slot was held. */
static void mark_storm(const char *mark)
{
	int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);

	if (fd < 0)
		return;
	futimens(fd, NULL);
	close(fd);
}

/* ---- stepping aside ------------------------------------------------------------------------ */

/* Printable ASCII only: what the step-aside's line carries, so Python reads back the very bytes. */
static int plain(const char *s)
{
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			return 0;
	return 1;
}

/*
 * The step-aside's fact for Python (runc_guard/delete/stepaside.py), one line in the spool:
 *   runc-guard-aside 1 <wall ns> <id> <root> <cwd, when root is relative> <runtime> <why> <n>
 * tab-separated; `why` is budget (n: ms of it spent), storm, or slots (n: how many). By
 * rename from a hidden temp file: never seen half-written. 0 when written.
 */
static int write_fact(const char *spool, const char *id, const char *root, const char *cwd, const char *runtime,
		      const char *why, long long n)
{
	char line[4 * PATH_MAX], path[PATH_MAX], tmp[PATH_MAX];
	struct timespec now;
	long long ns;
	int fd, len;

	clock_gettime(CLOCK_REALTIME, &now);
	ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
	len = snprintf(line, sizeof(line), ASIDE_HEADER "\t%lld\t%s\t%s\t%s\t%s\t%s\t%lld\n", ns, id, root, cwd,
		       runtime, why, n);
	if (len < 0 || (size_t)len >= sizeof(line) || make_dir(spool) != 0)
		return -1;
	if ((size_t)snprintf(path, sizeof(path), "%s/%020lld-%d" ASIDE_SUFFIX, spool, ns, (int)getpid()) >=
		    sizeof(path) ||
	    (size_t)snprintf(tmp, sizeof(tmp), "%s/.aside.%d.tmp", spool, (int)getpid()) >= sizeof(tmp))
		return -1;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (write(fd, line, (size_t)len) != len || close(fd) != 0 || rename(tmp, path) != 0) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* spool.lower_priority for ourselves, before the interpreter's start: nice and autogroup at HELPER_NICE. */
static void lower_priority(void)
{
	int fd;

	(void)setpriority(PRIO_PROCESS, 0, HELPER_NICE);
	fd = open("/proc/self/autogroup", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, TEXT(HELPER_NICE), sizeof(TEXT(HELPER_NICE)) - 1);
		close(fd);
	}
}

/*
 * report.spawn_detached: the helper (the Python entry, told "helper") in a session of its
 * own, its lock as fd 3, /dev/null for stdio (go-runc waits until the runtime's stdout/stderr
 * pipes close), the caller's environment behind the hand-over, below every runtime from its first
 * instruction (lower_priority). The helper itself leaves our cgroups (spool.step_back). Not waited
 * for: it outlives this process.
 */
static void spawn_helper(int lock, const char *const *args)
{
	char entry[PATH_MAX], handover[PATH_MAX + NAME_MAX + sizeof(HANDOVER) + 16], *argv[8], **env;
	int null, n;

	if (python_entry(entry, sizeof(entry)) != 0 || handover_of(handover, sizeof(handover), "\nhelper") != 0 ||
	    fork() != 0) { /* the parent, or fork failed: the helper's copy (if any) keeps the flock */
		close(lock);
		return;
	}
	setsid();
	lower_priority();
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0 ||
	    (lock == 3 ? fcntl(3, F_SETFD, 0) : dup2(lock, 3)) < 0)
		_exit(127);
	env = environment_with(handover);
	if (env == NULL)
		_exit(127);
	argv[0] = entry;
	for (n = 0; args[n] && n < 6; n++)
		argv[n + 1] = (char *)args[n];
	argv[n + 1] = NULL;
	execve(entry, argv, env);
	_exit(127);
}

/*
 * entry.py _report_overloaded, at C's cost: the fact for Python, then a finisher (with a
 * finish window) and a reporter unless one holds its lock -- once per storm -- and the
 * runtime alone. A fact that cannot be written: the Python entry steps aside itself.
 */
__attribute__((noreturn)) static void step_aside(const char *cache, const struct routes *r, const char *id,
						 const char *root, const char *cwd, const char *runtime,
						 const char *why, long long n)
{
	char spool[PATH_MAX], linger[32];
	int lock, held;

	if ((size_t)snprintf(spool, sizeof(spool), "%s/spool", cache) >= sizeof(spool) ||
	    write_fact(spool, id, root, cwd, runtime, why, n) != 0)
		to_python(EXIT_RUNTIME_UNAVAILABLE, "a delete to step aside", "");
	if (r->finish_window > 0 && (lock = try_lock(cache, FINISHER_LOCK, &held)) >= 0) {
		const char *args[] = {"finisher", NULL};
		spawn_helper(lock, args);
	}
	if ((lock = try_lock(spool, REPORTER_LOCK, &held)) >= 0) {
		snprintf(linger, sizeof(linger), "%.17g", r->linger);
		const char *args[] = {"reporter", spool, linger, NULL};
		spawn_helper(lock, args);
	}
	exec_runtime(runtime);
}

/* Would the Python writer prune the aside directory after its write? Then it must decide. */
static int aside_crowded(const char *cache)
{
	char dir[PATH_MAX];
	struct stat st;
	int n = snprintf(dir, sizeof(dir), "%s/aside", cache);

	return n < 0 || (size_t)n >= sizeof(dir) || (stat(dir, &st) == 0 && st.st_size > CROWDED_DIR_BYTES);
}

/*
 * A known container's delete: the start-up admission, as shim/entry.py _startup_slot decides
 * it (startup.py's constants, the same clocks). Admitted: the Python entry loads the delete
 * path with the slot and the budget's origin handed over. Too little budget left, a storm
 * marked, or every slot held: step aside. Whatever the Python entry would do differently (a
 * RUNC_GUARD_* variable, a root, cwd or runtime path that is not printable ASCII, an aside
 * directory to prune): it decides everything itself.
 */
__attribute__((noreturn)) static void interpose(const struct invocation *inv, const struct routes *r,
						const char *runtime)
{
	char startup[PATH_MAX], mark[PATH_MAX], cwd[PATH_MAX] = "", tail[96];
	const char *cache = env_value("RUNC_GUARD_CACHE_DIR="), *root = state_root(inv), *role;
	double origin, now, lag, left, margin, deadline;
	long running;
	int slot, count, cpus;

	cache = cache ? cache : DEFAULT_CACHE_DIR;
	/* <id>@<12 hex digits>.json (pending.record_path) longer than a file name: no record to write */
	if (strlen(inv->container_id) + 18 > NAME_MAX || settings_variable(NULL) || !plain(root) ||
	    !plain(runtime) || !plain(cache) || aside_crowded(cache) ||
	    (root[0] != '/' && (getcwd(cwd, sizeof(cwd)) == NULL || !plain(cwd))) ||
	    (size_t)snprintf(startup, sizeof(startup), "%s/startup", cache) >= sizeof(startup) ||
	    (size_t)snprintf(mark, sizeof(mark), "%s/" STORM_MARK, startup) >= sizeof(mark))
		to_python(EXIT_RUNTIME_UNAVAILABLE, "a delete to interpose", "");
	role = delete_caller(&origin);
	now = clock_s(CLOCK_MONOTONIC);
	if (now < 0)
		to_python(EXIT_RUNTIME_UNAVAILABLE, "a delete to interpose", "");
	if (origin < 0)
		origin = now;
	/* startup.delete_deadline: the deadline the delete will use, its reply margin included */
	lag = now - origin;
	left = origin + r->timeout - now;
	margin = 0;
	if (r->finish_window > 0 && lag > 0) {
		margin = lag / 2 < r->timeout / 2 ? lag / 2 : r->timeout / 2;
		if (margin > left - r->timeout * MIN_BUDGET_SHARE)
			margin = left - r->timeout * MIN_BUDGET_SHARE;
		if (margin < 0)
			margin = 0;
	}
	deadline = origin + r->timeout - margin;
	if (deadline - now < r->timeout * MIN_BUDGET_SHARE)
		step_aside(cache, r, inv->container_id, root, cwd, runtime, "budget",
			   (long long)((clock_s(CLOCK_MONOTONIC) - origin) * 1000));
	if (storm_marked(mark)) {
		if (strcmp(role, "dead_shim") == 0) /* startup.STORM_HOLD: the storm goes on */
			mark_storm(mark);
		step_aside(cache, r, inv->container_id, root, cwd, runtime, "storm", 0);
	}
	cpus = cpu_count();
	count = slot_count(startup, r->timeout, cpus);
	if (count == 0) { /* startup.cpu_to_spare: one path costs too much here, so alone and with CPU to spare */
		running = runnable_now();
		if (running < 0 || running > 2L * cpus) {
			mark_storm(mark);
			step_aside(cache, r, inv->container_id, root, cwd, runtime, "cpu", running < 0 ? 0 : running);
		}
		count = 1;
	}
	if (make_dir(startup) != 0) /* the Python entry makes every missing level, or goes on without */
		to_python(EXIT_RUNTIME_UNAVAILABLE, "a delete to interpose", "");
	slot = acquire(startup, count);
	if (slot == -2) {
		mark_storm(mark);
		step_aside(cache, r, inv->container_id, root, cwd, runtime, "slots", count);
	}
	snprintf(tail, sizeof(tail), "\nadmitted %d %lld %s", slot, (long long)(origin * 1e9), role);
	to_python(EXIT_RUNTIME_UNAVAILABLE, "a delete to interpose", tail);
}

int main(int argc, char **argv)
{
	static char buf[MAX_ROUTES], derived[PATH_MAX];
	char self_path[PATH_MAX], runtime_path[PATH_MAX];
	const char *config, *state_dir, *cache, *runtime;
	struct invocation inv;
	struct routes routes;
	struct stat self, st;
	ssize_t len;
	int from_file = 0;

	if (argc < 1 || argv[0] == NULL)
		bail(EXIT_CONFIG, "started without argv[0]: cannot tell which runtime to front");
	call.argv = argv;
	call.invoked = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	call.self_path = argv[0];
	len = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
	if (len <= 0 || stat("/proc/self/exe", &self) != 0) /* no /proc: loops cannot be ruled out */
		to_python(EXIT_CONFIG, "cannot read /proc/self/exe", "");
	self_path[len] = '\0';
	call.self_path = self_path;

	parse(argv + 1, &inv);
	if (settings_variable((const char *const[]){"RUNTIME", "RUNTIMES", NULL}))
		to_python(EXIT_CONFIG, "RUNC_GUARD_RUNTIME(S) routes this call", "");
	/* a delete's: whether the container is known (pending_dir; debug makes every delete known) */
	if (inv.is_delete && settings_variable((const char *const[]){"PENDING_DIR", "LOG_LEVEL", NULL}))
		to_python(EXIT_CONFIG, "a RUNC_GUARD_* variable bears on this delete", "");
	config = env_value("RUNC_GUARD_CONFIG=");
	config = config ? config : DEFAULT_CONFIG;
	state_dir = env_value("RUNC_GUARD_STATE_DIR=");
	cache = env_value("RUNC_GUARD_CACHE_DIR=");
	if (state_dir == NULL && cache != NULL) { /* settings.py state_dir: moves with the cache */
		if ((size_t)snprintf(derived, sizeof(derived), "%s/state", cache) >= sizeof(derived))
			to_python(EXIT_CONFIG, "RUNC_GUARD_CACHE_DIR is too long", "");
		state_dir = derived;
	}
	state_dir = state_dir ? state_dir : DEFAULT_STATE_DIR;
	if (stat(config, &st) == 0) {
		if (read_routes(state_dir, config, &st, buf, sizeof(buf), &routes) != 0)
			to_python(EXIT_CONFIG, "no routing cache to trust", "");
		from_file = 1;
	} else if (errno == ENOENT) { /* no settings file: the defaults, as settings.py has them */
		memset(&routes, 0, sizeof(routes));
		routes.runtime = DEFAULT_RUNTIME;
		routes.pending_dir = DEFAULT_PENDING_DIR;
	} else {
		to_python(EXIT_CONFIG, "cannot stat the settings file", "");
	}
	runtime = runtime_for(&routes, call.invoked);
	if (runtime == NULL)
		to_python(EXIT_CONFIG, "an invoked name the routing does not map", "");
	if (resolve_runtime(runtime, &self, runtime_path, sizeof(runtime_path)) != 0)
		to_python(EXIT_RUNTIME_UNAVAILABLE, "the runtime cannot be found", "");
	if (inv.is_delete && known_to_anyone(&inv, &routes)) {
		if (!from_file) /* the defaults carry no admission settings: the Python entry admits */
			to_python(EXIT_RUNTIME_UNAVAILABLE, "a delete to interpose", "");
		interpose(&inv, &routes, runtime_path);
	}
	exec_runtime(runtime_path);
}
