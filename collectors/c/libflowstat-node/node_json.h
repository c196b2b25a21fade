/* Writing the control replies: a growable buffer and a JSON object writer that writes as Python's
 * json.dumps does (", " and ": " separators, strings ASCII-only with \u escapes). */
#ifndef FLOWSTAT_NODE_JSON_H
#define FLOWSTAT_NODE_JSON_H

#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer, always NUL-terminated once written; on allocation failure it marks itself
 * failed and ignores further writes. */
struct fsn_buf {
    char *data;
    size_t len, cap;
    int failed;
};
void fsn_buf_append(struct fsn_buf *b, const char *s, size_t n);
void fsn_buf_puts(struct fsn_buf *b, const char *s);
void fsn_buf_printf(struct fsn_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append one code point in UTF-8 (surrogates too, as Python's "surrogatepass" writes them). */
void fsn_buf_utf8(struct fsn_buf *b, uint32_t cp);
void fsn_buf_free(struct fsn_buf *b);

/* The code point of the UTF-8 sequence at s (n bytes left), its length in *used; surrogates are
 * read as code points. Invalid bytes read as U+FFFD, one byte used. */
uint32_t fsn_utf8_next(const unsigned char *s, size_t n, size_t *used);
/* Whether s (n bytes) is strict UTF-8 (no surrogates, no overlong forms). */
int fsn_utf8_valid(const char *s, size_t n);

/* A JSON string literal of the UTF-8 text s (n bytes), as json.dumps(ensure_ascii=True) writes it. */
void fsn_json_string(struct fsn_buf *b, const char *s, size_t n);

/* An object written member by member: open, members, close. */
struct fsn_json {
    struct fsn_buf buf;
    int members;
};
void fsn_json_open(struct fsn_json *j);
void fsn_json_close(struct fsn_json *j);
void fsn_json_key(struct fsn_json *j, const char *key);
void fsn_json_str(struct fsn_json *j, const char *key, const char *value); /* NULL: null */
void fsn_json_raw(struct fsn_json *j, const char *key, const char *json);
void fsn_json_uint(struct fsn_json *j, const char *key, uint64_t value);
void fsn_json_int(struct fsn_json *j, const char *key, long long value);
void fsn_json_bool(struct fsn_json *j, const char *key, int value);
/* value rounded to `decimals` places, written as a float (at least one decimal: 3.0); NaN: null. */
void fsn_json_num(struct fsn_json *j, const char *key, double value, int decimals);

#endif
