#include "node_request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "node_json.h"

#define STR_(x) #x
#define STR(x) STR_(x)

static const char *const COMMAND_NAMES[] = {"check-state", "get-metrics", "start", "stop", "clock"};
#define KNOWN_COMMANDS "check-state, get-metrics, start, stop, clock"

/* -- Python's utf-8 codec (with "surrogatepass", as json.loads decodes bytes) ------------------- */

struct decode_error {
    size_t start, end; /* the bytes it could not decode */
    const char *reason;
};

static int continuation(unsigned char c)
{
    return (c & 0xC0) == 0x80;
}

static int undecodable(struct decode_error *e, size_t start, size_t end, const char *reason)
{
    e->start = start;
    e->end = end;
    e->reason = reason;
    return -1;
}

/* The length of the sequence at s[i] (3 or 4 bytes long at its lead), or -1 with the error, in
 * CPython's order of checks: what it reports for a truncated or broken sequence. */
static int three_byte_sequence(const unsigned char *s, size_t i, size_t n, struct decode_error *e)
{
    unsigned char c = s[i];
    if (n - i < 2)
        return undecodable(e, i, n, "unexpected end of data");
    unsigned char c2 = s[i + 1];
    int bad2 = !continuation(c2) || (c == 0xE0 && c2 < 0xA0);
    int surrogate = c == 0xED && c2 >= 0xA0 && continuation(c2);
    if (bad2 || (surrogate && (n - i < 3 || !continuation(s[i + 2]))))
        return undecodable(e, i, i + 1, "invalid continuation byte");
    if (n - i < 3)
        return undecodable(e, i, n, "unexpected end of data");
    if (!continuation(s[i + 2]))
        return undecodable(e, i, i + 2, "invalid continuation byte");
    return 3; /* a surrogate too: "surrogatepass" lets it through */
}

static int four_byte_sequence(const unsigned char *s, size_t i, size_t n, struct decode_error *e)
{
    unsigned char c = s[i];
    if (n - i < 2)
        return undecodable(e, i, n, "unexpected end of data");
    unsigned char c2 = s[i + 1];
    if (!continuation(c2) || (c == 0xF0 && c2 < 0x90) || (c == 0xF4 && c2 >= 0x90))
        return undecodable(e, i, i + 1, "invalid continuation byte");
    if (n - i < 3)
        return undecodable(e, i, n, "unexpected end of data");
    if (!continuation(s[i + 2]))
        return undecodable(e, i, i + 2, "invalid continuation byte");
    if (n - i < 4)
        return undecodable(e, i, n, "unexpected end of data");
    if (!continuation(s[i + 3]))
        return undecodable(e, i, i + 3, "invalid continuation byte");
    return 4;
}

static int check_utf8(const unsigned char *s, size_t n, struct decode_error *e)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        int used = 1;
        if (c >= 0x80 && (c < 0xC2 || c > 0xF4))
            return undecodable(e, i, i + 1, "invalid start byte");
        if (c >= 0xC2 && c < 0xE0) {
            if (n - i < 2)
                return undecodable(e, i, n, "unexpected end of data");
            if (!continuation(s[i + 1]))
                return undecodable(e, i, i + 1, "invalid continuation byte");
            used = 2;
        } else if (c >= 0xE0 && c < 0xF0) {
            used = three_byte_sequence(s, i, n, e);
        } else if (c >= 0xF0) {
            used = four_byte_sequence(s, i, n, e);
        }
        if (used < 0)
            return -1;
        i += (size_t)used;
    }
    return 0;
}

/* json.detect_encoding: which bytes Python would not read as UTF-8 at all. */
static int python_reads_as_utf8(const unsigned char *s, size_t n)
{
    if (n >= 2 && ((s[0] == 0xFF && s[1] == 0xFE) || (s[0] == 0xFE && s[1] == 0xFF)))
        return 0; /* UTF-16 or UTF-32 byte order marks */
    if (n >= 4 && s[0] == 0 && s[1] == 0 && s[2] == 0xFE && s[3] == 0xFF)
        return 0;
    if (n >= 4 && (!s[0] || !s[1]))
        return 0;
    if (n == 2 && (!s[0] || !s[1]))
        return 0;
    return 1;
}

/* -- Python's json scanner ------------------------------------------------------------------- */

enum kind { K_OTHER, K_OBJECT, K_STRING, K_INTEGER, K_TRUE, K_FALSE };

