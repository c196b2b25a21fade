#include "webconfig.h"

#include <crypt.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

#include "util.h"

#define TLS_WHERE "tls_server_config"

static const char *const TOP_KEYS[] = {"tls_server_config", "basic_auth_users", NULL};
static const char *const TLS_KEYS[] = {"cert_file",   "key_file", "client_ca_file", "client_auth_type", "min_version",
                                       "max_version", NULL};
/* exporter-toolkit's keys that flowstat's agents do not do: refused, by name. */
static const char *const TOP_NOT_DONE[] = {"http_server_config", "rate_limit", NULL};
static const char *const TLS_NOT_DONE[] = {"cert",
                                           "key",
                                           "client_ca",
                                           "cipher_suites",
                                           "curve_preferences",
                                           "prefer_server_cipher_suites",
                                           "client_allowed_sans",
                                           NULL};
/* exporter-toolkit's hash of "fakepassword": what an unknown user's password is checked against. */
static const char FAKE_HASH[] = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

struct reader {
    const char *path;
    yaml_document_t doc;
    char *err;
    size_t errlen;
    struct webconfig *w;
};

static int fail(struct reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct reader *r, const char *fmt, ...)
{
    char text[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(r->err, r->errlen, "%s: %s", r->path, text);
    return -1;
}

static int listed(const char *const *names, const char *name)
{
    for (; *names; names++)
        if (strcmp(*names, name) == 0)
            return 1;
    return 0;
}

static void joined(const char *const *names, char *out, size_t n)
{
    out[0] = '\0';
    for (const char *const *k = names; *k; k++) {
        size_t len = strlen(out);
        snprintf(out + len, n - len, "%s%s", k == names ? "" : ", ", *k);
    }
}

static yaml_node_t *node(struct reader *r, int index)
{
    return yaml_document_get_node(&r->doc, index);
}

static const char *scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* "key:" and nothing: an empty plain scalar, taken as an empty mapping or an absent value. */
static int empty(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE && n->data.scalar.length == 0;
}

/* A mapping whose keys are all known ones (where: its dotted place, "" the top): 0, or -1. */
static int mapping(struct reader *r, const char *where, const yaml_node_t *n, const char *const *known,
                   const char *const *not_done)
{
    char keys[200];
    joined(known, keys, sizeof keys);
    if (empty(n))
        return 0;
    if (!n || n->type != YAML_MAPPING_NODE)
        return fail(r, "%s: must be a mapping (%s)", where[0] ? where : "the file", keys);
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *key = scalar(node(r, p->key));
        if (!key)
            return fail(r, "%s: a key that is not a string", where[0] ? where : "the file");
        char named[300];
        snprintf(named, sizeof named, "%s%s%.200s", where, where[0] ? "." : "", key);
        if (listed(not_done, key))
            return fail(r, "%s: exporter-toolkit's, but not supported by flowstat", named);
        if (!listed(known, key))
            return fail(r, "%s: unknown key (%s)", named, keys);
    }
    return 0;
}

/* The value of key in mapping n (the last one given); NULL: none. */
static yaml_node_t *value_of(struct reader *r, const yaml_node_t *n, const char *key)
{
    yaml_node_t *found = NULL;
    if (!n || n->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = scalar(node(r, p->key));
        if (k && strcmp(k, key) == 0)
            found = node(r, p->value);
    }
    return found;
}

/* A string value; def when absent or empty; NULL (err set) when it is no string. */
static const char *string_of(struct reader *r, const yaml_node_t *map, const char *key, const char *def)
{
    yaml_node_t *v = value_of(r, map, key);
    if (!v || empty(v))
        return def;
    const char *s = scalar(v);
    if (!s)
        fail(r, TLS_WHERE ".%s: must be a string", key);
    return s;
}

static void stamp_of(const char *name, struct webconfig_stamp *s)
{
    struct stat st;
    memset(s, 0, sizeof *s);
    if (stat(name, &st) != 0) {
        s->err = errno ? errno : EIO;
        return;
    }
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->size = st.st_size;
    s->mtime = st.st_mtim;
    s->ctime = st.st_ctim;
}

