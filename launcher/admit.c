/*
 * The start-up admission of a known container's delete, at C's cost.
 *
 * In a crash storm hundreds of deletes start at once. Before this file each one started a
 * Python interpreter just to learn that the node was too busy for it (~40 ms of CPU, and on
 * 2 cores 2-2.4 s of containerd's 5 s budget before it stepped aside: docs/storm.md). Here
 * the launcher decides as runc_guard/shim/entry.py _startup_slot does, with the same
 * constants (runc_guard/shim/startup.py) and the same clock:
 *
 *   - the budget's origin and the caller (procinfo.py delete_caller): our start, or a
 *     dead-shim cleanup's start when our parent is `containerd-shim... delete`;
 *   - too little of the deadline left (MIN_BUDGET_SHARE): step aside at once;
 *   - a storm marked (every slot held less than STORM_HOLD ago): step aside at once, a
 *     dead-shim cleanup renewing the mark;
 *   - otherwise take a free one of 2 x CPUs delete slots (flock), held for the whole delete;
 *     a slot: load the delete path (the Python entry, the slot handed over); every slot held:
 *     mark a storm and step aside at once (a wait here cost the stepped-aside runtimes their
 *     budget).
 *
 * Stepping aside is what the Python entry did, written here: the overload aside record
 * (<cache>/aside/<id>@<sha256(root)[:12]>.json, JSON), a spool entry for the reporter
 * (marshal, the spool's format), a reporter and a finisher (with a finish window) started
 * unless one holds its lock -- each a detached Python helper, once per storm -- and then the
 * runtime alone. Whatever this file cannot write exactly as the Python side would (a root
 * or path that is not printable ASCII, an aside directory crowded enough to need pruning)
 * is ADMIT_UNSURE: the Python entry then decides everything itself, slowly but exactly.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "launcher.h"

/* runc_guard/shim/startup.py */
#define MIN_BUDGET_SHARE 0.25
#define STORM_HOLD 5.0
#define STORM_MARK "storm"
/* runc_guard/delete/bounds.py CROWDED_DIR_BYTES: past it the Python writer prunes. */
#define CROWDED_DIR_BYTES (64 << 10)
#define FINISHER_LOCK "finisher.lock"
#define REPORTER_LOCK ".reporter.lock"

static double clock_s(clockid_t id)
{
	struct timespec ts;

	if (clock_gettime(id, &ts) != 0)
		return -1;
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the budget's origin and the caller (runc_guard/procinfo.py) ------------------------- */

/* A whole file (at most size - 1 bytes, NUL-terminated) into buf; its length or -1. */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
	ssize_t got, total = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -1;
	while ((size_t)total < size - 1 && (got = read(fd, buf + total, size - 1 - (size_t)total)) != 0) {
		if (got < 0) {
			if (errno == EINTR)
				continue;
			close(fd);
			return -1;
		}
		total += got;
	}
	close(fd);
	buf[total] = '\0';
	return (size_t)total == size - 1 ? -1 : total; /* full: maybe truncated, not a fact */
}