struct value {
    enum kind kind;
    size_t start, end;
};

struct members { /* the top-level object's members that matter (the last of each name, as a dict keeps) */
    int has_command, has_id;
    struct value command, id;
    struct fsn_buf key;
};

struct parser {
    const unsigned char *s;
    size_t len;
    const char *error; /* the JSONDecodeError's message ... */
    size_t error_at; /* ... and where (a byte offset) */
};

static int fail(struct parser *p, const char *message, size_t at)
{
    p->error = message;
    p->error_at = at;
    return -1;
}

static size_t skip_whitespace(const struct parser *p, size_t i)
{
    while (i < p->len && (p->s[i] == ' ' || p->s[i] == '\t' || p->s[i] == '\n' || p->s[i] == '\r'))
        i++;
    return i;
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int read_hex4(const unsigned char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = s[i];
        int d = is_digit(c)          ? c - '0'
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                     : -1;
        if (d < 0)
            return -1;
        v = (v << 4) | (uint32_t)d;
    }
    *out = v;
    return 0;
}

static int simple_escape(unsigned char c)
{
    switch (c) {
    case '"':
    case '\\':
    case '/':
        return c;
    case 'b':
        return '\b';
    case 'f':
        return '\f';
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    default:
        return -1;
    }
}

/* A \uXXXX escape (and the low half of a surrogate pair after it) at s[i] = 'u'; *next past it. */
static int unicode_escape(struct parser *p, size_t i, uint32_t *cp, size_t *next)
{
    size_t end = i + 5;
    if (end >= p->len)
        return fail(p, "Invalid \\uXXXX escape", i);
    if (read_hex4(p->s + i + 1, cp) < 0)
        return fail(p, "Invalid \\uXXXX escape", end - 5);
    if (*cp >= 0xD800 && *cp <= 0xDBFF && end + 6 < p->len && p->s[end] == '\\' && p->s[end + 1] == 'u') {
        uint32_t low;
        if (read_hex4(p->s + end + 2, &low) < 0)
            return fail(p, "Invalid \\uXXXX escape", end + 1);
        if (low >= 0xDC00 && low <= 0xDFFF) {
            *cp = 0x10000 + ((*cp - 0xD800) << 10) + (low - 0xDC00);
            end += 6;
        }
    }
    *next = end;
    return 0;
}

/* A string whose opening quote is at i - 1; its text into out (when not NULL); *next past it. */
static int scan_string(struct parser *p, size_t i, struct fsn_buf *out, size_t *next)
{
    size_t begin = i - 1;
    for (;;) {
        size_t j = i;
        for (; j < p->len && p->s[j] != '"' && p->s[j] != '\\'; j++)
            if (p->s[j] <= 0x1F)
                return fail(p, "Invalid control character at", j);
        if (j >= p->len)
            return fail(p, "Unterminated string starting at", begin);
        if (out)
            fsn_buf_append(out, (const char *)p->s + i, j - i);
        if (p->s[j] == '"') {
            *next = j + 1;
            return 0;
        }
        if (++j == p->len)
            return fail(p, "Unterminated string starting at", begin);
        uint32_t cp;
        if (p->s[j] != 'u') {
            int c = simple_escape(p->s[j]);
            if (c < 0)
                return fail(p, "Invalid \\escape", j - 1);
            cp = (uint32_t)c;
            i = j + 1;
        } else if (unicode_escape(p, j, &cp, &i) < 0) {
            return -1;
        }
        if (out)
            fsn_buf_utf8(out, cp);
    }
}

/* A number as Python's scanner matches it; no number: "Expecting value". */
static int match_number(struct parser *p, size_t i, struct value *v, size_t *next)
{
    size_t start = i;
    const unsigned char *s = p->s;
    if (s[i] == '-' && ++i >= p->len)
        return fail(p, "Expecting value", start);
    if (s[i] >= '1' && s[i] <= '9') {
        while (i < p->len && is_digit(s[i]))
            i++;
    } else if (s[i] == '0') {
        i++;
    } else {
        return fail(p, "Expecting value", start);
    }
    v->kind = K_INTEGER;
    if (i + 1 < p->len && s[i] == '.' && is_digit(s[i + 1])) {
        v->kind = K_OTHER;
        for (i += 2; i < p->len && is_digit(s[i]);)
            i++;
    }
    if (i + 1 < p->len && (s[i] == 'e' || s[i] == 'E')) {
        size_t exponent = i++;
        if (i + 1 < p->len && (s[i] == '-' || s[i] == '+'))
            i++;
        while (i < p->len && is_digit(s[i]))
            i++;
        if (is_digit(s[i - 1]))
            v->kind = K_OTHER;
        else
            i = exponent;
    }
    *next = i;
    return 0;
}

