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

static void batch_path(const struct spool *s, const struct spool_entry *e, char *out, size_t len)
{
    snprintf(out, len, "%s/%012llu-%d.batch", s->dir, e->number, e->count);
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

/* Room for one more entry at the end of the index. Under lock (or before the spool is shared). */
static int make_room(struct spool *s)
{
    if (s->off + s->len < s->cap)
        return 0;
    if (s->off > 0) { /* the front was popped: move what is left down */
        memmove(s->entries, s->entries + s->off, s->len * sizeof *s->entries);
        s->off = 0;
        if (s->len < s->cap)
            return 0;
    }
    size_t cap = s->cap ? 2 * s->cap : 64;
    struct spool_entry *more = realloc(s->entries, cap * sizeof *more);
    if (!more)
        return -1;
    s->entries = more;
    s->cap = cap;
    return 0;
}

static int by_number(const void *a, const void *b)
{
    unsigned long long x = ((const struct spool_entry *)a)->number, y = ((const struct spool_entry *)b)->number;
    return (x > y) - (x < y);
}

/* Where the first entry numbered `number` or above is in the index (len when none is). Under lock. */
static size_t index_from(const struct spool *s, unsigned long long number)
{
    size_t lo = 0, hi = s->len; /* numbered in order: a binary search */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->entries[s->off + mid].number < number)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int spool_open(struct spool *s, const char *dir, long long max_bytes)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->lock, NULL);
    fs_strlcpy(s->dir, dir, sizeof s->dir);
    s->max_bytes = max_bytes;
    DIR *d = mkdirs(dir) == 0 ? opendir(dir) : NULL;
    if (!d) {
        int saved = errno;
        spool_close(s);
        errno = saved;
        return -1;
    }
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (nl > 4 && strcmp(e->d_name + nl - 4, ".tmp") == 0) { /* cut short by a crash: never acknowledged */
            unlink(path);
            continue;
        }
        struct spool_entry found;
        if (parse_batch_name(e->d_name, &found.number, &found.count) != 0)
            continue;
        struct stat st;
        found.bytes = stat(path, &st) == 0 ? (long long)st.st_size : 0;
        rc = make_room(s);
        if (rc == 0) {
            s->entries[s->len++] = found;
            s->bytes += found.bytes;
            s->samples += found.count;
        }
    }
    closedir(d);
    if (rc != 0) {
        spool_close(s);
        errno = ENOMEM;
        return -1;
    }
    if (s->len) /* qsort must not be given NULL, even for nothing */
        qsort(s->entries, s->len, sizeof *s->entries, by_number);
    s->next = s->len ? s->entries[s->len - 1].number + 1 : 0;
    s->synced = s->next;
    return 0;
}

void spool_close(struct spool *s)
{
    free(s->entries);
    s->entries = NULL;
    s->off = s->len = s->cap = 0;
    pthread_mutex_destroy(&s->lock);
}

int spool_empty(struct spool *s)
{
    pthread_mutex_lock(&s->lock);
    int empty = s->len == 0;
    pthread_mutex_unlock(&s->lock);
    return empty;
}

int spool_holds(struct spool *s, unsigned long long number)
{
    pthread_mutex_lock(&s->lock);
    size_t i = index_from(s, number); /* not FIFO: a batch newer than others may have left first */
    int held = i < s->len && s->entries[s->off + i].number == number;
    pthread_mutex_unlock(&s->lock);
    return held;
}

void spool_figures(struct spool *s, long long *batches, long long *samples, long long *dropped)
{
    pthread_mutex_lock(&s->lock);
    *batches = (long long)s->len + (s->taken ? s->taken_gone : 0); /* dropped while sent: until settled */
    *samples = s->samples;
    *dropped = s->dropped_samples;
    pthread_mutex_unlock(&s->lock);
}

/* Remove entries i .. i+k (from the oldest) from the index and their files from the folder. Under lock. */
static void remove_range(struct spool *s, size_t i, size_t k)
{
    for (size_t j = i; j < i + k; j++) {
        char path[1024];
        batch_path(s, &s->entries[s->off + j], path, sizeof path);
        unlink(path);
        s->bytes -= s->entries[s->off + j].bytes;
    }
    if (i == 0) { /* the front: nothing moves */
        s->off += k;
    } else {
        struct spool_entry *at = s->entries + s->off + i;
        memmove(at, at + k, (s->len - i - k) * sizeof *at);
    }
    s->len -= k;
}

