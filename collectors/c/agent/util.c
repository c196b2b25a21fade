#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define FS_MMAP_THRESHOLD (128 * 1024) /* glibc's default, kept from then on */

int fs_quiet = 0;

void fs_malloc_setup(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, FS_MMAP_THRESHOLD);
#endif
}

void fs_malloc_trim(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

void fs_log(const char *level, const char *fmt, ...)
{
    char stamp[80]; /* what fs_iso_now could write for any year (gcc -O3 checks): 24 characters until 9999 */
    fs_iso_now(stamp, sizeof stamp, NULL);
    flockfile(stderr); /* the sink threads log too: one whole line at a time */
    fprintf(stderr, "%s flowstat-agent %s ", stamp, level);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    funlockfile(stderr);
}

static char *refusal; /* fs_refusal_capture's buffer; NULL: stderr */
static size_t refusal_size;

void fs_refusal_capture(char *buf, size_t n)
{
    refusal = n ? buf : NULL;
    refusal_size = n;
    if (refusal)
        refusal[0] = '\0';
}

void fs_refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (!refusal) {
        flockfile(stderr);
        fputs("flowstat-agent: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        funlockfile(stderr);
    } else if (!refusal[0]) { /* the first reason: what follows it may only repeat it */
        vsnprintf(refusal, refusal_size, fmt, ap);
    }
    va_end(ap);
}

double fs_monotonic(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void fs_iso_from_ms(char *out, size_t n, int64_t ms)
{
    struct tm tm;
    time_t secs = (time_t)(ms / 1000);
    gmtime_r(&secs, &tm);
    snprintf(out, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (int)(ms % 1000));
}

void fs_iso_now(char *out, size_t n, int64_t *epoch_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    fs_iso_from_ms(out, n, ms);
    if (epoch_ms)
        *epoch_ms = ms;
}

void fs_strlcpy(char *dst, const char *src, size_t n)
{
    if (n == 0)
        return;
    size_t len = strnlen(src, n - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
}

void fs_format_double(char *out, size_t n, double v)
{
    /* Python's repr: the shortest digits that read back as v, in fixed notation when the decimal
     * exponent is in [-4, 16), else as d.ddde+XX; always with a '.' or an exponent. Both agents
     * must write the same bytes. */
    char sci[40];
    if (!isfinite(v)) {
        snprintf(out, n, "0.0");
        return;
    }
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, v);
        if (strtod(sci, NULL) == v)
            break;
    }
    int exp10 = atoi(strchr(sci, 'e') + 1);
    if (exp10 < -4 || exp10 >= 16) {
        snprintf(out, n, "%s", sci);
        return;
    }
    int decimals = prec - 1 - exp10;
    snprintf(out, n, "%.*f", decimals > 0 ? decimals : 0, v);
    if (decimals <= 0 && strlen(out) + 2 < n)
        strcat(out, ".0");
}

void fs_buf_grow_append(struct fs_buf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void fs_buf_puts(struct fs_buf *b, const char *s)
{
    fs_buf_append(b, s, strlen(s));
}

void fs_buf_escaped(struct fs_buf *b, const char *s, const char *escape)
{
    for (;;) { /* whole runs of plain characters at a time: this is on every sample's path */
        size_t run = strcspn(s, escape);
        fs_buf_append(b, s, run);
        if (!s[run])
            return;
        char pair[2] = {'\\', s[run]};
        fs_buf_append(b, pair, 2);
        s += run + 1;
    }
}

void fs_buf_int(struct fs_buf *b, long long v)
{
    char tmp[24], *p = tmp + sizeof tmp;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    fs_buf_append(b, p, (size_t)(tmp + sizeof tmp - p));
}

void fs_buf_double(struct fs_buf *b, double v)
{
    /* Most numbers in samples are rates rounded to 0.1 (or whole): when v is exactly the double
     * nearest k/10, its shortest text is "I.D", as Python writes it, with no search. */
    if (isfinite(v) && fabs(v) < 1e15 && !(v == 0 && signbit(v))) {
        long long k = llround(v * 10.0);
        if ((double)k / 10.0 == v) {
            unsigned long long a = k < 0 ? 0ULL - (unsigned long long)k : (unsigned long long)k;
            if (k < 0)
                fs_buf_append(b, "-", 1);
            fs_buf_int(b, (long long)(a / 10));
            char frac[2] = {'.', (char)('0' + a % 10)};
            fs_buf_append(b, frac, 2);
            return;
        }
    }
    char num[40];
    fs_format_double(num, sizeof num, v);
    fs_buf_puts(b, num);
}

void fs_buf_printf(struct fs_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        fs_buf_append(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    fs_buf_append(b, big, (size_t)n);
    free(big);
}

void fs_buf_free(struct fs_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

void fs_buf_json_inner(struct fs_buf *b, const char *text)
{
    static const char short_escapes[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    const unsigned char *c = (const unsigned char *)text;
    for (;;) { /* whole runs of plain characters at a time: this is on every document's path */
        const unsigned char *run = c;
        while (*c >= 0x20 && *c != '"' && *c != '\\')
            c++;
        fs_buf_append(b, (const char *)run, (size_t)(c - run));
        if (!*c)
            return;
        char esc[8];
        if (*c == '"' || *c == '\\')
            snprintf(esc, sizeof esc, "\\%c", *c);
        else if (*c < sizeof short_escapes && short_escapes[*c])
            snprintf(esc, sizeof esc, "\\%c", short_escapes[*c]);
        else
            snprintf(esc, sizeof esc, "\\u%04x", *c);
        fs_buf_puts(b, esc);
        c++;
    }
}

void fs_buf_json_string(struct fs_buf *b, const char *text)
{
    fs_buf_append(b, "\"", 1);
    fs_buf_json_inner(b, text);
    fs_buf_append(b, "\"", 1);
}

void fs_buf_reserve(struct fs_buf *b, size_t n)
{
    if (b->failed || b->len + n + 1 <= b->cap)
        return;
    char *p = realloc(b->data, b->len + n + 1);
    if (!p) {
        b->failed = 1;
        return;
    }
    b->data = p;
    b->cap = b->len + n + 1;
}

void fs_host_identity(const char *given, char *out, size_t n)
{
    const char *slurm = getenv("SLURMD_NODENAME");
    if (given && *given)
        fs_strlcpy(out, given, n);
    else if (slurm && *slurm)
        fs_strlcpy(out, slurm, n);
    else if (gethostname(out, n) != 0)
        fs_strlcpy(out, "", n);
    if (n)
        out[n - 1] = '\0';
}
