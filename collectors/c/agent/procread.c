#include "procread.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parse an unsigned decimal from [*p, end); advances *p. Returns -1 if there is none. */
static int parse_ull(const char **p, const char *end, unsigned long long *out)
{
    const char *s = *p;
    unsigned long long v = 0;
    if (s >= end || *s < '0' || *s > '9')
        return -1;
    while (s < end && *s >= '0' && *s <= '9') {
        unsigned d = (unsigned)(*s - '0');
        if (v > (~0ULL - d) / 10)
            return -1;
        v = v * 10 + d;
        s++;
    }
    *p = s;
    *out = v;
    return 0;
}

static const char *skip_spaces(const char *s, const char *end)
{
    while (s < end && (*s == ' ' || *s == '\n'))
        s++;
    return s;
}

static const char *skip_token(const char *s, const char *end)
{
    while (s < end && *s != ' ' && *s != '\n')
        s++;
    return s;
}

#define STAT_FIELDS_READ 24 /* the last field of /proc/PID/stat read (rss, for --top) */

/* The numbers of /proc/PID/stat's fields 3..last (man 5 proc: 14 utime, 15 stime, 20 threads, 22
 * starttime, 24 rss) that `wanted` has a bit for (1 << field), in values[field]. */
static enum proc_status stat_fields(const char *buf, size_t len, int last, unsigned long wanted,
                                    unsigned long long values[STAT_FIELDS_READ + 1])
{
    /* The command name (field 2) may hold spaces and ')': fields are counted after the last ')'. */
    const char *end = buf + len, *close = memrchr(buf, ')', len);
    if (!close)
        return PROC_BAD_FORMAT;
    const char *s = skip_spaces(close + 1, end);
    if (s >= end)
        return PROC_BAD_FORMAT;
    if (*s == 'Z' || *s == 'X') /* a zombie has exited; only its entry is left */
        return PROC_GONE;
    for (int field = 3; field <= last; field++) {
        s = skip_spaces(s, end);
        if (s >= end)
            return PROC_BAD_FORMAT;
        if (wanted & (1UL << field)) {
            const char *t = s;
            if (parse_ull(&t, end, &values[field]) != 0)
                return PROC_BAD_FORMAT;
        }
        s = skip_token(s, end);
    }
    return PROC_OK;
}

enum proc_status parse_stat(const char *buf, size_t len, struct proc_reading *out)
{
    unsigned long long values[STAT_FIELDS_READ + 1];
    enum proc_status st = stat_fields(buf, len, 20, 1UL << 14 | 1UL << 15 | 1UL << 20, values);
    if (st != PROC_OK)
        return st;
    out->utime = values[14];
    out->stime = values[15];
    out->threads = (long)values[20];
    return PROC_OK;
}

enum proc_status parse_stat_rank(const char *buf, size_t len, struct proc_rank *out)
{
    unsigned long long values[STAT_FIELDS_READ + 1];
    enum proc_status st = stat_fields(buf, len, 24, 1UL << 14 | 1UL << 15 | 1UL << 22 | 1UL << 24, values);
    if (st != PROC_OK)
        return st;
    out->start = values[22];
    out->ticks = values[14] + values[15];
    out->rss_pages = values[24];
    return PROC_OK;
}

enum proc_status parse_statm(const char *buf, size_t len, long page_kb, long long *rss_kb)
{
    const char *end = buf + len, *s = skip_spaces(buf, end);
    unsigned long long size, resident;
    if (parse_ull(&s, end, &size) != 0)
        return PROC_BAD_FORMAT;
    s = skip_spaces(s, end);
    if (parse_ull(&s, end, &resident) != 0 || resident > (unsigned long long)(LLONG_MAX / (page_kb > 0 ? page_kb : 1)))
        return PROC_BAD_FORMAT;
    *rss_kb = (long long)resident * page_kb;
    return PROC_OK;
}

enum proc_status proc_reader_open(struct proc_reader *r, pid_t pid)
{
    char path[64];
    r->pid = pid;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    r->stat_fd = open(path, O_RDONLY | O_CLOEXEC);
    snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
    r->statm_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->stat_fd < 0 || r->statm_fd < 0) {
        int err = errno;
        proc_reader_close(r);
        errno = err;
        return err == ENOENT || err == ESRCH ? PROC_GONE : PROC_IO_ERROR;
    }
    return PROC_OK;
}

static enum proc_status pread_all(int fd, char *buf, size_t cap, size_t *len)
{
    ssize_t n;
    do {
        n = pread(fd, buf, cap, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == ESRCH ? PROC_GONE : PROC_IO_ERROR;
    if (n == 0)
        return PROC_GONE;
    *len = (size_t)n;
    return PROC_OK;
}

enum proc_status proc_reader_read(struct proc_reader *r, struct proc_reading *out)
{
    char buf[1024];
    size_t len;
    enum proc_status st = pread_all(r->stat_fd, buf, sizeof buf, &len);
    if (st == PROC_OK)
        st = parse_stat(buf, len, out);
    if (st != PROC_OK)
        return st;
    static long page_kb = 0;
    if (page_kb == 0)
        page_kb = sysconf(_SC_PAGESIZE) / 1024;
    st = pread_all(r->statm_fd, buf, sizeof buf, &len);
    if (st == PROC_OK)
        st = parse_statm(buf, len, page_kb, &out->rss_kb);
    return st;
}

void proc_reader_close(struct proc_reader *r)
{
    if (r->stat_fd >= 0)
        close(r->stat_fd);
    if (r->statm_fd >= 0)
        close(r->statm_fd);
    r->stat_fd = r->statm_fd = -1;
}

static double round1(double v)
{
    return round(v * 10.0) / 10.0;
}

static long clock_ticks_per_second(void)
{
    static long clk_tck = 0;
    if (clk_tck == 0)
        clk_tck = sysconf(_SC_CLK_TCK);
    return clk_tck;
}

double proc_cpu_seconds(unsigned long long ticks)
{
    return (double)ticks / (double)clock_ticks_per_second();
}

void proc_cpu_rates(const struct proc_reading *prev, const struct proc_reading *cur, double elapsed, double *total,
                    double *user, double *sys)
{
    long clk_tck = clock_ticks_per_second();
    if (elapsed <= 0) {
        *total = *user = *sys = 0.0;
        return;
    }
    double scale = 1e6 / ((double)clk_tck * elapsed);
    double u = cur->utime > prev->utime ? (double)(cur->utime - prev->utime) * scale : 0.0;
    double s = cur->stime > prev->stime ? (double)(cur->stime - prev->stime) * scale : 0.0;
    *total = round1(u + s);
    *user = round1(u);
    *sys = round1(s);
}