static int scan_value(struct parser *p, size_t i, int depth, struct members *m, struct value *v, size_t *next);

static int key_is(const struct fsn_buf *key, const char *name)
{
    return key->len == strlen(name) && memcmp(key->data, name, key->len) == 0;
}

static void remember_member(struct members *m, const struct value *v)
{
    if (key_is(&m->key, "command")) {
        m->has_command = 1;
        m->command = *v;
    } else if (key_is(&m->key, "id")) {
        m->has_id = 1;
        m->id = *v;
    }
}

/* An object whose '{' is at i - 1; the members of the top-level one into m. */
static int parse_object(struct parser *p, size_t i, int depth, struct members *m, size_t *next)
{
    i = skip_whitespace(p, i);
    if (i < p->len && p->s[i] == '}') {
        *next = i + 1;
        return 0;
    }
    for (;;) {
        if (i >= p->len || p->s[i] != '"')
            return fail(p, "Expecting property name enclosed in double quotes", i);
        if (m)
            m->key.len = 0;
        if (scan_string(p, i + 1, m ? &m->key : NULL, &i) < 0)
            return -1;
        i = skip_whitespace(p, i);
        if (i >= p->len || p->s[i] != ':')
            return fail(p, "Expecting ':' delimiter", i);
        struct value v;
        if (scan_value(p, skip_whitespace(p, i + 1), depth, NULL, &v, &i) < 0)
            return -1;
        if (m)
            remember_member(m, &v);
        i = skip_whitespace(p, i);
        if (i < p->len && p->s[i] == '}')
            break;
        if (i >= p->len || p->s[i] != ',')
            return fail(p, "Expecting ',' delimiter", i);
        i = skip_whitespace(p, i + 1);
    }
    *next = i + 1;
    return 0;
}

static int parse_array(struct parser *p, size_t i, int depth, size_t *next)
{
    i = skip_whitespace(p, i);
    if (i < p->len && p->s[i] == ']') {
        *next = i + 1;
        return 0;
    }
    for (;;) {
        struct value v;
        if (scan_value(p, i, depth, NULL, &v, &i) < 0)
            return -1;
        i = skip_whitespace(p, i);
        if (i < p->len && p->s[i] == ']')
            break;
        if (i >= p->len || p->s[i] != ',')
            return fail(p, "Expecting ',' delimiter", i);
        i = skip_whitespace(p, i + 1);
    }
    *next = i + 1;
    return 0;
}

static int literal_at(const struct parser *p, size_t i, const char *word)
{
    size_t n = strlen(word);
    return i + n <= p->len && memcmp(p->s + i, word, n) == 0;
}

static int scan_literal(const struct parser *p, size_t i, struct value *v, size_t *next)
{
    static const struct {
        const char *word;
        enum kind kind;
    } literals[] = {{"null", K_OTHER}, {"true", K_TRUE},      {"false", K_FALSE},
                    {"NaN", K_OTHER},  {"Infinity", K_OTHER}, {"-Infinity", K_OTHER}};
    for (size_t k = 0; k < sizeof literals / sizeof literals[0]; k++) {
        if (literal_at(p, i, literals[k].word)) {
            v->kind = literals[k].kind;
            *next = i + strlen(literals[k].word);
            return 1;
        }
    }
    return 0;
}

static int scan_value(struct parser *p, size_t i, int depth, struct members *m, struct value *v, size_t *next)
{
    v->start = i;
    v->kind = K_OTHER;
    if (i >= p->len)
        return fail(p, "Expecting value", i);
    int rc = 0;
    if (p->s[i] == '"') {
        v->kind = K_STRING;
        rc = scan_string(p, i + 1, NULL, next);
    } else if (p->s[i] == '{' || p->s[i] == '[') {
        if (depth >= FSN_MAX_NESTING)
            return fail(p, "nested deeper than " STR(FSN_MAX_NESTING), i);
        v->kind = p->s[i] == '{' ? K_OBJECT : K_OTHER;
        rc = p->s[i] == '{' ? parse_object(p, i + 1, depth + 1, m, next) : parse_array(p, i + 1, depth + 1, next);
    } else if (!scan_literal(p, i, v, next)) {
        rc = match_number(p, i, v, next);
    }
    v->end = *next;
    return rc;
}

