/* flowstat-soak-idler N: N processes for the soak benchmark to watch (benchmarks/bench_soak.py).
 *
 * The parent forks N children that sleep until they are killed; it prints "ready N" once all of them
 * exist, waits for SIGTERM or SIGINT, then kills its children and reaps every one before it exits, so
 * a group of 10,000 comes and goes without a zombie. A child also dies with its parent (PDEATHSIG),
 * should the parent itself be killed. Each child wakes every WAKE_S seconds and touches a page, so its
 * CPU clock moves a little and its samples are not all alike. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAKE_S 2

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void child_loop(pid_t parent) {
    static char page[4096];
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(0); /* the parent is gone already: nobody would reap us */
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    for (unsigned i = 0;; i++) {
        page[(i * 64) % sizeof page] ^= 1;
        sleep(WAKE_S);
    }
}

static long parse_count(const char *arg) {
    char *end;
    errno = 0;
    long n = strtol(arg, &end, 10);
    if (errno || *end || n < 1 || n > 1000000)
        return -1;
    return n;
}

static int reap_all(pid_t *children, long n) {
    int left = 0;
    for (long i = 0; i < n; i++)
        if (children[i] > 0 && kill(children[i], SIGKILL) != 0 && errno != ESRCH)
            left++;
    for (long i = 0; i < n; i++)
        while (children[i] > 0 && waitpid(children[i], NULL, 0) < 0 && errno == EINTR)
            ;
    return left;
}

int main(int argc, char **argv) {
    long n = argc == 2 ? parse_count(argv[1]) : -1;
    if (n < 0) {
        fprintf(stderr, "usage: %s N (1 to 1000000 children)\n", argv[0]);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    pid_t *children = calloc((size_t)n, sizeof *children);
    if (!children) {
        perror("calloc");
        return 1;
    }
    pid_t me = getpid();
    long made = 0;
    for (; made < n && !stop_requested; made++) {
        pid_t pid = fork();
        if (pid == 0)
            child_loop(me);
        if (pid < 0) {
            fprintf(stderr, "%s: fork of child %ld of %ld failed: %s\n", argv[0], made + 1, n, strerror(errno));
            reap_all(children, made);
            return 1;
        }
        children[made] = pid;
    }
    printf("ready %ld\n", made);
    fflush(stdout);
    while (!stop_requested)
        pause();
    int left = reap_all(children, made);
    free(children);
    return left ? 1 : 0;
}