/* The start time (clock ticks since boot) of /proc/<pid>/stat: field 22, counted after the ")". */
static int start_ticks(const char *pid, unsigned long long *out)
{
	char path[64], buf[4096], *p, *end;
	int field;

	snprintf(path, sizeof(path), "/proc/%s/stat", pid);
	if (read_small(path, buf, sizeof(buf)) < 0 || (p = strrchr(buf, ')')) == NULL)
		return -1;
	for (field = 0, p++; field < 20; field++) { /* state is field 0 after ")", starttime 19 */
		while (*p == ' ')
			p++;
		if (*p == '\0')
			return -1;
		if (field == 19)
			break;
		while (*p && *p != ' ')
			p++;
	}
	errno = 0;
	*out = strtoull(p, &end, 10);
	return errno == 0 && end != p ? 0 : -1;
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

static int starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
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
	if (i < len)
		return "unknown"; /* more words than we hold: not a shim's line */
	if (n < 2)
		return "unknown";
	base = strrchr(args[0], '/') ? strrchr(args[0], '/') + 1 : args[0];
	if (!starts_with(base, "containerd-shim"))
		return "unknown";
	if (strcmp(args[n - 1], "delete") == 0)
		return "dead_shim";
	if (starts_with(base, "containerd-shim-runc-v"))
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
	len = read_small(parent, cmdline, sizeof(cmdline));
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

/* ---- the start-up slots (runc_guard/shim/startup.py acquire) ------------------------------ */

/* mkdir -p with mode 0700 for every level it creates; 0 when `path` is a directory after. */
static int make_dirs(const char *path)
{
	char buf[PATH_MAX];
	struct stat st;
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -1;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
		return 0; /* the common case: one stat, not a mkdir per level */
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, 0700) != 0 && errno != EEXIST)
		return -1;
	return stat(buf, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

static int slot_count(void)
{
	cpu_set_t set;
	long online;
	int cpus;

	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		cpus = CPU_COUNT(&set);
	} else {
		online = sysconf(_SC_NPROCESSORS_ONLN);
		cpus = online > 0 ? (int)online : 1;
	}
	return cpus < 1 ? 2 : 2 * cpus;
}

/* One free slot's fd (flock held, close-on-exec cleared), -1: no slots usable here, -2: all held. */
static int acquire(const char *cache_dir, int count)
{
	char dir[PATH_MAX], path[PATH_MAX];
	int n, fd;

	n = snprintf(dir, sizeof(dir), "%s/startup", cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir) || make_dirs(dir) != 0)
		return -1;
	for (int i = 0; i < count; i++) {
		n = snprintf(path, sizeof(path), "%s/slot-%d", dir, i);
		fd = n < 0 || (size_t)n >= sizeof(path) ? -1 : open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0)
			return -1;
		if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
			int held = errno == EWOULDBLOCK;

			close(fd);
			if (held)
				continue;
			return -1; /* startup.acquire: any other failure, go on without a slot */
		}
		if (fcntl(fd, F_SETFD, 0) != 0) { /* the Python entry inherits it */
			close(fd);
			return -1;
		}
		return fd;
	}
	return -2;
}

/* startup.storm_marked: did a delete find every slot held within STORM_HOLD (the mark's mtime,
 * wall clock)? A mark in the future or unreadable is no storm. */