static struct spool_entry remove_oldest(struct spool *s)
{
    struct spool_entry old = s->entries[s->off];
    remove_range(s, 0, 1);
    return old;
}

static int is_taken(const struct spool *s, unsigned long long number)
{
    return s->taken && number >= s->taken_first && number <= s->taken_last;
}

/* Past the bound the oldest batches go, never the newest one. Those the sink thread is sending
 * lose their files too, but are settled when the send ends: delivered if the sink took them, else
 * dropped (spool_ack, spool_release). Under lock. */
static void keep_to_bound(struct spool *s)
{
    while (s->bytes > s->max_bytes && s->len > 1) {
        struct spool_entry old = remove_oldest(s);
        if (is_taken(s, old.number)) {
            s->taken_gone++;
            s->taken_gone_samples += old.count;
            continue;
        }
        s->samples -= old.count;
        s->dropped_samples += old.count;
        LOG_ERR("spool %s is over %lld bytes: dropped its oldest batch (%d samples)", s->dir, s->max_bytes, old.count);
    }
}

/* The whole of data in a new file, or nothing (-1 with errno: a full disk). Not flushed to disk
 * here: spool_sync does, once it is known to stay. */
static int write_file(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;
            break;
        }
        off += (size_t)w;
    }
    int ok = off == len, saved = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        unlink(path);
        errno = saved;
        return -1;
    }
    return 0;
}

