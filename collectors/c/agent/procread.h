/* Reading a process's CPU and memory with /proc files held open and re-read with pread. */
#ifndef FLOWSTAT_PROCREAD_H
#define FLOWSTAT_PROCREAD_H

#include <stddef.h>
#include <sys/types.h>

struct proc_reading {
    unsigned long long utime, stime; /* clock ticks */
    long threads;
    long long rss_kb;
};

enum proc_status { PROC_OK = 0, PROC_GONE = 1, PROC_BAD_FORMAT = 2, PROC_IO_ERROR = 3 };

struct proc_reader {
    pid_t pid;
    int stat_fd, statm_fd;
};

/* Parsers work on a buffer of len bytes (not NUL-terminated); they never read past it. */
enum proc_status parse_stat(const char *buf, size_t len, struct proc_reading *out);
enum proc_status parse_statm(const char *buf, size_t len, long page_kb, long long *rss_kb);

/* What --top ranks a process by, from its /proc/PID/stat: when it started (clock ticks after boot),
 * the CPU it used (utime + stime, ticks) and its resident pages. */
struct proc_rank {
    unsigned long long start, ticks, rss_pages;
};
enum proc_status parse_stat_rank(const char *buf, size_t len, struct proc_rank *out);

/* PROC_IO_ERROR with errno EMFILE or ENFILE: the open files limit is reached. */
enum proc_status proc_reader_open(struct proc_reader *r, pid_t pid);
enum proc_status proc_reader_read(struct proc_reader *r, struct proc_reading *out);
void proc_reader_close(struct proc_reader *r);

/* Thesis Hz (10^6 = one core) for user, system and both, rounded to 0.1, over elapsed seconds. */
/* CPU time in seconds from clock ticks (utime, stime): the same double the Python agent writes. */
double proc_cpu_seconds(unsigned long long ticks);
void proc_cpu_rates(const struct proc_reading *prev, const struct proc_reading *cur, double elapsed, double *total,
                    double *user, double *sys);

#endif
