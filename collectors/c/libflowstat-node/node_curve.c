/* ZeroMQ CURVE key files (ZPL certificates): parsed line by line, every key checked with ZeroMQ's
 * own Z85 decoder, errors naming the file and the line, never a key. */
#include "node_curve.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#define KEY_BYTES 32

void fsn_say(char *why, size_t why_len, const char *fmt, ...)
{
    if (!why || why_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
}

void fsn_curve_wipe(struct fsn_curve_keys *keys)
{
    explicit_bzero(keys, sizeof *keys);
}

int fsn_curve_key_valid(const char *key, size_t len)
{
    char text[FSN_CURVE_KEY_LEN + 1];
    uint8_t raw[KEY_BYTES];
    /* zmq_z85_decode reads up to a NUL: one inside would make a shorter key look whole */
    if (len != FSN_CURVE_KEY_LEN || memchr(key, '\0', len))
        return 0;
    memcpy(text, key, len);
    text[len] = '\0';
    int valid = zmq_z85_decode(raw, text) != NULL;
    explicit_bzero(text, sizeof text); /* it may be a secret key */
    explicit_bzero(raw, sizeof raw);
    return valid;
}

static const char *skip_blanks(const char *p, const char *end)
{
    while (p < end && isspace((unsigned char)*p))
        p++;
    return p;
}

static const char *trim_blanks(const char *start, const char *end)
{
    while (end > start && isspace((unsigned char)end[-1]))
        end--;
    return end;
}

static int is_quote(char c)
{
    return c == '"' || c == '\'';
}

/* Where a line's key goes: the field its name names, or NULL for a line of another name. */
static char *field_named(const char *name, size_t len, struct fsn_curve_keys *out, const char **label)
{
    if (len == 10 && memcmp(name, "public-key", 10) == 0) {
        *label = "public-key";
        return out->public_key;
    }
    if (len == 10 && memcmp(name, "secret-key", 10) == 0) {
        *label = "secret-key";
        return out->secret_key;
    }
    return NULL;
}

/* One line [start, end), number `number`: 0 (nothing for us, or a key taken), -1 (a key that is
 * no key: said). As Python's read_key_file: blanks around the name and the value, then quotes
 * around the value, go. */
static int parse_line(const char *start, const char *end, unsigned number, const char *path, struct fsn_curve_keys *out,
                      char *why, size_t why_len)
{
    start = skip_blanks(start, end);
    const char *eq = start < end ? memchr(start, '=', (size_t)(end - start)) : NULL;
    if (!eq || *start == '#')
        return 0;
    const char *label;
    char *field = field_named(start, (size_t)(trim_blanks(start, eq) - start), out, &label);
    if (!field)
        return 0;
    const char *value = skip_blanks(eq + 1, end), *value_end = trim_blanks(value, end);
    while (value < value_end && is_quote(*value))
        value++;
    while (value_end > value && is_quote(value_end[-1]))
        value_end--;
    if (!fsn_curve_key_valid(value, (size_t)(value_end - value))) {
        fsn_say(why, why_len, "%s:%u: %s is not a Z85 CURVE key of %d characters", path, number, label,
                FSN_CURVE_KEY_LEN);
        return -1;
    }
    memcpy(field, value, FSN_CURVE_KEY_LEN);
    field[FSN_CURVE_KEY_LEN] = '\0';
    return 0;
}

/* The end of the line starting at p: the next \n or \r (a \r\n ends one line), or end. */
static const char *line_end(const char *p, const char *end)
{
    while (p < end && *p != '\n' && *p != '\r')
        p++;
    return p;
}

static const char *next_line(const char *eol, const char *end)
{
    if (eol < end && *eol == '\r' && eol + 1 < end && eol[1] == '\n')
        return eol + 2;
    return eol < end ? eol + 1 : end;
}

int fsn_curve_parse(const char *text, size_t len, const char *path, struct fsn_curve_keys *out, char *why,
                    size_t why_len)
{
    memset(out, 0, sizeof *out);
    const char *end = text + len;
    unsigned number = 1;
    for (const char *p = text; p < end; number++) {
        const char *eol = line_end(p, end);
        if (parse_line(p, eol, number, path, out, why, why_len) != 0) {
            fsn_curve_wipe(out);
            return -1;
        }
        p = next_line(eol, end);
    }
    if (!out->public_key[0]) {
        fsn_say(why, why_len, "%s: no public-key (a ZeroMQ CURVE certificate file)", path);
        fsn_curve_wipe(out);
        return -1;
    }
    return 0;
}

/* Up to max bytes of fd into buf: how many, or -1 (errno says why). */
static ssize_t read_up_to(int fd, char *buf, size_t max)
{
    size_t got = 0;
    while (got < max) {
        ssize_t n = read(fd, buf + got, max - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/* An open file that is a small regular one (a FIFO is never read: it could block): 0, or -1 with why. */
static int check_small_file(int fd, const char *path, char *why, size_t why_len)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        fsn_say(why, why_len, "%s: cannot read the CURVE key file (%s)", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > FSN_CURVE_FILE_MAX) {
        fsn_say(why, why_len, "%s: cannot read the CURVE key file (%s)", path,
                S_ISREG(st.st_mode) ? "larger than 64 KiB: no certificate" : "not a regular file");
        return -1;
    }
    return 0;
}

/* The whole of a small regular file in *text (NUL-terminated; the caller wipes and frees it): its
 * length, or -1 with why. */
static ssize_t read_small_file(const char *path, char **text, char *why, size_t why_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        fsn_say(why, why_len, "%s: cannot read the CURVE key file (%s)", path, strerror(errno));
        return -1;
    }
    if (check_small_file(fd, path, why, why_len) != 0) {
        close(fd);
        return -1;
    }
    *text = calloc(1, FSN_CURVE_FILE_MAX + 1);
    ssize_t got = *text ? read_up_to(fd, *text, FSN_CURVE_FILE_MAX) : -1;
    int err = *text ? errno : ENOMEM;
    close(fd);
    if (got < 0) {
        fsn_say(why, why_len, "%s: cannot read the CURVE key file (%s)", path, strerror(err));
        if (*text)
            explicit_bzero(*text, FSN_CURVE_FILE_MAX);
        free(*text);
        *text = NULL;
    }
    return got;
}

int fsn_curve_read(const char *path, int need_secret, struct fsn_curve_keys *out, char *why, size_t why_len)
{
    char *text = NULL;
    memset(out, 0, sizeof *out);
    ssize_t len = read_small_file(path, &text, why, why_len);
    if (len < 0)
        return -1;
    int rc = fsn_curve_parse(text, (size_t)len, path, out, why, why_len);
    explicit_bzero(text, (size_t)len);
    free(text);
    if (rc == 0 && need_secret && !out->secret_key[0]) {
        fsn_say(why, why_len, "%s: no secret-key (give the .key_secret file)", path);
        fsn_curve_wipe(out);
        return -1;
    }
    return rc;
}