int spool_push(struct spool *s, const char *data, size_t len, int count, unsigned long long *number)
{
    char tmp[1024], path[1024];
    pthread_mutex_lock(&s->lock);
    unsigned long long mine = s->tmp_seq++;
    pthread_mutex_unlock(&s->lock);
    /* written under a name of its own, outside the lock; numbered as it is renamed, under it */
    snprintf(tmp, sizeof tmp, "%s/push-%llu.tmp", s->dir, mine);
    if (write_file(tmp, data, len) != 0)
        return -1;
    pthread_mutex_lock(&s->lock);
    struct spool_entry e = {.number = s->next, .bytes = (long long)len, .count = count};
    batch_path(s, &e, path, sizeof path);
    if (make_room(s) != 0 || rename(tmp, path) != 0) {
        int saved = errno;
        pthread_mutex_unlock(&s->lock);
        unlink(tmp);
        errno = saved;
        return -1;
    }
    s->next++;
    if (number)
        *number = e.number;
    s->entries[s->off + s->len++] = e;
    s->bytes += e.bytes;
    s->samples += count;
    keep_to_bound(s);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* The whole of an open file of about `expected` bytes, read straight into out's room: 0; -1 with
 * errno when it cannot be read. */
static int append_file(int fd, size_t expected, struct fs_buf *out)
{
    fs_buf_reserve(out, expected + 1); /* one more: the end is seen without growing */
    for (;;) {
        if (out->cap - out->len < 4096)
            fs_buf_reserve(out, out->cap);
        if (out->failed) {
            errno = ENOMEM;
            return -1;
        }
        ssize_t n = read(fd, out->data + out->len, out->cap - out->len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        out->len += (size_t)n;
        out->data[out->len] = '\0';
    }
}

/* Batch e's file appended to out: 0; -1 with errno when it cannot be opened or read. */
static int append_batch(struct spool *s, const struct spool_entry *e, struct fs_buf *out)
{
    char path[1024];
    batch_path(s, e, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = append_file(fd, (size_t)e->bytes, out);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

/* Read batches into out for spool_take: the one at index `from`, and those after it while all fit
 * in max_bytes (a later one that cannot be read is left for next time: one file open at a time).
 * Returns how many (0 with errno: the first cannot be read); *skipped when the first was removed by
 * hand (its entry dropped: look again). Under lock, so that the bound cannot remove them meanwhile;
 * the files are small and in the page cache, the sampling thread waits no longer than a read. */
static size_t read_run(struct spool *s, size_t from, size_t max_bytes, struct fs_buf *out, int *skipped)
{
    size_t n = 0;
    long long bytes = 0;
    *skipped = 0;
    while (from + n < s->len && n < SPOOL_TAKE_MAX) {
        struct spool_entry e = s->entries[s->off + from + n];
        if (n > 0 && bytes + e.bytes > (long long)max_bytes)
            break;
        size_t had = out->len;
        if (append_batch(s, &e, out) != 0) {
            out->len = had; /* a part read is not sent */
            if (n == 0 && errno == ENOENT) { /* removed by hand: it is not there to send */
                char path[1024];
                batch_path(s, &e, path, sizeof path);
                remove_range(s, from, 1);
                s->samples -= e.count;
                LOG_ERR("spool %s: batch %s is gone (removed by hand?): skipped", s->dir, path);
                *skipped = 1;
            }
            break;
        }
        if (n == 0)
            s->taken_first = e.number;
        n++;
        bytes += e.bytes;
        s->taken_last = e.number;
        s->taken_samples += e.count;
    }
    return n;
}

/* Where spool_take starts: at the first fresh batch when there is one and older ones wait, else at
 * the oldest. Under lock. */
static size_t take_from(const struct spool *s, unsigned long long fresh_from)
{
    size_t i = fresh_from ? index_from(s, fresh_from) : 0;
    return i < s->len ? i : 0;
}

int spool_take(struct spool *s, unsigned long long fresh_from, size_t max_bytes, struct fs_buf *out, int *count,
               unsigned long long *first)
{
    int skipped;
    size_t n;
    int saved;
    if (out->failed) /* out of memory last time: a fresh start */
        fs_buf_free(out);
    do {
        pthread_mutex_lock(&s->lock);
        if (s->len == 0) {
            pthread_mutex_unlock(&s->lock);
            errno = 0;
            return -1;
        }
        out->len = 0;
        s->taken_samples = s->taken_gone = s->taken_gone_samples = 0;
        n = read_run(s, take_from(s, fresh_from), max_bytes, out, &skipped);
        s->taken = n > 0;
        saved = errno;
        pthread_mutex_unlock(&s->lock);
    } while (skipped);
    if (n == 0) {
        errno = saved ? saved : EIO;
        return -1;
    }
    *count = (int)s->taken_samples; /* only this thread changes them */
    *first = s->taken_first;
    return 0;
}

void spool_ack(struct spool *s)
{
    pthread_mutex_lock(&s->lock);
    if (s->taken) {
        /* the taken batches left in the index, side by side: the bound removes only from the front */
        size_t i = index_from(s, s->taken_first), k = 0;
        while (i + k < s->len && s->entries[s->off + i + k].number <= s->taken_last)
            k++;
        remove_range(s, i, k);
        s->samples -= s->taken_samples;
        s->taken = 0;
    }
    pthread_mutex_unlock(&s->lock);
}

void spool_release(struct spool *s)
{
    pthread_mutex_lock(&s->lock);
    if (s->taken && s->taken_gone) {
        s->samples -= s->taken_gone_samples;
        s->dropped_samples += s->taken_gone_samples;
        LOG_ERR("spool %s is over %lld bytes: dropped its oldest %s (%lld samples)", s->dir, s->max_bytes,
                s->taken_gone > 1 ? "batches" : "batch", s->taken_gone_samples);
    }
    s->taken = 0;
    pthread_mutex_unlock(&s->lock);
}

unsigned long long spool_next(struct spool *s)
{
    pthread_mutex_lock(&s->lock);
    unsigned long long next = s->next;
    pthread_mutex_unlock(&s->lock);
    return next;
}

void spool_sync(struct spool *s)
{
    pthread_mutex_lock(&s->lock);
    size_t n = 0, from = s->len;
    while (from > 0 && s->entries[s->off + from - 1].number >= s->synced)
        from--, n++;
    struct spool_entry *todo = n ? malloc(n * sizeof *todo) : NULL;
    if (todo)
        memcpy(todo, s->entries + s->off + from, n * sizeof *todo);
    unsigned long long upto = s->next;
    pthread_mutex_unlock(&s->lock);
    if (!todo)
        return;
    /* outside the lock: the sampling thread writes on meanwhile; a file the sink took or the bound
     * dropped since is gone, and needs nothing */
    for (size_t i = 0; i < n; i++) {
        char path[1024];
        batch_path(s, &todo[i], path, sizeof path);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            fsync(fd);
            close(fd);
        }
    }
    free(todo);
    int dir = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
        fsync(dir);
        close(dir);
    }
    pthread_mutex_lock(&s->lock);
    if (upto > s->synced)
        s->synced = upto;
    pthread_mutex_unlock(&s->lock);
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
