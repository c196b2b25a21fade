#include "creds.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const NAMES[FS_NCREDS] = {[FS_INFLUX_USER] = "FLOWSTAT_INFLUX_USER",
                                             [FS_INFLUX_PASSWORD] = "FLOWSTAT_INFLUX_PASSWORD",
                                             [FS_INFLUX_TOKEN] = "FLOWSTAT_INFLUX_TOKEN",
                                             [FS_ES_USER] = "FLOWSTAT_ES_USER",
                                             [FS_ES_PASSWORD] = "FLOWSTAT_ES_PASSWORD",
                                             [FS_ES_API_KEY] = "FLOWSTAT_ES_API_KEY",
                                             [FS_INFLUX_CA_FILE] = "FLOWSTAT_INFLUX_CA_FILE",
                                             [FS_ES_CA_FILE] = "FLOWSTAT_ES_CA_FILE",
                                             [FS_CA_FILE] = "FLOWSTAT_CA_FILE"};

const char *creds_name(enum fs_cred k)
{
    return NAMES[k];
}

static int is_secret(int k)
{
    return k == FS_INFLUX_PASSWORD || k == FS_INFLUX_TOKEN || k == FS_ES_PASSWORD || k == FS_ES_API_KEY;
}

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

static void wipe_free(char *s)
{
    if (s)
        explicit_bzero(s, strlen(s));
    free(s);
}

static int lookup(const char *name)
{
    for (int k = 0; k < FS_NCREDS; k++)
        if (strcmp(NAMES[k], name) == 0)
            return k;
    return -1;
}

/* -- the file ---------------------------------------------------------------------------------- */

/* Only its owner may read it: what ssh asks of a private key. */
static int check_file(int fd, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return fail(err, errlen, "credentials file %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fail(err, errlen, "credentials file %s is not a regular file", path);
    if (st.st_mode & 077)
        return fail(err, errlen,
                    "credentials file %s has mode %04o: it must be readable by its owner only, as it holds "
                    "passwords (run: chmod 600 %s)",
                    path, (unsigned)(st.st_mode & 07777), path);
    return 0;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

/* One line into got[]; a message names the line, and a name, never a value. */
static int parse_line(char *line, long lineno, const char *path, char *got[], char *err, size_t errlen)
{
    char *text = trim(line);
    if (!text[0] || text[0] == '#')
        return 0;
    if (strncmp(text, "export ", 7) == 0)
        return fail(err, errlen, "credentials file %s line %ld: NAME=VALUE, without export", path, lineno);
    char *eq = strchr(text, '=');
    if (!eq)
        return fail(err, errlen, "credentials file %s line %ld: expected NAME=VALUE", path, lineno);
    *eq = '\0';
    char *value = eq + 1;
    size_t vlen = strlen(value);
    int k = lookup(text);
    if (k < 0)
        return fail(err, errlen,
                    "credentials file %s line %ld: unknown name '%.60s' (FLOWSTAT_INFLUX_USER, "
                    "FLOWSTAT_INFLUX_PASSWORD, FLOWSTAT_INFLUX_TOKEN, FLOWSTAT_ES_USER, FLOWSTAT_ES_PASSWORD, "
                    "FLOWSTAT_ES_API_KEY, FLOWSTAT_INFLUX_CA_FILE, FLOWSTAT_ES_CA_FILE, FLOWSTAT_CA_FILE)",
                    path, lineno, text);
    if (got[k])
        return fail(err, errlen, "credentials file %s line %ld: %s given twice", path, lineno, text);
    if (vlen >= 2 && (value[0] == '"' || value[0] == '\'') && value[vlen - 1] == value[0])
        return fail(err, errlen, "credentials file %s line %ld: the value of %s is quoted: write it without quotes",
                    path, lineno, text);
    if (vlen && !(got[k] = strdup(value)))
        return fail(err, errlen, "credentials file %s: out of memory", path);
    return 0;
}

static int read_lines(FILE *f, const char *path, char *got[], char *err, size_t errlen)
{
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, f) >= 0)
        rc = parse_line(line, ++lineno, path, got, err, errlen);
    if (rc == 0 && ferror(f))
        rc = fail(err, errlen, "credentials file %s: cannot read it: %s", path, strerror(errno));
    if (line)
        explicit_bzero(line, cap);
    free(line);
    return rc;
}