/* -- the refusals' texts ----------------------------------------------------------------------- */

/* Python's "%s: line %d column %d (char %d)", the position counted in characters. */
static void describe_json_error(struct fsn_buf *b, const unsigned char *s, const struct parser *p)
{
    size_t chars = 0, line = 1, column_start = 0;
    for (size_t i = 0; i < p->error_at; i++) {
        if (continuation(s[i]))
            continue;
        chars++;
        if (s[i] == '\n') {
            line++;
            column_start = chars;
        }
    }
    fsn_buf_printf(b, "malformed request: not JSON (%s: line %zu column %zu (char %zu))", p->error, line,
                   chars - column_start + 1, chars);
}

static void describe_decode_error(struct fsn_buf *b, const unsigned char *s, const struct decode_error *e)
{
    if (e->end - e->start == 1)
        fsn_buf_printf(b, "malformed request: not JSON ('utf-8' codec can't decode byte 0x%02x in position %zu: %s)",
                       s[e->start], e->start, e->reason);
    else
        fsn_buf_printf(b, "malformed request: not JSON ('utf-8' codec can't decode bytes in position %zu-%zu: %s)",
                       e->start, e->end - 1, e->reason);
}

/* Whether Python's str.isprintable() holds for a code point past ASCII: false for its assigned
 * non-printable ones (Unicode 14: controls, format characters, separators, surrogates, private use);
 * unassigned ones are taken as printable here. */
static int printable(uint32_t cp)
{
    static const uint32_t hidden[][2] = {
        {0x80, 0xA0},       {0xAD, 0xAD},        {0x600, 0x605},     {0x61C, 0x61C},     {0x6DD, 0x6DD},
        {0x70F, 0x70F},     {0x890, 0x891},      {0x8E2, 0x8E2},     {0x1680, 0x1680},   {0x180E, 0x180E},
        {0x2000, 0x200F},   {0x2028, 0x202F},    {0x205F, 0x2064},   {0x2066, 0x206F},   {0x3000, 0x3000},
        {0xD800, 0xF8FF},   {0xFEFF, 0xFEFF},    {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD}, {0x110CD, 0x110CD},
        {0x13430, 0x13438}, {0x1BCA0, 0x1BCA3},  {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F},
        {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD}};
    for (size_t k = 0; k < sizeof hidden / sizeof hidden[0]; k++)
        if (cp >= hidden[k][0] && cp <= hidden[k][1])
            return 0;
    return 1;
}

static void repr_code_point(struct fsn_buf *b, uint32_t cp, char quote)
{
    if (cp == (uint32_t)quote || cp == '\\')
        fsn_buf_printf(b, "\\%c", (char)cp);
    else if (cp == '\t' || cp == '\n' || cp == '\r')
        fsn_buf_printf(b, "\\%c", cp == '\t' ? 't' : cp == '\n' ? 'n' : 'r');
    else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0xFF && !printable(cp)))
        fsn_buf_printf(b, "\\x%02x", (unsigned)cp);
    else if (cp >= 0x80 && !printable(cp))
        fsn_buf_printf(b, cp <= 0xFFFF ? "\\u%04x" : "\\U%08x", (unsigned)cp);
    else
        fsn_buf_utf8(b, cp);
}

/* Python's repr() of a str (UTF-8, surrogates allowed). */
static void python_repr(struct fsn_buf *b, const char *text, size_t n)
{
    char quote = memchr(text, '\'', n) && !memchr(text, '"', n) ? '"' : '\'';
    fsn_buf_append(b, &quote, 1);
    for (size_t i = 0; i < n;) {
        size_t used;
        repr_code_point(b, fsn_utf8_next((const unsigned char *)text + i, n - i, &used), quote);
        i += used;
    }
    fsn_buf_append(b, &quote, 1);
}

/* -- the request ------------------------------------------------------------------------------- */

static char *take(struct fsn_buf *b)
{
    char *text = b->failed ? NULL : b->data;
    if (!text)
        fsn_buf_free(b);
    memset(b, 0, sizeof *b);
    return text;
}

