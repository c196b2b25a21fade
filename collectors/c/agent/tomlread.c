/* The config files' TOML (tomlread.h), in one pass: each function reads one thing and answers 0,
 * or -1 once fail() has said what is wrong and on which line. */
#include "tomlread.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define NOT_HERE "not supported by flowstat's agent config"
#define NAME_MAX_LEN 200 /* ${NAME} */

struct reader {
    const char *p, *end; /* what is left to read */
    int line;
    const char *key; /* the key whose value is read now, named in messages; NULL: none */
    toml_lookup_fn lookup;
    int *err_line;
    char *err;
    size_t errlen;
};

static int fail(struct reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct reader *r, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (r->key)
        snprintf(r->err, r->errlen, "%s: %s", r->key, what);
    else
        snprintf(r->err, r->errlen, "%s", what);
    *r->err_line = r->line;
    return -1;
}

/* -- characters -------------------------------------------------------------------------------- */

static int is_bare(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* What a number, a boolean, a date or a time may be made of. */
static int is_word(char c)
{
    return is_bare(c) || c == '+' || c == '.' || c == ':';
}

static int is_control(unsigned char c)
{
    return (c < 0x20 && c != '\t') || c == 0x7f;
}

static int digit_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The length of the UTF-8 sequence at s (n > 0 bytes left), or 0 if it is not one: no overlong
 * form, no surrogate, nothing past U+10FFFF. */
static size_t utf8_length(const unsigned char *s, size_t n)
{
    size_t len;
    uint32_t cp, least;
    if (s[0] < 0x80)
        return 1;
    if ((s[0] & 0xe0) == 0xc0)
        len = 2, cp = s[0] & 0x1fu, least = 0x80;
    else if ((s[0] & 0xf0) == 0xe0)
        len = 3, cp = s[0] & 0x0fu, least = 0x800;
    else if ((s[0] & 0xf8) == 0xf0)
        len = 4, cp = s[0] & 0x07u, least = 0x10000;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3fu);
    }
    return cp < least || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : len;
}

static int utf8_valid(const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text);
    for (size_t i = 0, len; i < n; i += len)
        if ((len = utf8_length(s + i, n - i)) == 0)
            return 0;
    return 1;
}

static size_t utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* How much of what comes next to show in a message: up to 20 bytes of the line, whole characters. */
static int shown(const struct reader *r)
{
    size_t n = 0;
    while (r->p + n < r->end && n < 20 && r->p[n] != '\n' && r->p[n] != '\r')
        n++;
    while (n > 0 && r->p + n < r->end && ((unsigned char)r->p[n] & 0xc0) == 0x80)
        n--;
    return (int)n;
}

/* How much of a word (ASCII: is_word) to show in a message. */
static int shown_word(size_t n)
{
    return (int)(n < 40 ? n : 40);
}

/* The whole text is UTF-8 without NUL (TOML's rule): checked once, before anything is read. */
static int check_text(struct reader *r)
{
    const unsigned char *s = (const unsigned char *)r->p;
    size_t n = (size_t)(r->end - r->p), len;
    for (size_t i = 0; i < n; i += len) {
        len = s[i] ? utf8_length(s + i, n - i) : 0;
        if (len == 0)
            return fail(r, s[i] ? "not UTF-8 text" : "a NUL byte");
        r->line += s[i] == '\n';
    }
    r->line = 1;
    return 0;
}

/* -- spaces, comments, line ends --------------------------------------------------------------- */

static void skip_spaces(struct reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t'))
        r->p++;
}

static int at_line_end(const struct reader *r)
{
    return r->p == r->end || *r->p == '\n' || *r->p == '\r';
}

/* '#' up to the line's end (not included). */
static int skip_comment(struct reader *r)
{
    for (r->p++; !at_line_end(r); r->p++)
        if (is_control((unsigned char)*r->p))
            return fail(r, "a control character in a comment");
    return 0;
}

/* "\n", "\r\n", or the end of the text. */
static int end_of_line(struct reader *r)
{
    if (r->p == r->end)
        return 0;
    if (*r->p == '\r' && (r->end - r->p < 2 || r->p[1] != '\n'))
        return fail(r, "a carriage return without a line feed");
    r->p += *r->p == '\r' ? 2 : 1;
    r->line++;
    return 0;
}