static int read_file(const char *path, char *got[], char *err, size_t errlen)
{
    /* O_NONBLOCK: a FIFO must not hold the start; it is refused as not a regular file */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return fail(err, errlen, "credentials file %s: %s", path, strerror(errno));
    if (check_file(fd, path, err, errlen) != 0) {
        close(fd);
        return -1;
    }
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return fail(err, errlen, "credentials file %s: %s", path, strerror(errno));
    }
    int rc = read_lines(f, path, got, err, errlen);
    fclose(f);
    return rc;
}

/* -- the credentials --------------------------------------------------------------------------- */

char *fs_base64(const char *data, size_t n)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
    if (!out)
        return NULL;
    const unsigned char *d = (const unsigned char *)data;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)d[i] << 16 | (i + 1 < n ? (unsigned)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        *o++ = digits[v >> 18 & 63];
        *o++ = digits[v >> 12 & 63];
        *o++ = i + 1 < n ? digits[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? digits[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

/* base64(user:password), which an Authorization header carries: a store could echo it. */
static char *basic_token(const char *user, const char *password)
{
    if (!user || !password)
        return NULL;
    size_t n = strlen(user) + 1 + strlen(password);
    char *pair = malloc(n + 1);
    if (!pair)
        return NULL;
    snprintf(pair, n + 1, "%s:%s", user, password);
    char *token = fs_base64(pair, n);
    wipe_free(pair);
    return token;
}

/* The values: from the environment when it sets them (use_env), else from got[] (taken). */
static int settle(struct fs_credentials *c, char *got[], int use_env, char *err, size_t errlen)
{
    int rc = 0;
    for (int k = 0; k < FS_NCREDS && rc == 0; k++) {
        const char *env = use_env ? getenv(NAMES[k]) : NULL;
        if (env && env[0] && !(c->value[k] = strdup(env)))
            rc = fail(err, errlen, "out of memory");
        else if (!c->value[k])
            c->value[k] = got[k], got[k] = NULL;
    }
    for (int k = 0; k < FS_NCREDS; k++)
        wipe_free(got[k]);
    if (rc == 0) {
        c->basic[0] = basic_token(c->value[FS_INFLUX_USER], c->value[FS_INFLUX_PASSWORD]);
        c->basic[1] = basic_token(c->value[FS_ES_USER], c->value[FS_ES_PASSWORD]);
    }
    if (rc != 0)
        creds_free(c);
    return rc;
}

int creds_load(struct fs_credentials *c, const char *file, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    char *got[FS_NCREDS] = {0};
    if (!file || !file[0])
        file = getenv(FS_CREDENTIALS_VAR);
    if (file && file[0] && read_file(file, got, err, errlen) != 0) {
        for (int k = 0; k < FS_NCREDS; k++)
            wipe_free(got[k]);
        return -1;
    }
    return settle(c, got, 1, err, errlen);
}

int creds_parse(struct fs_credentials *c, FILE *f, const char *name, char *err, size_t errlen)
{
    memset(c, 0, sizeof *c);
    char *got[FS_NCREDS] = {0};
    if (read_lines(f, name, got, err, errlen) != 0) {
        for (int k = 0; k < FS_NCREDS; k++)
            wipe_free(got[k]);
        return -1;
    }
    return settle(c, got, 0, err, errlen);
}

const char *creds_get(const struct fs_credentials *c, enum fs_cred k)
{
    return c ? c->value[k] : NULL;
}

static void redact_one(char *text, const char *secret)
{
    size_t n = secret ? strlen(secret) : 0;
    size_t r = n < 3 ? n : 3; /* never longer than what it replaces: in place */
    if (!n)
        return;
    for (char *p = strstr(text, secret); p; p = strstr(p + r, secret)) {
        memset(p, '*', r);
        memmove(p + r, p + n, strlen(p + n) + 1);
    }
}

void creds_redact(const struct fs_credentials *c, char *text)
{
    if (!c)
        return;
    for (int k = 0; k < FS_NCREDS; k++)
        if (is_secret(k))
            redact_one(text, c->value[k]);
    redact_one(text, c->basic[0]);
    redact_one(text, c->basic[1]);
}

void creds_free(struct fs_credentials *c)
{
    for (int k = 0; k < FS_NCREDS; k++)
        wipe_free(c->value[k]);
    wipe_free(c->basic[0]);
    wipe_free(c->basic[1]);
    memset(c, 0, sizeof *c);
}