/* The "id" a dict request carries, as json.dumps would echo it: an int or a str (a bool is an int). */
static char *id_to_echo(struct parser *p, const struct members *m)
{
    struct fsn_buf out = {0}, text = {0};
    size_t end;
    if (!m->has_id)
        return NULL;
    switch (m->id.kind) {
    case K_STRING:
        scan_string(p, m->id.start + 1, &text, &end);
        fsn_json_string(&out, text.data ? text.data : "", text.len);
        fsn_buf_free(&text);
        break;
    case K_INTEGER: /* Python's int() of it: "-0" is 0 */
        if (m->id.end - m->id.start == 2 && memcmp(p->s + m->id.start, "-0", 2) == 0)
            fsn_buf_puts(&out, "0");
        else
            fsn_buf_append(&out, (const char *)p->s + m->id.start, m->id.end - m->id.start);
        break;
    case K_TRUE:
    case K_FALSE:
        fsn_buf_puts(&out, m->id.kind == K_TRUE ? "true" : "false");
        break;
    default:
        return NULL;
    }
    return take(&out);
}

static enum fsn_command known_command(const char *text, size_t len)
{
    for (int c = FSN_CHECK_STATE; c < FSN_NO_COMMAND; c++)
        if (len == strlen(COMMAND_NAMES[c]) && memcmp(text, COMMAND_NAMES[c], len) == 0)
            return (enum fsn_command)c;
    return FSN_NO_COMMAND;
}

/* The checks after the JSON was read: an object, a string command, a known one. */
static void check_members(struct parser *p, const struct value *top, struct members *m, struct fsn_request *out,
                          struct fsn_buf *error)
{
    if (top->kind != K_OBJECT) {
        fsn_buf_puts(error, "malformed request: expected a JSON object");
        return;
    }
    out->id_json = id_to_echo(p, m);
    if (!m->has_command || m->command.kind != K_STRING) {
        fsn_buf_puts(error, "malformed request: missing \"command\" string");
        return;
    }
    struct fsn_buf command = {0};
    size_t end;
    scan_string(p, m->command.start + 1, &command, &end);
    fsn_buf_append(&command, "", 0); /* an empty string is text too */
    out->command_len = command.len;
    out->command_text = take(&command);
    if (!out->command_text)
        return;
    out->command = known_command(out->command_text, out->command_len);
    if (out->command == FSN_NO_COMMAND) {
        fsn_buf_puts(error, "unknown command ");
        python_repr(error, out->command_text, out->command_len);
        fsn_buf_puts(error, " (known: " KNOWN_COMMANDS ")");
    }
}

static void read_json(const unsigned char *s, size_t n, struct fsn_request *out, struct fsn_buf *error)
{
    struct parser p = {.s = s, .len = n};
    struct members m = {0};
    struct value top;
    size_t end;
    if (scan_value(&p, skip_whitespace(&p, 0), 0, &m, &top, &end) == 0 && skip_whitespace(&p, end) != n)
        fail(&p, "Extra data", skip_whitespace(&p, end));
    if (p.error)
        describe_json_error(error, s, &p);
    else
        check_members(&p, &top, &m, out, error);
    fsn_buf_free(&m.key);
}

int fsn_request_parse(const char *payload, size_t len, struct fsn_request *out)
{
    memset(out, 0, sizeof *out);
    out->command = FSN_NO_COMMAND;
    struct fsn_buf error = {0};
    const unsigned char *s = (const unsigned char *)payload;
    struct decode_error bad;
    if (len > FSN_MAX_REQUEST_BYTES) {
        fsn_buf_printf(&error, "request of %zu bytes exceeds %d", len, FSN_MAX_REQUEST_BYTES);
    } else if (!python_reads_as_utf8(s, len)) {
        fsn_buf_puts(&error, "malformed request: not JSON (not UTF-8)");
    } else {
        if (len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) { /* read as utf-8-sig: the mark is skipped */
            s += 3;
            len -= 3;
        }
        if (check_utf8(s, len, &bad) < 0)
            describe_decode_error(&error, s, &bad);
        else
            read_json(s, len, out, &error);
    }
    int failed = error.failed || (out->command == FSN_NO_COMMAND && !error.data);
    out->error = take(&error);
    if (failed) {
        fsn_request_free(out);
        out->command = FSN_NO_COMMAND;
        return -1;
    }
    return 0;
}

void fsn_request_free(struct fsn_request *r)
{
    free(r->command_text);
    free(r->id_json);
    free(r->error);
    memset(r, 0, sizeof *r);
    r->command = FSN_NO_COMMAND;
}