/* After a value: spaces, a comment, the line's end. */
static int rest_of_line(struct reader *r)
{
    skip_spaces(r);
    if (r->p < r->end && *r->p == '#' && skip_comment(r) != 0)
        return -1;
    if (!at_line_end(r))
        return fail(r, "unexpected '%.*s' after the value", shown(r), r->p);
    return end_of_line(r);
}

/* What an array may hold between its items: spaces, line ends, comments. */
static int skip_blank(struct reader *r)
{
    for (;;) {
        skip_spaces(r);
        if (r->p < r->end && *r->p == '#' && skip_comment(r) != 0)
            return -1;
        if (r->p == r->end || (*r->p != '\n' && *r->p != '\r'))
            return 0;
        if (end_of_line(r) != 0)
            return -1;
    }
}

/* -- values ------------------------------------------------------------------------------------ */

/* Takes text (NULL: out of memory), freeing it if it cannot. */
static int add_value(struct reader *r, struct toml_entry *e, enum toml_kind kind, char *text)
{
    if (!text)
        return fail(r, "out of memory");
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 4;
        struct toml_value *grown = realloc(e->values, cap * sizeof *grown);
        if (!grown) {
            free(text);
            return fail(r, "out of memory");
        }
        e->values = grown;
        e->cap = cap;
    }
    e->values[e->n++] = (struct toml_value){kind, text};
    return 0;
}

/* A buffer's text, handed over (NULL if it ran out of memory). */
static char *take_text(struct fs_buf *b)
{
    char *text = b->failed ? NULL : b->data ? b->data : strdup("");
    if (!text)
        free(b->data);
    memset(b, 0, sizeof *b);
    return text;
}

/* \uXXXX or \UXXXXXXXX (after the u or U): the character, UTF-8 encoded. */
static int unicode_escape(struct reader *r, int ndigits, struct fs_buf *out)
{
    uint32_t cp = 0;
    for (int i = 0; i < ndigits; i++, r->p++) {
        int d = r->p < r->end ? digit_value(*r->p) : -1;
        if (d < 0)
            return fail(r, "\\%c takes %d hexadecimal digits", ndigits == 4 ? 'u' : 'U', ndigits);
        cp = cp << 4 | (uint32_t)d;
    }
    if (cp == 0)
        return fail(r, "\\u0000: a value cannot hold a NUL");
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return fail(r, "\\%c%0*X is not a Unicode character", ndigits == 4 ? 'u' : 'U', ndigits, (unsigned)cp);
    char utf8[4];
    fs_buf_append(out, utf8, utf8_encode(cp, utf8));
    return 0;
}

/* A basic string's escape (at the backslash). */
static int escape(struct reader *r, struct fs_buf *out)
{
    static const char from[] = "\"\\ntrbf", to[] = "\"\\\n\t\r\b\f";
    r->p++;
    if (at_line_end(r))
        return fail(r, "unterminated string (a string ends on its line)");
    const char *k = strchr(from, *r->p);
    if (k) {
        fs_buf_append(out, &to[k - from], 1);
        r->p++;
        return 0;
    }
    if (*r->p == 'u' || *r->p == 'U') {
        int ndigits = *r->p++ == 'u' ? 4 : 8;
        return unicode_escape(r, ndigits, out);
    }
    int len = (int)utf8_length((const unsigned char *)r->p, (size_t)(r->end - r->p));
    return fail(r, "unknown escape '\\%.*s' in a string", len, r->p);
}

/* The text of a "..." (escapes read) or '...' string, after its opening quote. */
static int string_text(struct reader *r, char quote, struct fs_buf *out)
{
    while (!at_line_end(r) && *r->p != quote) {
        if (is_control((unsigned char)*r->p))
            return fail(r, "a control character in a string (write it as an escape: \\t, \\u0001...)");
        if (quote == '"' && *r->p == '\\') {
            if (escape(r, out) != 0)
                return -1;
            continue;
        }
        fs_buf_append(out, r->p++, 1);
    }
    if (at_line_end(r))
        return fail(r, "unterminated string (a string ends on its line)");
    r->p++;
    return 0;
}

static int is_name_char(char c, int first)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || (!first && c >= '0' && c <= '9');
}

