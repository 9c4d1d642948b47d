/*
 * A runtime stand-in that records exactly what it was started with, before doing
 * anything that could change it: argv, the environment's bytes, cwd, every open fd
 * and its target, and the signal lines of /proc/self/status (SigBlk, SigIgn).
 * Written to $TRACE_TO; exits with $TRACE_EXIT. C, not a script: a shell or an
 * interpreter in front would change the dispositions it is there to see.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static void hex(FILE *out, const char *s)
{
	for (; *s; s++)
		fprintf(out, "%02x", (unsigned char)*s);
	fputc('\n', out);
}

int main(int argc, char **argv)
{
	char path[PATH_MAX], target[PATH_MAX], line[512];
	const char *to = getenv("TRACE_TO"), *code = getenv("TRACE_EXIT");
	FILE *out, *status;
	struct dirent *d;
	DIR *fds;
	ssize_t n;

	if (to == NULL)
		return 111;
	/* the fd list first: the record file itself must not show up in it */
	fds = opendir("/proc/self/fd");
	out = fopen(to, "we");
	if (out == NULL || fds == NULL)
		return 112;
	for (int i = 0; i < argc; i++) {
		fputs("argv ", out);
		hex(out, argv[i]);
	}
	for (char **e = environ; *e; e++) {
		fputs("env ", out);
		hex(out, *e);
	}
	if (getcwd(path, sizeof(path))) {
		fputs("cwd ", out);
		hex(out, path);
	}
	while ((d = readdir(fds)) != NULL) {
		int fd = atoi(d->d_name);
		if (d->d_name[0] == '.' || fd == dirfd(fds) || fd == fileno(out))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", d->d_name);
		n = readlink(path, target, sizeof(target) - 1);
		target[n > 0 ? n : 0] = '\0';
		fprintf(out, "fd %d %s flags=%d\n", fd, target, fcntl(fd, F_GETFD));
	}
	closedir(fds);
	status = fopen("/proc/self/status", "re");
	while (status && fgets(line, sizeof(line), status))
		if (strncmp(line, "SigBlk:", 7) == 0 || strncmp(line, "SigIgn:", 7) == 0)
			fputs(line, out);
	if (status)
		fclose(status);
	fprintf(out, "pid %d\n", getpid());
	fclose(out);
	return code ? atoi(code) : 0;
}
