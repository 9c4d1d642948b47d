/*
 * What launcher/runc-guard.c (routing, the execs) and launcher/admit.c (the start-up
 * admission of a delete) share. libc only.
 */
#ifndef RUNC_GUARD_LAUNCHER_H
#define RUNC_GUARD_LAUNCHER_H

#include <stddef.h>

/* The settings the admission reads: the routing cache's format-2 lines (runc_guard/routes.py). */
struct admit_settings {
	double timeout;        /* delete_timeout */
	double finish_window;  /* > 0: a finisher completes what the runtime alone leaves */
	double linger;         /* reporter_linger */
	const char *journal_socket;
	const char *log_file;
	const char *cache_dir; /* RUNC_GUARD_CACHE_DIR or /run/runc-guard (never in the file) */
};

/* One delete's admission, as runc_guard/shim/entry.py _startup_slot decides it. */
enum admit_verdict {
	ADMIT_UNSURE, /* a fact the launcher cannot use: the Python entry decides everything */
	ADMIT_LOAD,   /* load the delete path: the Python entry, with the slot and origin handed over */
	ADMIT_ASIDE,  /* stepped aside: recorded and reported; exec the runtime alone */
};

struct admitted {
	int slot;             /* the slot's fd (inheritable), or -1: no slots here, go on without */
	long long origin_ns;  /* CLOCK_MONOTONIC ns: when containerd's budget started */
	const char *role;     /* procinfo.py's name of the caller: dead_shim, serving_shim, unknown */
};

/* How to start a detached helper (the reporter, the finisher): the Python entry, told so. */
struct helper_exec {
	const char *entry;    /* the Python entry's path */
	const char *handover; /* "RUNC_GUARD_HANDOVER=<name>/<path>": "\nhelper" is appended */
};

enum admit_verdict admit(const char *id, const char *root, const char *runtime_path,
			 const struct admit_settings *s, const struct helper_exec *helper, struct admitted *out);

/*
 * The name of a container's records (delete/pending.py record_path: <id>@<sha256 of the
 * root's abspath, 12 digits>.json) in `name`, the root's abspath in `root`; -1 when the root is
 * not printable ASCII (the Python side then names it) or a buffer is too small.
 */
int record_name(const char *raw_root, const char *id, char *root, size_t rsize, char *name, size_t nsize);

/*
 * journal.send_minimal: one datagram to journald's socket, never waited for (a full or absent
 * journald loses the entry, never the call). MESSAGE is "<event>: <message>".
 */
void journal_minimal(const char *socket_path, const char *event, const char *message, int priority);

/* The caller's environment with `first` put in front (the hand-over), or NULL (ENOMEM). */
char **environment_with(const char *first);

/* SHA-256 of [data, data+len) as 64 lowercase hex digits and a NUL (launcher/sha256.c). */
void sha256_hex(const void *data, size_t len, char out[65]);

#endif
