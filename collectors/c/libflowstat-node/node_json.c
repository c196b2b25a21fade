#include "node_json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fsn_buf_append(struct fsn_buf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void fsn_buf_puts(struct fsn_buf *b, const char *s)
{
    fsn_buf_append(b, s, strlen(s));
}

void fsn_buf_printf(struct fsn_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        fsn_buf_append(b, tmp, (size_t)n);
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
    fsn_buf_append(b, big, (size_t)n);
    free(big);
}

void fsn_buf_utf8(struct fsn_buf *b, uint32_t cp)
{
    char out[4];
    size_t n;
    if (cp < 0x80) {
        out[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        out[0] = (char)(0xF0 | (cp >> 18));
        out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    fsn_buf_append(b, out, n);
}

void fsn_buf_free(struct fsn_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

static int continuation(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

uint32_t fsn_utf8_next(const unsigned char *s, size_t n, size_t *used)
{
    *used = 1;
    if (s[0] < 0x80)
        return s[0];
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (len == 0 || len > n)
        return 0xFFFD;
    uint32_t cp = s[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if (!continuation(s[i]))
            return 0xFFFD;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *used = len;
    return cp;
}

int fsn_utf8_valid(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    static const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    for (size_t i = 0; i < n;) {
        size_t used;
        uint32_t cp = fsn_utf8_next(s + i, n - i, &used);
        if (s[i] >= 0x80 && (used == 1 || cp < smallest[used] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)))
            return 0;
        i += used;
    }
    return 1;
}

static void json_escape_code_point(struct fsn_buf *b, uint32_t cp)
{
    static const char short_escapes[] = {['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    if (cp == '"' || cp == '\\') {
        char pair[2] = {'\\', (char)cp};
        fsn_buf_append(b, pair, 2);
    } else if (cp < sizeof short_escapes && short_escapes[cp]) {
        char pair[2] = {'\\', short_escapes[cp]};
        fsn_buf_append(b, pair, 2);
    } else if (cp >= 0x20 && cp < 0x7F) {
        char c = (char)cp;
        fsn_buf_append(b, &c, 1);
    } else if (cp < 0x10000) {
        fsn_buf_printf(b, "\\u%04x", (unsigned)cp);
    } else {
        cp -= 0x10000;
        fsn_buf_printf(b, "\\u%04x\\u%04x", (unsigned)(0xD800 | (cp >> 10)), (unsigned)(0xDC00 | (cp & 0x3FF)));
    }
}

void fsn_json_string(struct fsn_buf *b, const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    fsn_buf_append(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        size_t run = i;
        while (run < n && s[run] >= 0x20 && s[run] < 0x7F && s[run] != '"' && s[run] != '\\')
            run++;
        fsn_buf_append(b, text + i, run - i);
        if (run == n)
            break;
        size_t used;
        json_escape_code_point(b, fsn_utf8_next(s + run, n - run, &used));
        i = run + used;
    }
    fsn_buf_append(b, "\"", 1);
}

void fsn_json_open(struct fsn_json *j)
{
    memset(j, 0, sizeof *j);
    fsn_buf_append(&j->buf, "{", 1);
}

void fsn_json_close(struct fsn_json *j)
{
    fsn_buf_append(&j->buf, "}", 1);
}

void fsn_json_key(struct fsn_json *j, const char *key)
{
    if (j->members++)
        fsn_buf_append(&j->buf, ", ", 2);
    fsn_json_string(&j->buf, key, strlen(key));
    fsn_buf_append(&j->buf, ": ", 2);
}

void fsn_json_str(struct fsn_json *j, const char *key, const char *value)
{
    fsn_json_key(j, key);
    if (value)
        fsn_json_string(&j->buf, value, strlen(value));
    else
        fsn_buf_puts(&j->buf, "null");
}

void fsn_json_raw(struct fsn_json *j, const char *key, const char *json)
{
    fsn_json_key(j, key);
    fsn_buf_puts(&j->buf, json);
}

void fsn_json_uint(struct fsn_json *j, const char *key, uint64_t value)
{
    fsn_json_key(j, key);
    fsn_buf_printf(&j->buf, "%llu", (unsigned long long)value);
}

void fsn_json_int(struct fsn_json *j, const char *key, long long value)
{
    fsn_json_key(j, key);
    fsn_buf_printf(&j->buf, "%lld", value);
}

void fsn_json_bool(struct fsn_json *j, const char *key, int value)
{
    fsn_json_key(j, key);
    fsn_buf_puts(&j->buf, value ? "true" : "false");
}

void fsn_json_num(struct fsn_json *j, const char *key, double value, int decimals)
{
    fsn_json_key(j, key);
    if (!isfinite(value)) {
        fsn_buf_puts(&j->buf, "null");
        return;
    }
    /* Correctly rounded to `decimals` places (glibc), as Python's round(); trailing zeros dropped
     * but one decimal kept, so that it reads back as the same float json.dumps would have written. */
    char num[64];
    int n = snprintf(num, sizeof num, "%.*f", decimals, value == 0 ? 0.0 : value);
    if (n < 0 || (size_t)n >= sizeof num) {
        fsn_buf_printf(&j->buf, "%.17g", value);
        return;
    }
    char *dot = strchr(num, '.');
    if (dot) {
        char *end = num + n;
        while (end > dot + 2 && end[-1] == '0')
            *--end = '\0';
    }
    if (strcmp(num, "-0.0") == 0)
        fsn_buf_puts(&j->buf, "0.0");
    else
        fsn_buf_puts(&j->buf, dot ? num : strcat(num, ".0"));
}
