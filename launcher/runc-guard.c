/*
 * runc-guard launcher: the binary containerd runs as its runtime BinaryName.
 *
 * Every runtime call of every container passes through here (each `runc exec`
 * of an exec probe, every `state`, `create`, `start`, `kill`), so this program
 * does what the hot path needs and then execs, at the cost of one execve:
 *
 *   - any call but an interposed delete: execve of the real runtime, with the
 *     same argv[1:], the environment byte for byte, the fds, and the signal
 *     dispositions and mask it inherited (this file never touches either);
 *   - `delete` of a container nobody knows (no <root>/<id>/state.json, no
 *     <root>/<id>/status, no pending record): the runtime, directly;
 *   - `delete` of a known container, and everything this file cannot trust:
 *     execve of the Python entry (runc-guard.py), which is the source of truth.
 *
 * The runtime comes from a routing cache the Python side writes when it loads
 * the settings (runc_guard/routes.py: the format, and why each check exists).
 * It is bound to the settings file's identity (dev, ino, size, mtime_ns,
 * ctime_ns: ctime cannot be set from user space, so an edit always misses).
 * The launcher distrusts it, and hands the call to the Python entry, when:
 * RUNC_GUARD_RUNTIME or RUNC_GUARD_RUNTIMES is set (a delete also with a
 * RUNC_GUARD_PENDING_DIR that is not absolute or a RUNC_GUARD_LOG_LEVEL that is
 * not a level: settings.py would not take them); the settings file cannot be
 * stat'ed; the cache is missing, not owned by the euid, writable by group or
 * others (file or directory), a symlink, corrupt, truncated, over-long, of
 * another version, for another settings path, or of another identity; the
 * invoked name (basename of argv[0]) is one it does not map; the runtime
 * cannot be found or is runc-guard itself (the Python entry reports it).
 * With no settings file at all the defaults route (runc, default names only).
 *
 * The Python entry learns the invoked name and this binary's path from one
 * variable put in front of its environment, RUNC_GUARD_HANDOVER=<invoked
 * name>/<path of this binary> (first, because CPython's os.environ keeps the
 * first of two equal names: a caller's own variable of that name comes after it
 * and reaches the runtime); the entry removes it before the runtime sees the
 * environment.
 *
 * Never writes to stdout. Exit codes, its own (runc_guard/errors.py):
 *   69 (EXIT_RUNTIME_UNAVAILABLE)  neither the runtime nor the Python entry
 *                                  could be executed for a call it could route;
 *   78 (EXIT_CONFIG)               it could not trust its routing and the
 *                                  Python entry could not be executed.
 * Anything else is the runtime's (or the Python entry's) own status.
 * Build: launcher/build.sh (one rule, used by every install path).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launcher.h"

#define EXIT_RUNTIME_UNAVAILABLE 69
#define EXIT_CONFIG 78

#define DEFAULT_CONFIG "/etc/runc-guard/config.toml"
#define DEFAULT_STATE_DIR "/var/lib/runc-guard"
#define DEFAULT_RUNTIME "runc"
#define DEFAULT_PENDING_DIR "/run/runc-guard/pending"
#define DEFAULT_CACHE_DIR "/run/runc-guard"
#define DEFAULT_ROOT "/run/runc"
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define ROUTES_HEADER "runc-guard-routes 2"
/* The Python entry, relative to this binary's directory unless absolute. */
#ifndef PY_ENTRY
#define PY_ENTRY "runc-guard.py"
#endif
#define HANDOVER "RUNC_GUARD_HANDOVER="
/* runc-guard's own rule (shim/argv.py MAX_ID_LEN): longer ids cannot have state. */
#define MAX_ID_LEN 255
/* Larger than any routing a settings file (1 MiB at most) sensibly has. */
#define MAX_ROUTES 65536
#define MAX_NAMES 256

extern char **environ;

/* environ's value of `key` ("RUNC_GUARD_CONFIG=") or NULL; "" counts as unset, as in settings.py. */
static const char *env_value(const char *key)
{
	size_t n = strlen(key);

	for (char **e = environ; *e; e++)
		if (strncmp(*e, key, n) == 0)
			return (*e)[n] ? *e + n : NULL;
	return NULL;
}

