/* The sandbox ("pause") process of every pod: holds the pod's namespaces, reaps children that
 * get reparented to it (it is PID 1 of the pod when the PID namespace is shared) and exits on
 * SIGINT/SIGTERM. Built static so the image needs nothing but this file. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stop;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    if (getpid() != 1)
        fprintf(stderr, "pause: not PID 1 of its namespace; reaping only its own children\n");
    for (;;)
        pause();
}