/* ${NAME} at s (n bytes left): the variable's value; *used: the characters it took. */
static int variable(struct reader *r, const char *s, size_t n, struct fs_buf *out, size_t *used)
{
    size_t len = 0;
    while (2 + len < n && len <= NAME_MAX_LEN && is_name_char(s[2 + len], len == 0))
        len++;
    if (len > NAME_MAX_LEN)
        return fail(r, "${...}: a name longer than %d characters", NAME_MAX_LEN);
    if (len == 0 || 2 + len >= n || s[2 + len] != '}')
        return fail(r,
                    "'${' is not followed by NAME and '}' (letters, digits and _, not a digit first); "
                    "write $${ for a literal ${");
    char name[NAME_MAX_LEN + 1];
    memcpy(name, s + 2, len);
    name[len] = '\0';
    const char *value = r->lookup ? r->lookup(name) : NULL;
    if (!value)
        return fail(r, "the environment variable %s is not set (${%s})", name, name);
    if (!utf8_valid(value))
        return fail(r, "the environment variable %s is not UTF-8 text", name);
    fs_buf_puts(out, value);
    *used = 2 + len + 1;
    return 0;
}

/* A string's text with ${NAME} replaced by the environment's NAME, and $${ by ${. */
static int substitute(struct reader *r, const char *s, size_t n, struct fs_buf *out)
{
    size_t i = 0, used = 0;
    while (i < n) {
        if (s[i] == '$' && i + 2 < n && s[i + 1] == '$' && s[i + 2] == '{') {
            fs_buf_append(out, "${", 2);
            i += 3;
        } else if (s[i] == '$' && i + 1 < n && s[i + 1] == '{') {
            if (variable(r, s + i, n - i, out, &used) != 0)
                return -1;
            i += used;
        } else {
            fs_buf_append(out, s + i++, 1);
        }
    }
    return 0;
}

static int string_value(struct reader *r, struct toml_entry *e)
{
    char quote = *r->p;
    if (r->end - r->p >= 3 && r->p[1] == quote && r->p[2] == quote)
        return fail(r, "multi-line strings (%c%c%c) are " NOT_HERE, quote, quote, quote);
    r->p++;
    struct fs_buf raw = {0}, text = {0};
    int rc = string_text(r, quote, &raw);
    if (rc == 0 && raw.failed)
        rc = fail(r, "out of memory");
    if (rc == 0)
        rc = substitute(r, raw.data ? raw.data : "", raw.len, &text);
    fs_buf_free(&raw);
    if (rc != 0) {
        fs_buf_free(&text);
        return -1;
    }
    return add_value(r, e, TOML_STRING, take_text(&text));
}

/* Digits of base, '_' only between two of them, appended to out without the '_': how many
 * characters of t[0..n) they are. */
static size_t digits(const char *t, size_t n, int base, struct fs_buf *out)
{
    size_t i = 0;
    for (; i < n; i++) {
        int d = digit_value(t[i]);
        if (d >= 0 && d < base) {
            fs_buf_append(out, t + i, 1);
            continue;
        }
        int next = i + 1 < n ? digit_value(t[i + 1]) : -1;
        if (t[i] != '_' || i == 0 || next < 0 || next >= base)
            break;
    }
    return i;
}

/* A decimal integer or a float ([+-]int[.frac][e[+-]exp], no leading zero): its kind in *kind and
 * its text without '_' in out; -1 if malformed. */
static int decimal_text(const char *t, size_t n, enum toml_kind *kind, struct fs_buf *out)
{
    size_t i = t[0] == '+' || t[0] == '-' ? 1 : 0;
    if (t[0] == '-')
        fs_buf_append(out, "-", 1);
    size_t len = digits(t + i, n - i, 10, out);
    if (len == 0 || (len > 1 && t[i] == '0'))
        return -1;
    i += len;
    *kind = TOML_INTEGER;
    if (i < n && t[i] == '.') {
        fs_buf_append(out, ".", 1);
        len = digits(t + i + 1, n - i - 1, 10, out);
        if (len == 0)
            return -1;
        i += 1 + len;
        *kind = TOML_FLOAT;
    }
    if (i < n && (t[i] == 'e' || t[i] == 'E')) {
        fs_buf_append(out, "e", 1);
        if (++i < n && (t[i] == '+' || t[i] == '-'))
            fs_buf_append(out, t + i++, 1);
        len = digits(t + i, n - i, 10, out);
        if (len == 0)
            return -1;
        i += len;
        *kind = TOML_FLOAT;
    }
    return i == n ? 0 : -1;
}

static int integer_value(struct reader *r, struct toml_entry *e, long long v)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", v);
    return add_value(r, e, TOML_INTEGER, strdup(text));
}

