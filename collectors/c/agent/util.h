/* Small helpers shared by the agent's modules: time, bounded strings, numbers, logging. */
#ifndef FLOWSTAT_UTIL_H
#define FLOWSTAT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern int fs_quiet;

void fs_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define LOG_INFO(...)                    \
    do {                                 \
        if (!fs_quiet)                   \
            fs_log("INFO", __VA_ARGS__); \
    } while (0)
#define LOG_WARN(...) fs_log("WARNING", __VA_ARGS__)
#define LOG_ERR(...) fs_log("ERROR", __VA_ARGS__)

/* What refuses a command line or a config file (options.c, config.c): "flowstat-agent: " and the
 * message on stderr, as a line; or, between fs_refusal_capture(buf, n) and fs_refusal_capture(NULL,
 * 0), the first such message kept in buf instead (a reload says it in its own log line). The
 * sampling thread's only. */
void fs_refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fs_refusal_capture(char *buf, size_t n);

/* A macro's value as a string literal (for messages naming a limit). */
#define FS_STR_(x) #x
#define FS_STR(x) FS_STR_(x)

double fs_monotonic(void);
/* ISO-8601 UTC with milliseconds ("2026-11-22T10:51:14.123Z") of the current wall time. */
void fs_iso_now(char *out, size_t n, int64_t *epoch_ms);
/* ISO-8601 UTC with milliseconds of a Unix time in ms. */
void fs_iso_from_ms(char *out, size_t n, int64_t ms);
/* Copy with truncation; always NUL-terminates. */
void fs_strlcpy(char *dst, const char *src, size_t n);

/* This host's name as flowstat names it: given (--host-name), else Slurm's name for the node
 * ($SLURMD_NODENAME), else gethostname(). Hosts of a cluster often share a hostname. */
void fs_host_identity(const char *given, char *out, size_t n);
/* Shortest text that reads back as the same double (as Python's repr). */
void fs_format_double(char *out, size_t n, double v);

/* glibc's malloc (elsewhere both do nothing). Each time a block it had mmapped is freed, glibc
 * raises its mmap threshold to that block's size (up to 32 MiB): once a backlog has gone out in
 * requests of up to --send-max-kb, such blocks (requests, spool reads, answers) come from the heap,
 * which keeps them, and VmRSS steps up at each sink outage and stays there (issue 28, the soak).
 * fs_malloc_setup, at the start, fixes the threshold (and the trim threshold with it), so that they
 * go back to the system as they are freed; fs_malloc_trim, once a sink that was down has taken its
 * backlog, gives back what the backlog left free in the heaps (batches queued in memory while the
 * spool could not be written, the pieces of the larger blocks). */
void fs_malloc_setup(void);
void fs_malloc_trim(void);

/* A growable byte buffer; on allocation failure it marks itself failed and ignores writes. */
struct fs_buf {
    char *data;
    size_t len, cap;
    int failed;
};
void fs_buf_grow_append(struct fs_buf *b, const char *s, size_t n);
/* The common case inline (room left): appends happen dozens of times per sample. */
static inline void fs_buf_append(struct fs_buf *b, const char *s, size_t n)
{
    if (b->len + n < b->cap) {
        memcpy(b->data + b->len, s, n);
        b->len += n;
        b->data[b->len] = '\0';
    } else {
        fs_buf_grow_append(b, s, n);
    }
}
void fs_buf_puts(struct fs_buf *b, const char *s);
/* Append s, putting a backslash before every character of `escape` it contains. */
void fs_buf_escaped(struct fs_buf *b, const char *s, const char *escape);
void fs_buf_int(struct fs_buf *b, long long v);
void fs_buf_double(struct fs_buf *b, double v);
void fs_buf_printf(struct fs_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fs_buf_free(struct fs_buf *b);
/* Room for n more bytes at once (a batch whose size the last one told): no doubling and copying. */
void fs_buf_reserve(struct fs_buf *b, size_t n);
/* A JSON string literal, escaped as Python's json.dumps(ensure_ascii=False) does. */
void fs_buf_json_string(struct fs_buf *b, const char *text);
/* The same without its quotes: a part of a longer string. */
void fs_buf_json_inner(struct fs_buf *b, const char *text);

#endif