/* journal.send_minimal's socket: RUNC_GUARD_JOURNAL_SOCKET, else journald's. */
static const char *journal_socket(void)
{
	const char *socket_path = env_value("RUNC_GUARD_JOURNAL_SOCKET=");

	return socket_path ? socket_path : "/run/systemd/journal/socket";
}

char **environment_with(const char *first)
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

/* One way to fail: one line on stderr naming the program (and %m), and the journal; then exit. */
__attribute__((noreturn, format(printf, 2, 3))) static void bail(int code, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n] = '\0';
	/* The journal where it is cheap (one datagram; RUNC_GUARD_JOURNAL_SOCKET as send_minimal has it). */
	journal_minimal(journal_socket(), "runtime_unavailable", line, 3);
	line[n] = '\n';
	if (write(STDERR_FILENO, "runc-guard: ", 12) < 0 || write(STDERR_FILENO, line, (size_t)n + 1) < 0)
		_exit(code); /* stderr closed: the exit status is all that is left */
	_exit(code);
}

/* ---- the command line, exactly as runc_guard/shim/argv.py parses it ---------------------- */

struct invocation {
	const char *subcommand; /* NULL: no subcommand, or a line runc-guard must not guess at */
	const char *container_id; /* delete with exactly one valid id, else NULL */
	const char *root;       /* --root's last value ("" when given empty) or NULL */
	int force;
	int is_delete;          /* argv.py Invocation.is_delete: runc-guard interposes */
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

/* strconv.ParseBool's false spellings (argv.py _FALSE). */
static int false_spelling(const char *v)
{
	static const char *const spellings[] = {"0", "f", "F", "false", "FALSE", "False", NULL};

	return in_list(spellings, v, strlen(v));
}

/* strconv.ParseBool's true spellings (argv.py _TRUE): runc refuses "tRue", so must we. */
static int true_spelling(const char *v)
{
	static const char *const spellings[] = {"1", "t", "T", "true", "TRUE", "True", NULL};

	return in_list(spellings, v, strlen(v));
}

/*
 * argv.py _split_flag: "--root=x" -> name "root", value "x"; "-debug" -> "debug",
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

/* libcontainer's validateID (argv.py valid_container_id): [A-Za-z0-9_+,-.]+, not "." or "..". */
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

/* argv.py _parse_delete_args: the id and --force of `runc delete`. */
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

/* argv.py parse: global flags until the first word that is not one (or "--"), then the subcommand. */
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

/* The runtime's state root, as runc resolves it (argv.py Invocation.root). */
static const char *state_root(const struct invocation *inv)
{
	return inv->root && *inv->root ? inv->root : DEFAULT_ROOT;
}

#ifdef PARSE_ONLY
/* ---- test build: print the parse, nothing else (tests/test_launcher_parse.py) ----------- */

static void put_hex(const char *label, const char *s)
{
	printf("%s=", label);
	if (s == NULL) {
		printf("-");
	} else {
		printf("x");
		for (; *s; s++)
			printf("%02x", (unsigned char)*s);
	}
	printf("\n");
}

int main(int argc, char **argv)
{
	struct invocation inv;

	if (argc < 1)
		bail(EXIT_CONFIG, "started without argv[0]");
	parse(argv + 1, &inv);
	put_hex("subcommand", inv.subcommand);
	put_hex("id", inv.container_id);
	printf("force=%d\n", inv.force);
	put_hex("root", state_root(&inv));
	printf("delete=%d\n", inv.is_delete);
	{
		char root[PATH_MAX], name[NAME_MAX + 1];
		int named = inv.is_delete &&
			    record_name(state_root(&inv), inv.container_id, root, sizeof(root), name, sizeof(name)) == 0;
		put_hex("record", named ? name : NULL);
	}
	return 0;
}
#else

/* ---- the routing cache (format: runc_guard/routes.py) ------------------------------------- */

struct routes {
	const char *runtime;
	const char *pending_dir;
	int debug;
	struct admit_settings admission;
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

/* A decimal unsigned number that is the whole word, or -1 (ERANGE, junk, empty). */
static int parse_u64(const char *s, unsigned long long *out)
{
	char *end;

	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno == 0 && *end == '\0' ? 0 : -1;
}

/* The file line: "file\t<dev> <ino> <size> <mtime_ns> <ctime_ns>" equal to `st`? */
static int same_identity(char *value, const struct stat *st)
{
	unsigned long long want[5], got[5];
	char *word, *save = NULL;
	int i = 0;

	got[0] = (unsigned long long)st->st_dev;
	got[1] = (unsigned long long)st->st_ino;
	got[2] = (unsigned long long)st->st_size;
	got[3] = (unsigned long long)st->st_mtim.tv_sec * 1000000000ULL + (unsigned long long)st->st_mtim.tv_nsec;
	got[4] = (unsigned long long)st->st_ctim.tv_sec * 1000000000ULL + (unsigned long long)st->st_ctim.tv_nsec;
	for (word = strtok_r(value, " ", &save); word; word = strtok_r(NULL, " ", &save)) {
		if (i == 5 || parse_u64(word, &want[i]) != 0)
			return 0;
		i++;
	}
	return i == 5 && memcmp(want, got, sizeof(want)) == 0;
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
	struct stat dst, fst;
	ssize_t got;
	size_t total = 0;
	int dfd, fd, n;

	n = snprintf(name, sizeof(name), "routes%s", config);
	if (n < 0 || (size_t)n >= sizeof(name))
		return -1;
	for (char *p = name; *p; p++)
		if (*p == '/')
			*p = '%';
	dfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -1; /* ENOENT: never written (a fresh node, a wiped /var/lib) */
	if (fstat(dfd, &dst) != 0 || !trusted(&dst)) {
		close(dfd);
		return -1;
	}
	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	close(dfd);
	if (fd < 0)
		return -1; /* ENOENT, or ELOOP: a symlink is never ours */
	if (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode) || !trusted(&fst)) {
		close(fd);
		return -1;
	}
	while (total < size && (got = read(fd, buf + total, size - total)) != 0) {
		if (got < 0) {
			if (errno == EINTR)
				continue;
			close(fd);
			return -1;
		}
		total += (size_t)got;
	}
	close(fd);
	if (total == 0 || total >= size || memchr(buf, '\0', total) != NULL)
		return -1; /* empty, over-long, or not text */
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
	if (parse_seconds(field(next_line(&cur, end), "timeout"), &r->admission.timeout) != 0 ||
	    parse_seconds(field(next_line(&cur, end), "finish"), &r->admission.finish_window) != 0 ||
	    parse_seconds(field(next_line(&cur, end), "linger"), &r->admission.linger) != 0)
		return -1;
	r->admission.journal_socket = field(next_line(&cur, end), "journal");
	r->admission.log_file = field(next_line(&cur, end), "logfile");
	if (r->admission.journal_socket == NULL || r->admission.log_file == NULL)
		return -1;
	while ((line = next_line(&cur, end)) != NULL && strcmp(line, "end") != 0) {
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

/* ---- the runtime, found like runc_guard/shim/runtime.py resolve_runtime -------------------- */

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
		return errno != ENOENT;
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

/* ---- the two execs ------------------------------------------------------------------------ */

/*
 * Replace this process with the runtime: same pid, argv[1:], environment, fds, signal
 * dispositions and mask. Returning from here is itself an error.
 */
static void exec_runtime(const char *path, char **argv)
{
	argv[0] = (char *)path;
	execve(path, argv, environ);
}

/*
 * Replace this process with the Python entry, the source of truth, telling it the invoked
 * name and this binary's path (the first environment entry, removed again by the entry).
 * One allocation: the environment's size is the caller's, no stack buffer fits every one.
 */
static int python_entry(const char *self_path, char *entry, size_t size)
{
	const char *slash = strrchr(self_path, '/');
	int n;

	if (PY_ENTRY[0] == '/' || slash == NULL)
		n = snprintf(entry, size, "%s", PY_ENTRY);
	else
		n = snprintf(entry, size, "%.*s/%s", (int)(slash - self_path), self_path, PY_ENTRY);
	return n >= 0 && (size_t)n < size ? 0 : -1;
}

/* RUNC_GUARD_HANDOVER=<invoked>/<self_path><tail> in buf; -1 when it does not fit. */
static int handover_of(char *buf, size_t size, const char *invoked, const char *self_path, const char *tail)
{
	int n = snprintf(buf, size, HANDOVER "%s/%s%s", invoked, self_path, tail);

	return n >= 0 && (size_t)n < size ? 0 : -1;
}

/* `tail`: "" for a plain hand-over, "\nadmitted <slot> <origin ns> <role>" for an admitted
 * delete (shim/entry.py handed_over); a newline cannot end a path readlink gave us unnoticed. */
static void exec_python_with(char **argv, const char *invoked, const char *self_path, int code, const char *why,
			     const char *tail)
{
	char entry[PATH_MAX], handover[PATH_MAX + NAME_MAX + sizeof(HANDOVER) + 96], **env;

	if (python_entry(self_path, entry, sizeof(entry)) != 0)
		bail(code, "%s; the Python entry's path is too long", why);
	if (handover_of(handover, sizeof(handover), invoked, self_path, tail) != 0)
		bail(code, "%s; the invoked name is too long to hand over", why);
	env = environment_with(handover);
	if (env == NULL)
		bail(code, "%s; cannot start the Python entry: %m", why);
	argv[0] = entry;
	execve(entry, argv, env);
	bail(code, "%s; cannot exec the Python entry %s: %m", why, entry);
}

static void exec_python(char **argv, const char *invoked, const char *self_path, int code, const char *why)
{
	exec_python_with(argv, invoked, self_path, code, why, "");
}

/*
 * Does a RUNC_GUARD_* variable change a setting the admission reads (settings.py: the
 * variable wins over the file)? Then the Python entry admits the delete: the launcher
 * never parses a setting the way settings.py might not.
 */
static int admission_variable(void)
{
	static const char *const names[] = {"RUNC_GUARD_DELETE_TIMEOUT=", "RUNC_GUARD_FINISH_WINDOW=",
					    "RUNC_GUARD_REPORTER_LINGER=", "RUNC_GUARD_JOURNAL_SOCKET=",
					    "RUNC_GUARD_LOG_FILE=", "RUNC_GUARD_LOG_LEVEL=", NULL};

	for (int i = 0; names[i]; i++)
		if (env_value(names[i]) != NULL)
			return 1;
	return 0;
}

/*
 * A known container's delete: admitted here (launcher/admit.c) when the routing cache gave
 * the admission's settings; loaded in the Python entry with the slot and the budget's origin
 * handed over, or run by the runtime alone once the step-aside is recorded. Never returns.
 */
static void interpose(char **argv, const char *invoked, const char *self_path, const char *runtime_path,
		      const struct invocation *inv, struct routes *r, int from_file)
{
	char entry[PATH_MAX], handover[PATH_MAX + NAME_MAX + sizeof(HANDOVER) + 2], tail[96];
	const char *cache = env_value("RUNC_GUARD_CACHE_DIR=");
	struct helper_exec helper = {entry, handover};
	struct admitted a;

	if (!from_file || admission_variable() || python_entry(self_path, entry, sizeof(entry)) != 0 ||
	    handover_of(handover, sizeof(handover), invoked, self_path, "") != 0)
		exec_python(argv, invoked, self_path, EXIT_RUNTIME_UNAVAILABLE, "a delete to interpose");
	r->admission.cache_dir = cache ? cache : DEFAULT_CACHE_DIR;
	switch (admit(inv->container_id, state_root(inv), runtime_path, &r->admission, &helper, &a)) {
	case ADMIT_ASIDE:
		exec_runtime(runtime_path, argv);
		exec_python(argv, invoked, self_path, EXIT_RUNTIME_UNAVAILABLE, "cannot exec the runtime");
		break;
	case ADMIT_LOAD:
		snprintf(tail, sizeof(tail), "\nadmitted %d %lld %s", a.slot, a.origin_ns, a.role);
		exec_python_with(argv, invoked, self_path, EXIT_RUNTIME_UNAVAILABLE, "a delete to interpose", tail);
		break;
	case ADMIT_UNSURE:
		break;
	}
	exec_python(argv, invoked, self_path, EXIT_RUNTIME_UNAVAILABLE, "a delete to interpose");
}

/* Is a RUNC_GUARD_* variable that names the runtime set (names: settings.py Settings._compared)? */
static int runtime_variable(void)
{
	for (char **e = environ; *e; e++)
		if (strncmp(*e, "RUNC_GUARD_RUNTIME=", 19) == 0 || strncmp(*e, "RUNC_GUARD_RUNTIMES=", 20) == 0)
			return 1;
	return 0;
}

/* Case-insensitive ASCII equality: Python's value.lower() maps no other character to these. */
static int lower_is(const char *v, const char *want)
{
	for (; *v && *want; v++, want++) {
		char c = *v >= 'A' && *v <= 'Z' ? (char)(*v - 'A' + 'a') : *v;
		if (c != *want)
			return 0;
	}
	return *v == *want;
}

/*
 * RUNC_GUARD_PENDING_DIR and RUNC_GUARD_LOG_LEVEL win over the file, as in settings.py,
 * where they decide whether a delete is known. -1: a value settings.py would refuse (and so
 * keep the file's): the Python entry decides.
 */
static int delete_variables(struct routes *r)
{
	static const char *const levels[] = {"info", "warning", "error", NULL};
	const char *pending = env_value("RUNC_GUARD_PENDING_DIR="), *level = env_value("RUNC_GUARD_LOG_LEVEL=");
	int known = 0;

	if (pending) {
		if (pending[0] != '/')
			return -1;
		r->pending_dir = pending;
	}
	if (level) {
		for (int i = 0; levels[i]; i++)
			known |= lower_is(level, levels[i]);
		if (!known && !lower_is(level, "debug"))
			return -1;
		r->debug = !known;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static char buf[MAX_ROUTES];
	char self_path[PATH_MAX], runtime_path[PATH_MAX];
	const char *invoked, *config, *state_dir, *runtime;
	struct invocation inv;
	struct routes routes;
	struct stat self, st;
	ssize_t len;
	int from_file = 0;

	if (argc < 1)
		bail(EXIT_CONFIG, "started without argv[0]: cannot tell which runtime to front");
	invoked = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
	len = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
	if (len <= 0 || stat("/proc/self/exe", &self) != 0) /* no /proc: loops cannot be ruled out */
		exec_python(argv, invoked, argv[0], EXIT_CONFIG, "cannot read /proc/self/exe");
	self_path[len] = '\0';

	parse(argv + 1, &inv);
	if (runtime_variable())
		exec_python(argv, invoked, self_path, EXIT_CONFIG, "RUNC_GUARD_RUNTIME(S) routes this call");

	config = env_value("RUNC_GUARD_CONFIG=");
	config = config ? config : DEFAULT_CONFIG;
	state_dir = env_value("RUNC_GUARD_STATE_DIR=");
	if (state_dir == NULL) { /* settings.py state_dir: moves with RUNC_GUARD_CACHE_DIR */
		static char derived[PATH_MAX];
		const char *cache = env_value("RUNC_GUARD_CACHE_DIR=");
		int n = cache ? snprintf(derived, sizeof(derived), "%s/state", cache) : 0;

		if (n < 0 || (size_t)n >= sizeof(derived))
			exec_python(argv, invoked, self_path, EXIT_CONFIG, "RUNC_GUARD_CACHE_DIR is too long");
		state_dir = cache ? derived : DEFAULT_STATE_DIR;
	}
	if (stat(config, &st) == 0) {
		if (read_routes(state_dir, config, &st, buf, sizeof(buf), &routes) != 0)
			exec_python(argv, invoked, self_path, EXIT_CONFIG, "no routing cache to trust");
		from_file = 1;
	} else if (errno == ENOENT) { /* no settings file: the defaults, as settings.py has them */
		memset(&routes, 0, sizeof(routes));
		routes.runtime = DEFAULT_RUNTIME;
		routes.pending_dir = DEFAULT_PENDING_DIR;
	} else {
		exec_python(argv, invoked, self_path, EXIT_CONFIG, "cannot stat the settings file");
	}
	runtime = runtime_for(&routes, invoked);
	if (runtime == NULL)
		exec_python(argv, invoked, self_path, EXIT_CONFIG, "an invoked name the routing does not map");
	if (resolve_runtime(runtime, &self, runtime_path, sizeof(runtime_path)) != 0)
		exec_python(argv, invoked, self_path, EXIT_RUNTIME_UNAVAILABLE, "the runtime cannot be found");
	if (inv.is_delete && delete_variables(&routes) != 0)
		exec_python(argv, invoked, self_path, EXIT_CONFIG, "a RUNC_GUARD_* variable settings.py refuses");
	if (inv.is_delete && known_to_anyone(&inv, &routes))
		interpose(argv, invoked, self_path, runtime_path, &inv, &routes, from_file);
	exec_runtime(runtime_path, argv);
	/* The Python entry reports a runtime that cannot be exec'd, journal entry included. */
	exec_python(argv, invoked, self_path, EXIT_RUNTIME_UNAVAILABLE, "cannot exec the runtime");
	return EXIT_RUNTIME_UNAVAILABLE;
}
#endif