static int same_stamp(const struct webconfig_stamp *a, const struct webconfig_stamp *b)
{
    return a->err == b->err && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
        a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
        a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

/* A file about to be read, named and stamped in w (what webconfig_reload compares): 0, or -1. */
static int record(struct reader *r, const char *name)
{
    struct webconfig *w = r->w;
    if (w->nfiles == WEBCONFIG_FILES)
        return fail(r, "more than %d files", WEBCONFIG_FILES);
    if (!(w->files[w->nfiles] = strdup(name)))
        return fail(r, "out of memory");
    stamp_of(name, &w->stamps[w->nfiles++]);
    return 0;
}

/* A file the config names, from the config's folder when relative, readable: 0 with its name in out. */
static int file_of(struct reader *r, const char *key, const char *value, char *out, size_t n)
{
    const char *slash = strrchr(r->path, '/');
    if (value[0] == '/' || !slash)
        snprintf(out, n, "%s", value);
    else
        snprintf(out, n, "%.*s/%s", (int)(slash - r->path), r->path, value);
    if (record(r, out) != 0)
        return -1;
    FILE *f = fopen(out, "rb");
    if (!f)
        return fail(r, TLS_WHERE ".%s: cannot read %s: %s", key, out, strerror(errno));
    fclose(f);
    return 0;
}

/* OpenSSL's reason for the error at the head of its queue (its queue then emptied). */
static const char *ssl_reason(void)
{
    const char *why = ERR_reason_error_string(ERR_peek_last_error());
    ERR_clear_error();
    return why ? why : "not PEM";
}

static int version_of(struct reader *r, const yaml_node_t *tls, const char *key, const char *def, int *out)
{
    const char *v = string_of(r, tls, key, def);
    if (!v)
        return -1;
    if (strcmp(v, "TLS12") == 0)
        *out = TLS1_2_VERSION;
    else if (strcmp(v, "TLS13") == 0)
        *out = TLS1_3_VERSION;
    else
        return fail(r, TLS_WHERE ".%s: TLS12 or TLS13, not '%s'", key, v);
    return 0;
}

static int load_tls(struct reader *r, const yaml_node_t *tls, struct webconfig *w)
{
    static const char *const files[] = {"cert_file", "key_file"};
    char names[2][4096], ca_name[4096];
    for (int i = 0; i < 2; i++) {
        yaml_node_t *v = value_of(r, tls, files[i]);
        if (!v || empty(v))
            return fail(r, TLS_WHERE ".%s: missing", files[i]);
    }
    for (int i = 0; i < 2; i++) {
        const char *v = string_of(r, tls, files[i], NULL);
        if (!v || file_of(r, files[i], v, names[i], sizeof names[i]) != 0)
            return -1;
    }
    const char *auth = string_of(r, tls, "client_auth_type", "NoClientCert");
    if (!auth)
        return -1;
    int verify = strcmp(auth, "NoClientCert") == 0        ? SSL_VERIFY_NONE
        : strcmp(auth, "VerifyClientCertIfGiven") == 0    ? SSL_VERIFY_PEER
        : strcmp(auth, "RequireAndVerifyClientCert") == 0 ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                                                          : -1;
    if (verify < 0)
        return fail(r,
                    TLS_WHERE ".client_auth_type: NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert, "
                              "not '%s'",
                    auth);
    int min = 0, max = 0;
    if (version_of(r, tls, "min_version", "TLS12", &min) != 0 || version_of(r, tls, "max_version", "TLS13", &max) != 0)
        return -1;
    if (min > max)
        return fail(r, TLS_WHERE ".min_version: above max_version");
    if (!(w->tls = SSL_CTX_new(TLS_server_method())))
        return fail(r, TLS_WHERE ": cannot set up TLS: %s", ssl_reason());
    SSL_CTX_set_min_proto_version(w->tls, min);
    SSL_CTX_set_max_proto_version(w->tls, max);
    /* written as the socket takes it (a scrape is large), from a buffer that may move as it grows */
    SSL_CTX_set_mode(w->tls, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_session_id_context(w->tls, (const unsigned char *)"flowstat", 8);
    if (SSL_CTX_use_certificate_chain_file(w->tls, names[0]) != 1 ||
        SSL_CTX_use_PrivateKey_file(w->tls, names[1], SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(w->tls) != 1)
        return fail(r, TLS_WHERE ".key_file: cannot use %s with %s: %s", names[1], names[0], ssl_reason());
    const char *ca = string_of(r, tls, "client_ca_file", "");
    if (!ca)
        return -1;
    if (ca[0] && verify == SSL_VERIFY_NONE)
        return fail(r, TLS_WHERE ".client_ca_file: given, but client_auth_type is NoClientCert");
    if (!ca[0] && verify != SSL_VERIFY_NONE)
        return fail(r, TLS_WHERE ".client_ca_file: missing (client_auth_type %s verifies against it)", auth);
    if (ca[0]) {
        if (file_of(r, "client_ca_file", ca, ca_name, sizeof ca_name) != 0)
            return -1;
        STACK_OF(X509_NAME) *names_sent = SSL_load_client_CA_file(ca_name);
        if (SSL_CTX_load_verify_locations(w->tls, ca_name, NULL) != 1 || !names_sent) {
            sk_X509_NAME_pop_free(names_sent, X509_NAME_free);
            return fail(r, TLS_WHERE ".client_ca_file: no certificate in %s: %s", ca_name, ssl_reason());
        }
        SSL_CTX_set_client_CA_list(w->tls, names_sent); /* the CAs a client is told its certificate is to come from */
        SSL_CTX_set_verify(w->tls, verify, NULL);
    }
    ERR_clear_error();
    return 0;
}

/* $2a$, $2b$ or $2y$, a cost of 04 to 31, and 53 characters of bcrypt's base64 (salt and hash). */
static int is_bcrypt(const char *h)
{
    if (strlen(h) != 60 || strncmp(h, "$2", 2) != 0 || !strchr("aby", h[2]) || h[3] != '$' || h[6] != '$')
        return 0;
    int cost = (h[4] - '0') * 10 + (h[5] - '0');
    if (h[4] < '0' || h[4] > '3' || h[5] < '0' || h[5] > '9' || cost < 4 || cost > 31)
        return 0;
    return strspn(h + 7, "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") == 53;
}

static int load_users(struct reader *r, const yaml_node_t *n, struct webconfig *w)
{
    if (empty(n))
        return 0;
    if (n->type != YAML_MAPPING_NODE)
        return fail(r, "basic_auth_users: must map each user to a bcrypt hash");
    size_t count = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    if (!(w->users = calloc(count ? count : 1, sizeof *w->users)))
        return fail(r, "out of memory");
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *user = scalar(node(r, p->key)), *hash = scalar(node(r, p->value));
        if (!user)
            return fail(r, "basic_auth_users: a user that is not a string");
        if (!hash || !is_bcrypt(hash))
            return fail(r, "basic_auth_users.%.200s: not a bcrypt hash ($2y$, $2b$ or $2a$: htpasswd -nBC 10 \"\")",
                        user);
        size_t i;
        for (i = 0; i < w->nusers && strcmp(w->users[i].name, user) != 0; i++)
            ;
        if (i == w->nusers) { /* a user given twice: the last hash, as a YAML mapping reads */
            if (!(w->users[i].name = strdup(user)))
                return fail(r, "out of memory");
            w->nusers++;
        }
        free(w->users[i].hash);
        if (!(w->users[i].hash = strdup(hash)))
            return fail(r, "out of memory");
    }
    if (w->nusers &&
        (!(w->crypt_data = calloc(1, sizeof(struct crypt_data))) || RAND_bytes(w->key, sizeof w->key) != 1))
        return fail(r, "basic_auth_users: cannot set up the passwords' check");
    return 0;
}

int webconfig_load(const char *path, struct webconfig *w, char *err, size_t errlen)
{
    memset(w, 0, sizeof *w);
    struct reader r = {.path = path, .err = err, .errlen = errlen, .w = w};
    if (record(&r, path) != 0)
        return -1;
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(&r, "cannot read it: %s", strerror(errno));
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return fail(&r, "out of memory");
    }
    yaml_parser_set_input_file(&parser, f);
    int loaded = yaml_parser_load(&parser, &r.doc);
    if (!loaded) {
        int rc = parser.error == YAML_READER_ERROR && ferror(f)
            ? fail(&r, "cannot read it: %s", strerror(errno))
            : fail(&r, "not YAML: %s at line %zu, column %zu", parser.problem ? parser.problem : "bad",
                   parser.problem_mark.line + 1, parser.problem_mark.column + 1);
        yaml_parser_delete(&parser);
        fclose(f);
        return rc;
    }
    yaml_parser_delete(&parser);
    fclose(f);
    const yaml_node_t *root = yaml_document_get_root_node(&r.doc);
    int rc = 0;
    if (root && !empty(root)) { /* an empty file: plain HTTP, no password (exporter-toolkit alike) */
        rc = mapping(&r, "", root, TOP_KEYS, TOP_NOT_DONE);
        yaml_node_t *tls = rc == 0 ? value_of(&r, root, "tls_server_config") : NULL;
        if (tls)
            rc = mapping(&r, TLS_WHERE, tls, TLS_KEYS, TLS_NOT_DONE);
        if (rc == 0 && tls)
            rc = load_tls(&r, tls, w);
        yaml_node_t *users = rc == 0 ? value_of(&r, root, "basic_auth_users") : NULL;
        if (users)
            rc = load_users(&r, users, w);
    }
    yaml_document_delete(&r.doc);
    w->tls_fixed = w->tls != NULL;
    return rc;
}

/* Whether any file w read changed since (a stat of each). */
static int changed(const struct webconfig *w)
{
    for (size_t i = 0; i < w->nfiles; i++) {
        struct webconfig_stamp now;
        stamp_of(w->files[i], &now);
        if (!same_stamp(&now, &w->stamps[i]))
            return 1;
    }
    return 0;
}

/* Whether fresh keeps what the start decided, w its config until now: 0, or -1 with err set. */
static int keeps_the_start(const struct webconfig *w, const struct webconfig *fresh, char *err, size_t errlen)
{
    if (!fresh->tls != !w->tls_fixed) {
        snprintf(err, errlen,
                 "%s: tls_server_config: %s since the start: TLS or not is decided at the start (restart to change it)",
                 w->files[0], fresh->tls ? "new" : "gone");
        return -1;
    }
    if (w->users_needed && !fresh->nusers) {
        snprintf(err, errlen, "%s: basic_auth_users: none left, and /metrics is served beyond loopback", w->files[0]);
        return -1;
    }
    return 0;
}

/* What w serves with, freed: its TLS and its users (and their remembered passwords). */
static void release_served(struct webconfig *w)
{
    if (w->tls)
        SSL_CTX_free(w->tls);
    w->tls = NULL;
    for (size_t i = 0; i < w->nusers; i++) {
        free(w->users[i].name);
        free(w->users[i].hash);
    }
    free(w->users);
    w->users = NULL;
    w->nusers = 0;
    free(w->crypt_data);
    w->crypt_data = NULL;
    OPENSSL_cleanse(w->key, sizeof w->key);
}

int webconfig_reload(struct webconfig *w, char *err, size_t errlen)
{
    if (!w->nfiles || !changed(w))
        return 0;
    struct webconfig fresh;
    int rc = webconfig_load(w->files[0], &fresh, err, errlen);
    if (rc == 0)
        rc = keeps_the_start(w, &fresh, err, errlen);
    if (rc != 0 && !fresh.nfiles) { /* out of memory before the file was stamped: tried again next time */
        webconfig_free(&fresh);
        release_served(w);
        w->unusable = 1;
        return -1;
    }
    fresh.tls_fixed = w->tls_fixed;
    fresh.users_needed = w->users_needed;
    if (rc != 0) { /* its files' stamps kept: not read again until one changes */
        release_served(&fresh);
        fresh.unusable = 1;
    }
    webconfig_free(w);
    *w = fresh;
    return rc == 0 ? 1 : -1;
}

/* Standard base64 with its padding, strictly: the decoded length, or -1. */
static long base64_decode(const char *in, size_t len, unsigned char *out, size_t cap)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (len % 4 != 0 || len / 4 * 3 > cap)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < len; i += 4) {
        unsigned v = 0;
        int pad = 0;
        for (size_t k = 0; k < 4; k++) {
            const char *at = in[i + k] ? strchr(alphabet, in[i + k]) : NULL;
            if (in[i + k] == '=' && i + 4 == len && k >= 2 && (k == 3 || in[i + 3] == '='))
                pad++;
            else if (!at || pad)
                return -1;
            v = v << 6 | (at ? (unsigned)(at - alphabet) : 0);
        }
        out[n++] = (unsigned char)(v >> 16);
        if (pad < 2)
            out[n++] = (unsigned char)(v >> 8);
        if (pad < 1)
            out[n++] = (unsigned char)v;
    }
    return (long)n;
}

