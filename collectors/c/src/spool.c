#include "spool.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

/* A batch file is named NNNNNNNNNNNN-COUNT.batch (order, then sample count); anything else in the
 * folder (sink-url, a .tmp cut short, a file left by hand) is not a batch. */
static int parse_batch_name(const char *name, unsigned long long *n, int *count)
{
    char *end = NULL;
    if (!isdigit((unsigned char)name[0]))
        return -1;
    unsigned long long number = strtoull(name, &end, 10);
    if (*end != '-' || !isdigit((unsigned char)end[1]))
        return -1;
    long samples = strtol(end + 1, &end, 10);
    if (strcmp(end, ".batch") != 0 || samples < 0 || samples > INT_MAX)
        return -1;
    *n = number;
    *count = (int)samples;
    return 0;
}

/* The file of batch number n, whatever its count suffix. */
static int batch_path(const struct spool *s, unsigned long long n, char *out, size_t len, int *count)
{
    DIR *dir = opendir(s->dir);
    if (!dir)
        return -1;
    struct dirent *e;
    int found = -1;
    while (found != 0 && (e = readdir(dir)) != NULL) {
        unsigned long long number;
        int samples;
        if (parse_batch_name(e->d_name, &number, &samples) == 0 && number == n) {
            snprintf(out, len, "%s/%s", s->dir, e->d_name);
            *count = samples;
            found = 0;
        }
    }
    closedir(dir);
    return found;
}

static int mkdirs(const char *path)
{
    char tmp[512];
    fs_strlcpy(tmp, path, sizeof tmp);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(tmp, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

int spool_open(struct spool *s, const char *dir, long long max_bytes)
{
    memset(s, 0, sizeof *s);
    fs_strlcpy(s->dir, dir, sizeof s->dir);
    s->max_bytes = max_bytes;
    if (mkdirs(dir) != 0)
        return -1;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *e;
    int any = 0;
    unsigned long long lo = 0, hi = 0;
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (nl > 4 && strcmp(e->d_name + nl - 4, ".tmp") == 0) { /* cut short by a crash: never acknowledged */
            unlink(path);
            continue;
        }
        unsigned long long n;
        int count;
        if (parse_batch_name(e->d_name, &n, &count) != 0)
            continue;
        struct stat st;
        if (stat(path, &st) == 0)
            s->bytes += st.st_size;
        s->samples += count;
        lo = any && lo < n ? lo : n;
        hi = any && hi > n ? hi : n;
        any = 1;
    }
    closedir(d);
    s->first = any ? lo : 0;
    s->next = any ? hi + 1 : 0;
    return 0;
}

int spool_empty(const struct spool *s)
{
    return s->first >= s->next;
}

void spool_pop(struct spool *s)
{
    char path[1024];
    int count = 0;
    if (spool_empty(s))
        return;
    if (batch_path(s, s->first, path, sizeof path, &count) == 0) {
        struct stat st;
        if (stat(path, &st) == 0)
            s->bytes -= st.st_size;
        unlink(path);
        s->samples -= count;
    }
    s->first++;
}

int spool_push(struct spool *s, const char *data, size_t len, int count)
{
    char path[1024], tmp[1040];
    snprintf(path, sizeof path, "%s/%012llu-%d.batch", s->dir, s->next, count);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(fd);
            unlink(tmp);
            return -1;
        }
        off += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    s->next++;
    s->bytes += (long long)len;
    s->samples += count;
    while (s->bytes > s->max_bytes && s->next - s->first > 1) {
        char old[1024];
        int lost = 0;
        if (batch_path(s, s->first, old, sizeof old, &lost) == 0) {
            s->dropped_samples += lost;
            LOG_ERR("spool %s is over %lld bytes: dropped its oldest batch (%d samples)", s->dir, s->max_bytes, lost);
        }
        spool_pop(s);
    }
    return 0;
}

char *spool_peek(struct spool *s, size_t *len, int *count)
{
    char path[1024];
    while (!spool_empty(s)) {
        if (batch_path(s, s->first, path, sizeof path, count) != 0) {
            s->first++; /* a gap (removed by hand): skip it */
            continue;
        }
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            if (fd >= 0)
                close(fd);
            return NULL;
        }
        char *buf = malloc((size_t)st.st_size + 1);
        ssize_t n = buf ? read(fd, buf, (size_t)st.st_size) : -1;
        close(fd);
        if (n != st.st_size) {
            free(buf);
            return NULL;
        }
        *len = (size_t)n;
        return buf;
    }
    return NULL;
}

static char *read_small_file(const char *path, size_t max)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *text = calloc(1, max + 1);
    if (text)
        text[fread(text, 1, max, f)] = '\0';
    fclose(f);
    return text;
}

static int write_new_file(const char *path, const char *text)
{
    char tmp[1040];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t len = strlen(text);
    int ok = write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
    ok &= close(fd) == 0;
    /* link, not rename: a file another agent wrote meanwhile is kept, never replaced */
    ok = ok && (link(tmp, path) == 0 || errno == EEXIST);
    int saved = errno;
    unlink(tmp);
    errno = saved;
    return ok ? 0 : -1;
}

static void trim_line_end(char *text)
{
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        text[--n] = '\0';
}

int spool_claim(struct spool *s, const char *url, char *err, size_t errlen)
{
    char path[1024], want[600];
    snprintf(path, sizeof path, "%s/%s", s->dir, SPOOL_URL_FILE);
    snprintf(want, sizeof want, "%s\n", url);
    if (write_new_file(path, want) != 0) {
        snprintf(err, errlen, "spool %s: cannot write %s: %s", s->dir, SPOOL_URL_FILE, strerror(errno));
        return -1;
    }
    char *have = read_small_file(path, sizeof want);
    if (have)
        trim_line_end(have); /* written by hand, or by another program, the newline may differ */
    int same = have && strcmp(have, url) == 0;
    if (!same)
        snprintf(err, errlen, "spool %s holds the batches of another sink (%s names %.200s): give another --spool-dir",
                 s->dir, SPOOL_URL_FILE, have ? have : "?");
    free(have);
    return same ? 0 : -1;
}