static int decimal_value(struct reader *r, struct toml_entry *e, const char *t, size_t n)
{
    struct fs_buf text = {0};
    enum toml_kind kind = TOML_INTEGER;
    int malformed = decimal_text(t, n, &kind, &text) != 0, failed = text.failed;
    if (malformed || failed) {
        fs_buf_free(&text);
        return failed ? fail(r, "out of memory") : fail(r, "malformed number '%.*s'", shown_word(n), t);
    }
    if (kind == TOML_FLOAT)
        return add_value(r, e, kind, take_text(&text));
    errno = 0;
    long long v = strtoll(text.data, NULL, 10);
    int range = errno == ERANGE;
    fs_buf_free(&text);
    return range ? fail(r, "integer '%.*s' out of range (64 bits)", shown_word(n), t) : integer_value(r, e, v);
}

/* 0x..., 0o..., 0b... */
static int based_value(struct reader *r, struct toml_entry *e, const char *t, size_t n)
{
    int base = t[1] == 'x' ? 16 : t[1] == 'o' ? 8 : 2;
    struct fs_buf d = {0};
    size_t len = digits(t + 2, n - 2, base, &d);
    int ok = len > 0 && 2 + len == n && !d.failed;
    unsigned long long v = 0;
    for (size_t i = 0; ok && i < d.len; i++) {
        v = v * (unsigned)base + (unsigned)digit_value(d.data[i]);
        ok = v <= LLONG_MAX;
    }
    fs_buf_free(&d);
    if (!ok)
        return fail(r, "malformed or out of range integer '%.*s'", shown_word(n), t);
    return integer_value(r, e, (long long)v);
}

/* NNNN-NN-... or NN:NN...: what a date or a time starts with. */
static int is_date_or_time(const char *t, size_t n)
{
    size_t i = 0;
    while (i < n && i < 4 && t[i] >= '0' && t[i] <= '9')
        i++;
    return i < n && ((i == 4 && t[i] == '-') || (i == 2 && t[i] == ':'));
}

static int is_one_of(const char *t, size_t n, const char *const *words)
{
    for (; *words; words++)
        if (strlen(*words) == n && memcmp(t, *words, n) == 0)
            return 1;
    return 0;
}

/* A number, a boolean, or what is not a value (a date, a bare word). */
static int word_value(struct reader *r, struct toml_entry *e)
{
    static const char *const specials[] = {"inf", "+inf", "-inf", "nan", "+nan", "-nan", NULL};
    static const char *const booleans[] = {"true", "false", NULL};
    const char *t = r->p;
    size_t n = 0;
    while (r->p + n < r->end && is_word(r->p[n]))
        n++;
    if (n == 0)
        return at_line_end(r) || *r->p == '#' ? fail(r, "a value is missing")
                                              : fail(r, "expected a value, got '%.*s'", shown(r), r->p);
    r->p += n;
    if (is_one_of(t, n, booleans))
        return add_value(r, e, TOML_BOOLEAN, strdup(t[0] == 't' ? "true" : "false"));
    if (is_date_or_time(t, n))
        return fail(r, "dates and times are " NOT_HERE " (write a string)");
    if (is_one_of(t, n, specials))
        return add_value(r, e, TOML_FLOAT, strndup(t, n));
    if (n > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'o' || t[1] == 'b'))
        return based_value(r, e, t, n);
    if ((t[0] >= '0' && t[0] <= '9') || t[0] == '+' || t[0] == '-')
        return decimal_value(r, e, t, n);
    return fail(r, "expected a value (a \"string\", a number, true, false or an [array]), got '%.*s'", shown_word(n),
                t);
}

static int scalar_value(struct reader *r, struct toml_entry *e)
{
    if (r->p < r->end && (*r->p == '"' || *r->p == '\''))
        return string_value(r, e);
    if (r->p < r->end && *r->p == '{')
        return fail(r, "inline tables ({...}) are " NOT_HERE);
    if (r->p < r->end && *r->p == '[')
        return fail(r, "arrays of arrays are " NOT_HERE);
    return word_value(r, e);
}

/* The text ended in an array: said at the line of its key. */
static int unterminated(struct reader *r, const struct toml_entry *e)
{
    r->line = e->line;
    return fail(r, "unterminated array (no ']')");
}

