/* The floor for agent benchmarks: a bare loop of held-fd preads of /proc/PID/stat and statm.
 * usage: proc_floor INTERVAL_S DURATION_S PID... ; prints how many reads it made. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: proc_floor INTERVAL_S DURATION_S PID...\n");
        return 2;
    }
    double interval = atof(argv[1]), duration = atof(argv[2]);
    int n = argc - 3;
    int *fds = calloc((size_t)n * 2, sizeof *fds);
    char path[64], buf[1024];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "/proc/%s/stat", argv[i + 3]);
        fds[2 * i] = open(path, O_RDONLY);
        snprintf(path, sizeof path, "/proc/%s/statm", argv[i + 3]);
        fds[2 * i + 1] = open(path, O_RDONLY);
    }
    struct timespec start, next;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long long reads = 0, ticks = (long long)(duration / interval);
    for (long long t = 1; t <= ticks; t++) {
        for (int i = 0; i < 2 * n; i++)
            if (fds[i] >= 0 && pread(fds[i], buf, sizeof buf, 0) > 0)
                reads++;
        double due = (double)t * interval;
        next.tv_sec = start.tv_sec + (time_t)due;
        next.tv_nsec = start.tv_nsec + (long)((due - (double)(time_t)due) * 1e9);
        if (next.tv_nsec >= 1000000000L) {
            next.tv_sec++;
            next.tv_nsec -= 1000000000L;
        }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    printf("%lld\n", reads);
    free(fds);
    return 0;
}