/* bcrypt's hash of password as `hash` salts it, against it, in constant time. */
static int bcrypt_matches(struct webconfig *w, const char *password, const char *hash)
{
    struct crypt_data *data = w->crypt_data;
    memset(data, 0, sizeof *data);
    const char *out = crypt_rn(password, hash, data, (int)sizeof *data);
    size_t len = strlen(hash);
    int ok = out && strlen(out) == len && CRYPTO_memcmp(out, hash, len) == 0;
    OPENSSL_cleanse(data, sizeof *data); /* nothing of the password left there */
    return ok;
}

int webconfig_allows(struct webconfig *w, const char *authorization)
{
    if (!authorization || strncasecmp(authorization, "Basic ", 6) != 0)
        return 0;
    const char *token = authorization + 6;
    while (*token == ' ')
        token++;
    size_t len = strcspn(token, " \t\r\n");
    unsigned char raw[1024];
    long n = base64_decode(token, len, raw, sizeof raw - 1);
    if (n < 0 || memchr(raw, '\0', (size_t)n)) /* crypt takes a C string: a NUL would cut the password short */
        return 0;
    raw[n] = '\0';
    char *colon = strchr((char *)raw, ':');
    if (!colon)
        return 0;
    *colon = '\0';
    const char *user = (const char *)raw, *password = colon + 1;
    unsigned char mac[32];
    unsigned maclen = 0;
    if (!HMAC(EVP_sha256(), w->key, sizeof w->key, (const unsigned char *)password, strlen(password), mac, &maclen))
        return 0;
    struct webconfig_user *u = NULL;
    for (size_t i = 0; i < w->nusers && !u; i++)
        if (strcmp(w->users[i].name, user) == 0)
            u = &w->users[i];
    int ok;
    if (u && u->has_matched && CRYPTO_memcmp(u->matched, mac, sizeof mac) == 0)
        ok = 1;
    else if ((ok = bcrypt_matches(w, password, u ? u->hash : FAKE_HASH) && u)) { /* an unknown user costs a check too */
        memcpy(u->matched, mac, sizeof mac);
        u->has_matched = 1;
    }
    OPENSSL_cleanse(raw, sizeof raw);
    return ok;
}

void webconfig_free(struct webconfig *w)
{
    release_served(w);
    for (size_t i = 0; i < w->nfiles; i++)
        free(w->files[i]);
    memset(w, 0, sizeof *w);
}