/* [ item, item, ... ] over as many lines as it takes. */
static int array_value(struct reader *r, struct toml_entry *e)
{
    e->array = 1;
    r->p++;
    for (;;) {
        if (skip_blank(r) != 0)
            return -1;
        if (r->p < r->end && *r->p == ']')
            break;
        if (r->p == r->end)
            return unterminated(r, e);
        if (scalar_value(r, e) != 0 || skip_blank(r) != 0)
            return -1;
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == ']')
            break;
        return r->p == r->end ? unterminated(r, e)
                              : fail(r, "expected ',' or ']' in the array, got '%.*s'", shown(r), r->p);
    }
    r->p++;
    return 0;
}

/* -- lines ------------------------------------------------------------------------------------- */

static int read_key(struct reader *r, char *key)
{
    size_t n = 0;
    while (r->p + n < r->end && is_bare(r->p[n]))
        n++;
    if (n == 0 && (*r->p == '"' || *r->p == '\''))
        return fail(r, "quoted keys are " NOT_HERE " (a key is letters, digits, _ and -)");
    if (n == 0)
        return fail(r, "expected a key, got '%.*s'", shown(r), r->p);
    if (n > TOML_KEY_MAX)
        return fail(r, "a key longer than %d characters", TOML_KEY_MAX);
    memcpy(key, r->p, n);
    key[n] = '\0';
    r->p += n;
    return 0;
}

static struct toml_entry *add_entry(struct reader *r, struct toml_doc *doc, const char *key)
{
    for (size_t i = 0; i < doc->n; i++)
        if (strcmp(doc->entries[i].key, key) == 0) {
            fail(r, "given twice (first on line %d): a key may be given once in a file", doc->entries[i].line);
            return NULL;
        }
    if (doc->n == doc->cap) {
        size_t cap = doc->cap ? doc->cap * 2 : 16;
        struct toml_entry *grown = realloc(doc->entries, cap * sizeof *grown);
        if (!grown) {
            fail(r, "out of memory");
            return NULL;
        }
        doc->entries = grown;
        doc->cap = cap;
    }
    struct toml_entry *e = &doc->entries[doc->n];
    memset(e, 0, sizeof *e);
    if (!(e->key = strdup(key))) {
        fail(r, "out of memory");
        return NULL;
    }
    e->line = r->line;
    doc->n++;
    return e;
}

/* key = value, at the key. */
static int key_value(struct reader *r, struct toml_doc *doc)
{
    char key[TOML_KEY_MAX + 1];
    if (read_key(r, key) != 0)
        return -1;
    r->key = key;
    skip_spaces(r);
    if (r->p < r->end && *r->p == '.')
        return fail(r, "dotted keys (%s.name) are " NOT_HERE, key);
    if (r->p == r->end || *r->p != '=')
        return fail(r, "expected '=' after the key");
    r->p++;
    skip_spaces(r);
    struct toml_entry *e = add_entry(r, doc, key);
    if (!e)
        return -1;
    int rc = r->p < r->end && *r->p == '[' ? array_value(r, e) : scalar_value(r, e);
    if (rc == 0)
        rc = rest_of_line(r);
    r->key = NULL;
    return rc;
}

static int read_line(struct reader *r, struct toml_doc *doc)
{
    skip_spaces(r);
    if (at_line_end(r) || *r->p == '#')
        return rest_of_line(r);
    if (*r->p == '[')
        return fail(r, "%s are " NOT_HERE ": write key = value lines",
                    r->end - r->p > 1 && r->p[1] == '[' ? "arrays of tables ([[name]])" : "tables ([name])");
    return key_value(r, doc);
}

int toml_parse(const char *text, size_t len, toml_lookup_fn lookup, struct toml_doc *doc, int *err_line, char *err,
               size_t errlen)
{
    memset(doc, 0, sizeof *doc);
    if (!text)
        text = "", len = 0;
    struct reader r = {text, text + len, 1, NULL, lookup, err_line, err, errlen};
    *err_line = 0;
    if (errlen)
        err[0] = '\0';
    if (check_text(&r) != 0)
        return -1;
    while (r.p < r.end)
        if (read_line(&r, doc) != 0)
            return -1;
    return 0;
}

void toml_free(struct toml_doc *doc)
{
    for (size_t i = 0; i < doc->n; i++) {
        struct toml_entry *e = &doc->entries[i];
        for (size_t k = 0; k < e->n; k++)
            free(e->values[k].text);
        free(e->values);
        free(e->key);
    }
    free(doc->entries);
    memset(doc, 0, sizeof *doc);
}