static int storm_marked(const char *cache_dir)
{
	char path[PATH_MAX];
	struct stat st;
	double now = clock_s(CLOCK_REALTIME), age;
	int n = snprintf(path, sizeof(path), "%s/startup/" STORM_MARK, cache_dir);

	if (n < 0 || (size_t)n >= sizeof(path) || now < 0 || stat(path, &st) != 0)
		return 0;
	age = now - ((double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9);
	return age >= 0 && age < STORM_HOLD;
}

/* startup.mark_storm: every slot was held. */
static void mark_storm(const char *cache_dir)
{
	char path[PATH_MAX];
	int n = snprintf(path, sizeof(path), "%s/startup/" STORM_MARK, cache_dir), fd;

	if (n < 0 || (size_t)n >= sizeof(path))
		return;
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	futimens(fd, NULL);
	close(fd);
}

/* ---- what a step-aside writes --------------------------------------------------------------- */

/* Printable ASCII only: what JSON and marshal carry here without an encoder. */
static int plain(const char *s)
{
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			return 0;
	return 1;
}

/* os.path.abspath of the runtime root: joined to the cwd, then posixpath.normpath (which keeps
 * exactly two leading slashes as two, drops "." and empty words, and ".." with the word before it). */
static int abspath(const char *root, char *out, size_t size)
{
	char joined[PATH_MAX], *save = NULL, *word, *words[PATH_MAX / 2];
	size_t len, count = 0;
	int n;

	if (root[0] == '/') {
		n = snprintf(joined, sizeof(joined), "%s", root);
	} else {
		char cwd[PATH_MAX];
		if (getcwd(cwd, sizeof(cwd)) == NULL)
			return -1;
		n = snprintf(joined, sizeof(joined), "%s/%s", cwd, root);
	}
	if (n < 0 || (size_t)n >= sizeof(joined) || size < 3)
		return -1;
	len = joined[1] == '/' && joined[2] != '/' ? 2 : 1;
	for (word = strtok_r(joined, "/", &save); word; word = strtok_r(NULL, "/", &save)) {
		if (strcmp(word, ".") == 0)
			continue;
		if (strcmp(word, "..") == 0) {
			if (count > 0)
				count--;
			continue;
		}
		words[count++] = word;
	}
	memcpy(out, "//", len);
	for (size_t i = 0; i < count; i++) {
		n = snprintf(out + len, size - len, "%s%s", i ? "/" : "", words[i]);
		if (n < 0 || (size_t)n >= size - len)
			return -1;
		len += (size_t)n;
	}
	out[len] = '\0';
	return 0;
}

/* write_atomic(path, data, 0600, durable=False, dir_mode=0700): a temp file beside it, renamed. */
static int write_atomic(const char *dir, const char *name, const char *data, size_t len)
{
	char path[PATH_MAX], tmp[PATH_MAX];
	int fd, n = snprintf(path, sizeof(path), "%s/%s", dir, name);
	ssize_t done = 0, got;

	if (n < 0 || (size_t)n >= sizeof(path) || make_dirs(dir) != 0)
		return -1;
	n = snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", dir, name, (int)getpid());
	if (n < 0 || (size_t)n >= sizeof(tmp))
		return -1;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	while ((size_t)done < len) {
		got = write(fd, data + done, len - (size_t)done);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			break;
		done += got;
	}
	if (close(fd) != 0 || (size_t)done != len || rename(tmp, path) != 0) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* Append to buf (at *len of size) printf-style; -1 once it no longer fits. */
__attribute__((format(printf, 4, 5))) static int put(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*len >= size)
		return -1;
	va_start(ap, fmt);
	n = vsnprintf(buf + *len, size - *len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= size - *len) {
		*len = size;
		return -1;
	}
	*len += (size_t)n;
	return 0;
}

/* A JSON string of printable ASCII: only '"' and '\' need escaping. */
static int put_json(char *buf, size_t size, size_t *len, const char *s)
{
	if (put(buf, size, len, "\"") != 0)
		return -1;
	for (; *s; s++)
		if (put(buf, size, len, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s) != 0)
			return -1;
	return put(buf, size, len, "\"");
}

int record_name(const char *raw_root, const char *id, char *root, size_t rsize, char *name, size_t nsize)
{
	char hash[65];
	int n;

	if (!plain(raw_root) || abspath(raw_root, root, rsize) != 0 || !plain(root))
		return -1;
	sha256_hex(root, strlen(root), hash);
	n = snprintf(name, nsize, "%s@%.12s.json", id, hash);
	return n >= 0 && (size_t)n < nsize ? 0 : -1;
}

/* delete/aside.py write_aside(kind=OVERLOAD, cgroup_paths=[]) under `name`: 0 when written. */
static int write_aside(const struct admit_settings *s, const char *root, const char *name, const char *id,
		       const char *reason, const char *runtime)
{
	static char doc[16384];
	char dir[PATH_MAX];
	size_t len = 0;
	int n;

	n = snprintf(dir, sizeof(dir), "%s/aside", s->cache_dir);
	if (n < 0 || (size_t)n >= sizeof(dir))
		return -1;
	if (put(doc, sizeof(doc), &len, "{\"container_id\": ") || put_json(doc, sizeof(doc), &len, id) ||
	    put(doc, sizeof(doc), &len, ", \"runtime_root\": ") || put_json(doc, sizeof(doc), &len, root) ||
	    put(doc, sizeof(doc), &len, ", \"cgroup_paths\": [], \"reason\": ") ||
	    put_json(doc, sizeof(doc), &len, reason) ||
	    put(doc, sizeof(doc), &len, ", \"kind\": \"overload\", \"runtime\": ") ||
	    put_json(doc, sizeof(doc), &len, runtime) ||
	    put(doc, sizeof(doc), &len, ", \"created\": %.3f}", clock_s(CLOCK_REALTIME)))
		return -1;
	return write_atomic(dir, name, doc, len);
}

/* marshal: a str of printable ASCII (TYPE_SHORT_ASCII 'z' or TYPE_ASCII 'a'). */
static int marshal_str(char *buf, size_t size, size_t *len, const char *s)
{
	size_t n = strlen(s);

	if (*len + n + 5 > size)
		return -1;
	if (n < 256) {
		buf[(*len)++] = 'z';
		buf[(*len)++] = (char)n;
	} else {
		buf[(*len)++] = 'a';
		for (int i = 0; i < 4; i++)
			buf[(*len)++] = (char)(n >> (8 * i) & 0xff);
	}
	memcpy(buf + *len, s, n);
	*len += n;
	return 0;
}

/* marshal of a dict of str -> str: '{' key value ... '0'. */
static int marshal_dict(char *buf, size_t size, size_t *len, const char *const *pairs)
{
	if (*len + 2 > size)
		return -1;
	buf[(*len)++] = '{';
	for (; *pairs; pairs += 2)
		if (marshal_str(buf, size, len, pairs[0]) || marshal_str(buf, size, len, pairs[1]))
			return -1;
	buf[(*len)++] = '0';
	return 0;
}

/* report.EventLog's timestamp: UTC, microseconds, "Z". The civil date is computed here (days since
 * the epoch to year/month/day, proleptic Gregorian): glibc's gmtime_r and strftime both run tzset,
 * which opens and reads /etc/localtime, seven syscalls on every step-aside for a UTC stamp. */
static void timestamp(char out[40])
{
	struct timespec ts;
	long long days, secs, era, doe, yoe, doy, mp, year;
	unsigned month, day;

	clock_gettime(CLOCK_REALTIME, &ts);
	days = ts.tv_sec / 86400;
	secs = ts.tv_sec % 86400;
	if (secs < 0) {
		secs += 86400;
		days--;
	}
	days += 719468; /* from 1970-01-01 to 0000-03-01 */
	era = (days >= 0 ? days : days - 146096) / 146097;
	doe = days - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	day = (unsigned)(doy - (153 * mp + 2) / 5 + 1);
	month = (unsigned)(mp < 10 ? mp + 3 : mp - 9);
	year = yoe + era * 400 + (month <= 2);
	snprintf(out, 40, "%04u-%02u-%02uT%02u:%02u:%02u.%06uZ", (unsigned)year % 10000u, month % 100u, day % 100u,
		 (unsigned)(secs / 3600), (unsigned)(secs / 60 % 60), (unsigned)(secs % 60),
		 (unsigned)(ts.tv_nsec / 1000) % 1000000u);
}

/* spool.write_spool of the one startup_overloaded entry shim/entry.py _report_overloaded logs. */
static int write_spool(const char *spool, const struct admit_settings *s, const char *id, const char *root,
		       const char *reason)
{
	static char doc[16384];
	char ts[40], name[NAME_MAX + 1];
	struct timespec now;
	size_t len = 0;
	const char *sink[] = {"journal_socket", s->journal_socket, "log_file", s->log_file, NULL};
	const char *entry[] = {"container_id", id, "runtime_root", root, "reason", reason,
			       "event", "startup_overloaded", "level", "warning", "timestamp", ts, NULL};

	timestamp(ts);
	doc[len++] = '{';
	if (marshal_str(doc, sizeof(doc), &len, "sink") || marshal_dict(doc, sizeof(doc), &len, sink) ||
	    marshal_str(doc, sizeof(doc), &len, "entries") || len + 8 > sizeof(doc))
		return -1;
	doc[len++] = '[';
	doc[len++] = 1, doc[len++] = 0, doc[len++] = 0, doc[len++] = 0; /* one entry, little-endian */
	if (marshal_dict(doc, sizeof(doc), &len, entry) || len + 1 > sizeof(doc))
		return -1;
	doc[len++] = '0';
	clock_gettime(CLOCK_REALTIME, &now);
	snprintf(name, sizeof(name), "%020lld-%d.entries",
		 (long long)now.tv_sec * 1000000000LL + now.tv_nsec, (int)getpid());
	return write_atomic(spool, name, doc, len);
}

void journal_minimal(const char *socket_path, const char *event, const char *message, int priority)
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
	if (sendto(fd, msg, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		(void)0; /* reporting never changes the call */
	close(fd);
}

/* spool.try_lock: the helper's flock (close-on-exec), or -1 when another holds it. */
static int try_lock(const char *dir, const char *name)
{
	char path[PATH_MAX];
	int fd, n = snprintf(path, sizeof(path), "%s/%s", dir, name);

	if (n < 0 || (size_t)n >= sizeof(path))
		return -1;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * report.spawn_detached: the helper in a session of its own, its lock as fd 3, /dev/null for
 * stdio (go-runc waits until the runtime's stdout/stderr pipes close), the caller's environment
 * behind the hand-over. The helper itself lowers its priority and leaves our cgroups
 * (spool.step_back). Not waited for: it outlives this process, as the Python entry's did.
 */
static void spawn_helper(const struct helper_exec *helper, int lock, const char *const *args)
{
	char handover[PATH_MAX + NAME_MAX + 64], *argv[8], **env;
	int null, n = snprintf(handover, sizeof(handover), "%s\nhelper", helper->handover);
	pid_t pid;

	if (n < 0 || (size_t)n >= sizeof(handover)) {
		close(lock);
		return;
	}
	pid = fork();
	if (pid != 0) { /* the parent, or fork failed: the helper's copy (if any) keeps the flock */
		close(lock);
		return;
	}
	setsid();
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0 ||
	    (lock == 3 ? fcntl(3, F_SETFD, 0) : dup2(lock, 3)) < 0)
		_exit(127);
	env = environment_with(handover);
	if (env == NULL)
		_exit(127);
	argv[0] = (char *)helper->entry;
	for (n = 0; args[n] && n < 6; n++)
		argv[n + 1] = (char *)args[n];
	argv[n + 1] = NULL;
	execve(helper->entry, argv, env);
	_exit(127);
}

/*
 * entry.py _report_overloaded: the aside record (then a finisher, with a window), the spool
 * entry (then a reporter); the journal directly when the spool cannot be written. Every
 * failure here is reporting's, never the call's: the runtime runs alone regardless.
 */
static void step_aside(const char *id, const char *raw_root, const char *root, const char *record,
		       const char *runtime, const struct admit_settings *s, const struct helper_exec *helper,
		       const char *reason)
{
	char spool[PATH_MAX], linger[32];
	int lock, n;

	if (write_aside(s, root, record, id, reason, runtime) == 0 && s->finish_window > 0 &&
	    (lock = try_lock(s->cache_dir, FINISHER_LOCK)) >= 0) {
		const char *args[] = {"finisher", NULL};
		spawn_helper(helper, lock, args);
	}
	n = snprintf(spool, sizeof(spool), "%s/spool", s->cache_dir);
	if (n < 0 || (size_t)n >= sizeof(spool) || write_spool(spool, s, id, raw_root, reason) != 0) {
		journal_minimal(s->journal_socket, "startup_overloaded", reason, 4);
		return;
	}
	if ((lock = try_lock(spool, REPORTER_LOCK)) >= 0) {
		snprintf(linger, sizeof(linger), "%.17g", s->linger);
		const char *args[] = {"reporter", spool, linger, NULL};
		spawn_helper(helper, lock, args);
	}
}

/* Would the Python writer prune the aside directory after its write? Then it must write. */
static int aside_crowded(const char *cache_dir)
{
	char dir[PATH_MAX];
	struct stat st;
	int n = snprintf(dir, sizeof(dir), "%s/aside", cache_dir);

	return n < 0 || (size_t)n >= sizeof(dir) || (stat(dir, &st) == 0 && st.st_size > CROWDED_DIR_BYTES);
}

enum admit_verdict admit(const char *id, const char *raw_root, const char *runtime_path,
			 const struct admit_settings *s, const struct helper_exec *helper, struct admitted *out)
{
	char root[PATH_MAX], record[NAME_MAX + 1], reason[512];
	double origin, now, lag, left, margin, deadline;
	int finishing = s->finish_window > 0, slot, count;

	/* What a step-aside would have to write, checked first: never half of it in C. */
	if (record_name(raw_root, id, root, sizeof(root), record, sizeof(record)) != 0 || !plain(runtime_path) || !plain(s->journal_socket) || !plain(s->log_file) || !plain(s->cache_dir) ||
	    aside_crowded(s->cache_dir))
		return ADMIT_UNSURE;
	out->role = delete_caller(&origin);
	now = clock_s(CLOCK_MONOTONIC);
	if (now < 0)
		return ADMIT_UNSURE;
	if (origin < 0)
		origin = now;
	/* startup.delete_deadline: the deadline the delete will use, its reply margin included */
	lag = now - origin;
	left = origin + s->timeout - now;
	margin = 0;
	if (finishing && lag > 0) {
		margin = lag / 2 < s->timeout / 2 ? lag / 2 : s->timeout / 2;
		if (margin > left - s->timeout * MIN_BUDGET_SHARE)
			margin = left - s->timeout * MIN_BUDGET_SHARE;
		if (margin < 0)
			margin = 0;
	}
	deadline = origin + s->timeout - margin;
	if (deadline - now < s->timeout * MIN_BUDGET_SHARE) {
		snprintf(reason, sizeof(reason),
			 "containerd's budget for this delete was %d ms old when runc-guard started (the node"
			 " is overloaded); runc-guard stepped aside and ran the runtime alone",
			 (int)((clock_s(CLOCK_MONOTONIC) - origin) * 1000));
		step_aside(id, raw_root, root, record, runtime_path, s, helper, reason);
		return ADMIT_ASIDE;
	}
	if (storm_marked(s->cache_dir)) {
		if (strcmp(out->role, "dead_shim") == 0) /* startup.STORM_HOLD: the storm goes on */
			mark_storm(s->cache_dir);
		snprintf(reason, sizeof(reason),
			 "a storm of deletes is running (every slot was held less than %g s ago); runc-guard"
			 " stepped aside and ran the runtime alone (the finisher or the sweep completes what it"
			 " leaves)",
			 STORM_HOLD);
		step_aside(id, raw_root, root, record, runtime_path, s, helper, reason);
		return ADMIT_ASIDE;
	}
	count = slot_count();
	slot = acquire(s->cache_dir, count);
	if (slot == -2) {
		mark_storm(s->cache_dir);
		snprintf(reason, sizeof(reason),
			 "%d deletes were already running at once; runc-guard stepped aside and ran the runtime"
			 " alone (the finisher or the sweep completes what it leaves)",
			 count);
		step_aside(id, raw_root, root, record, runtime_path, s, helper, reason);
		return ADMIT_ASIDE;
	}
	out->slot = slot;
	out->origin_ns = (long long)(origin * 1e9);
	return ADMIT_LOAD;
}
