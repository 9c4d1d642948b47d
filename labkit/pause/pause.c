/*
 * pause: the sandbox process of a CRI pod, built by the test support.
 *
 * It does what registry.k8s.io/pause does and nothing more, so the suite needs
 * no network: it reaps every child re-parented to it (it is pid 1 of a pod's
 * shared PID namespace), and exits 0 on SIGTERM or SIGINT (containerd's
 * StopPodSandbox sends SIGTERM first). Built with `gcc -static -Os`.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = quit;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;) {
        pause();
    }
    return 1;
}
