#include "sinks.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>
#include <curl/curl.h>

#define UDP_MAX 60000
#define TCP_SEND_TIMEOUT_S 3 /* a receiver that stops reading must not hold its sink thread for long */

static int set_err(char *err, size_t n, const char *url, const char *what)
{
    snprintf(err, n, "%s: %s", url, what);
    return -1;
}

/* What each store's messages name: its variables (docs/security.md). The line protocol endpoint
 * (http://) takes InfluxDB's. */
struct store_names {
    enum fs_cred user, password, key, ca;
    const char *header; /* the Authorization header a key goes in */
    const char *key_is; /* how a message names the key */
    const char *vars; /* where credentials go */
};
static const struct store_names INFLUX_NAMES = {
    FS_INFLUX_USER,
    FS_INFLUX_PASSWORD,
    FS_INFLUX_TOKEN,
    FS_INFLUX_CA_FILE,
    "Authorization: Token ",
    "the token (FLOWSTAT_INFLUX_TOKEN)",
    "FLOWSTAT_INFLUX_USER and FLOWSTAT_INFLUX_PASSWORD, or FLOWSTAT_INFLUX_TOKEN"};
static const struct store_names ES_NAMES = {FS_ES_USER,
                                            FS_ES_PASSWORD,
                                            FS_ES_API_KEY,
                                            FS_ES_CA_FILE,
                                            "Authorization: ApiKey ",
                                            "the API key (FLOWSTAT_ES_API_KEY)",
                                            "FLOWSTAT_ES_USER and FLOWSTAT_ES_PASSWORD, or FLOWSTAT_ES_API_KEY"};

static const struct store_names *names_of(const struct sink *s)
{
    return s->kind == SINK_ES ? &ES_NAMES : &INFLUX_NAMES;
}

int sink_check_userinfo(const char *url, char *err, size_t errlen)
{
    const char *sep = strstr(url, "://");
    const char *authority = sep ? sep + 3 : url;
    const char *at = sep ? memrchr(authority, '@', strcspn(authority, "/?#")) : NULL;
    if (!at)
        return 0;
    int es = strncmp(url, "elasticsearch", 13) == 0;
    snprintf(err, errlen,
             "--sink %.*s://***@%.200s: a user or password in a URL shows in process lists and logs: set %s in the "
             "environment or in a --credentials file instead",
             (int)(sep - url < 40 ? sep - url : 40), url, at + 1,
             es ? "FLOWSTAT_ES_USER and FLOWSTAT_ES_PASSWORD (or FLOWSTAT_ES_API_KEY)"
                : "FLOWSTAT_INFLUX_USER and FLOWSTAT_INFLUX_PASSWORD (or FLOWSTAT_INFLUX_TOKEN)");
    return -1;
}

/* One node of a URL's authority, HOST[:PORT] (an IPv6 address in brackets): 0, or -1 with what
 * is wrong in `what`. */
static int parse_node(char *entry, int default_port, struct sink_node *node, const char **what)
{
    for (const char *c = entry; *c; c++)
        if (isspace((unsigned char)*c) || *c == '#') {
            *what = "bad host";
            return -1;
        }
    char *close = entry[0] == '[' ? strchr(entry, ']') : NULL;
    char *colon = strrchr(entry, ':');
    if (close && colon && colon < close)
        colon = NULL; /* [::1]: no port */
    if (entry[0] == '[' && (!close || (close[1] && close + 1 != colon))) {
        *what = "bad host";
        return -1;
    }
    node->port = default_port;
    if (colon) {
        *colon = '\0';
        char *end = NULL;
        long port = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || port < 1 || port > 65535 || !isdigit((unsigned char)colon[1])) {
            *what = "bad port";
            return -1;
        }
        node->port = (int)port;
    }
    if (!entry[0] || (close && close == entry + 1) || !node->port) {
        *what = "needs HOST:PORT";
        return -1;
    }
    fs_strlcpy(node->host, entry, sizeof node->host);
    return 0;
}

/* The authority's nodes, HOST[:PORT][,HOST[:PORT]...], each checked; the message names the URL and
 * the node: "URL: node 2 of 3 ('h2:99999'): bad port" (as the Python agent). */
static int parse_nodes(const char *url, char *authority, int default_port, struct sink *s, char *err, size_t errlen)
{
    int count = 1;
    for (const char *c = authority; *c; c++)
        count += *c == ',';
    if (count > SINK_NODES_MAX)
        return set_err(err, errlen, url, "more than " FS_STR(SINK_NODES_MAX) " nodes");
    char *entry = authority;
    for (int n = 1; n <= count; n++) {
        char *comma = strchr(entry, ',');
        if (comma)
            *comma = '\0';
        char shown[300];
        snprintf(shown, sizeof shown, "%.250s", entry);
        const char *what = NULL;
        char text[400];
        if (!entry[0] && count > 1) {
            snprintf(text, sizeof text, "node %d of %d is empty", n, count);
            return set_err(err, errlen, url, text);
        }
        struct sink_node *node = &s->nodes[n - 1];
        if (parse_node(entry, default_port, node, &what) == 0) {
            for (int i = 0; i < n - 1 && !what; i++)
                if (strcmp(s->nodes[i].host, node->host) == 0 && s->nodes[i].port == node->port)
                    what = "given twice";
        }
        if (what) {
            if (count == 1)
                return set_err(err, errlen, url, what);
            snprintf(text, sizeof text, "node %d of %d ('%s'): %s", n, count, shown, what);
            return set_err(err, errlen, url, text);
        }
        entry = comma ? comma + 1 : entry + strlen(entry);
    }
    s->nnodes = count;
    return 0;
}

/* %XX and + (a space) decoded in place, as Python's parse_qs does: 0, or -1 for a bad %. */
static int unquote(char *v)
{
    char *out = v;
    for (const char *in = v; *in; in++) {
        if (*in == '%') {
            unsigned x;
            if (!isxdigit((unsigned char)in[1]) || !isxdigit((unsigned char)in[2]) || sscanf(in + 1, "%2x", &x) != 1 ||
                x == 0)
                return -1;
            *out++ = (char)x;
            in += 2;
        } else {
            *out++ = *in == '+' ? ' ' : *in;
        }
    }
    *out = '\0';
    return 0;
}

/* The query's options, NAME=VALUE joined by &: format=line|json; web_config=PATH, families=A,B,
 * drop_labels=L,M (prometheus://; its scheme is checked after, and the names). The last of one
 * name given twice holds, as in the Python agent. */
#define SINK_OPTIONS "format, web_config, families, drop_labels"

static int parse_query(const char *url, char *query, struct sink *s, char *err, size_t errlen)
{
    for (char *save = NULL, *opt = strtok_r(query, "&", &save); opt; opt = strtok_r(NULL, "&", &save)) {
        char *value = strchr(opt, '=');
        if (!value || unquote(value + 1) != 0)
            return set_err(err, errlen, url, "options are NAME=VALUE joined by & (" SINK_OPTIONS ")");
        *value++ = '\0';
        if (strcmp(opt, "format") == 0 && (strcmp(value, "json") == 0 || strcmp(value, "line") == 0))
            s->json = strcmp(value, "json") == 0;
        else if (strcmp(opt, "format") == 0)
            return set_err(err, errlen, url, "format must be line or json");
        else if (strcmp(opt, "web_config") == 0 && value[0])
            fs_strlcpy(s->web_config, value, sizeof s->web_config);
        else if (strcmp(opt, "web_config") == 0)
            return set_err(err, errlen, url, "web_config needs a file (?web_config=PATH)");
        else if (strcmp(opt, "families") == 0) {
            fs_strlcpy(s->families, value, sizeof s->families);
            s->has_families = 1;
        } else if (strcmp(opt, "drop_labels") == 0) {
            fs_strlcpy(s->drop_labels, value, sizeof s->drop_labels);
            s->has_drop_labels = 1;
        } else
            return set_err(err, errlen, url, "unknown option (" SINK_OPTIONS ")");
    }
    return 0;
}

int sink_parse_url(const char *url, struct sink *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    s->serving = -1;
    s->timeout_s = SINK_TIMEOUT_S;
    s->node_backoff_s = SINK_NODE_BACKOFF_S;
    if (sink_check_userinfo(url, err, errlen) != 0)
        return -1;
    if (strlen(url) > SINK_URL_MAX)
        return set_err(err, errlen, "--sink", "URL longer than the limit of " FS_STR(SINK_URL_MAX) " characters");
    fs_strlcpy(s->url, url, sizeof s->url);
    const char *sep = strstr(url, "://");
    if (strcmp(url, "-") == 0) {
        s->kind = SINK_STDOUT;
        return 0;
    }
    if (!sep)
        return set_err(err, errlen, url, "not a sink URL (e.g. udp://127.0.0.1:8094)");
    char scheme[32];
    size_t sl = (size_t)(sep - url);
    if (sl >= sizeof scheme)
        return set_err(err, errlen, url, "unknown sink");
    memcpy(scheme, url, sl);
    scheme[sl] = '\0';
    char rest[512];
    fs_strlcpy(rest, sep + 3, sizeof rest);
    char *query = strchr(rest, '?');
    if (query) {
        *query++ = '\0';
        if (parse_query(url, query, s, err, errlen) != 0)
            return -1;
    }
    int prometheus = strcmp(scheme, "prometheus") == 0;
    if (s->web_config[0] && !prometheus)
        return set_err(err, errlen, url, "web_config is for prometheus:// only");
    if (s->has_families && !prometheus)
        return set_err(err, errlen, url, "families is for prometheus:// only");
    if (s->has_drop_labels && !prometheus)
        return set_err(err, errlen, url, "drop_labels is for prometheus:// only");
    if (prometheus) {
        char why[900];
        if (expo_select_parse(s->has_families ? s->families : NULL, s->has_drop_labels ? s->drop_labels : NULL,
                              &s->select, why, sizeof why) != 0)
            return set_err(err, errlen, url, why);
    }
    if (strcmp(scheme, "stdout") == 0) {
        s->kind = SINK_STDOUT;
        return 0;
    }
    if (strcmp(scheme, "file") == 0) {
        if (!rest[0])
            return set_err(err, errlen, url, "needs a path, e.g. file:///tmp/samples.lp");
        s->kind = SINK_FILE;
        fs_strlcpy(s->path, rest, sizeof s->path);
        return 0;
    }
    static const struct {
        const char *name;
        enum sink_kind kind;
        int default_port, tls;
    } kinds[] = {{"udp", SINK_UDP, 0, 0},
                 {"tcp", SINK_TCP, 0, 0},
                 {"http", SINK_HTTP, 80, 0},
                 {"https", SINK_HTTP, 443, 1},
                 {"influxdb", SINK_INFLUX, 8086, 0},
                 {"influxdb+https", SINK_INFLUX, 8086, 1},
                 {"elasticsearch", SINK_ES, 9200, 0},
                 {"elasticsearch+https", SINK_ES, 9200, 1},
                 {"prometheus", SINK_PROMETHEUS, EXPO_DEFAULT_PORT, 0}};
    size_t k;
    for (k = 0; k < sizeof kinds / sizeof kinds[0] && strcmp(scheme, kinds[k].name) != 0; k++)
        ;
    if (k == sizeof kinds / sizeof kinds[0])
        return set_err(err, errlen, url,
                       "unknown sink (stdout, file, udp, tcp, http, https, influxdb, "
                       "influxdb+https, elasticsearch, elasticsearch+https, prometheus)");
    s->kind = kinds[k].kind;
    s->tls = kinds[k].tls;
    char *slash = strchr(rest, '/');
    if (slash) {
        fs_strlcpy(s->path, slash + 1, sizeof s->path);
        *slash = '\0';
    }
    if (strchr(rest, ',') && s->kind != SINK_ES)
        return set_err(err, errlen, url, "takes one HOST:PORT, not a list (elasticsearch:// takes a list of nodes)");
    if (parse_nodes(url, rest, kinds[k].default_port, s, err, errlen) != 0)
        return -1;
    fs_strlcpy(s->host, s->nodes[0].host, sizeof s->host);
    s->port = s->nodes[0].port;
    /* with a web_config, the file says (expo_open: before any bind) */
    if (s->kind == SINK_PROMETHEUS && !expo_host_is_loopback(s->host) && !s->web_config[0])
        return set_err(err, errlen, url, EXPO_BEYOND_LOOPBACK);
    if (s->kind == SINK_UDP && s->json)
        return set_err(err, errlen, url, "UDP carries line protocol only");
    if ((s->kind == SINK_INFLUX || s->kind == SINK_ES) && !s->path[0])
        return set_err(err, errlen, url, s->kind == SINK_INFLUX ? "needs a database" : "needs an index");
    if (s->kind == SINK_ES)
        s->json = 1;
    return 0;
}

static void set_why(struct sink_outcome *o, const char *what, const char *detail)
{
    o->down = 1;
    o->trouble = TROUBLE_DOWN;
    snprintf(o->why, sizeof o->why, "%.80s%s%.70s", what, detail ? ": " : "", detail ? detail : "");
}

/* A stream socket gets a send time-out (Linux applies it to connect() too): a receiver that
 * accepts and never reads fills the socket buffer, and send() would otherwise wait for ever.
 * HOST may be a name (a compose service's, say): every address it resolves to is tried in turn.
 * On failure *why says what went wrong: the name's resolution (getaddrinfo sets no errno) or the
 * last address's socket() or connect(). */
static int connect_socket(struct sink *s, int type, const char **why)
{
    struct addrinfo hints = {.ai_socktype = type}, *res = NULL;
    char port[8];
    snprintf(port, sizeof port, "%d", s->port);
    int rc = getaddrinfo(s->host, port, &hints, &res);
    if (rc != 0) {
        *why = rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc);
        return -1;
    }
    struct timeval send_timeout = {.tv_sec = TCP_SEND_TIMEOUT_S};
    int fd = -1, err = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (type == SOCK_STREAM)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        *why = strerror(err ? err : EADDRNOTAVAIL);
    return fd;
}

int sink_is_reliable(const struct sink *s)
{
    return s->kind != SINK_STDOUT && s->kind != SINK_UDP && s->kind != SINK_PROMETHEUS;
}

static int creds_err(char *err, size_t n, const struct sink *s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int creds_err(char *err, size_t n, const struct sink *s, const char *fmt, ...)
{
    char text[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return set_err(err, n, s->url, text);
}

/* The store's credentials and CA file, checked together: one way to log in, and a CA file that
 * can be read (curl would only say so at the first send). */
static int take_credentials(struct sink *s, const struct fs_credentials *c, char *err, size_t errlen)
{
    const struct store_names *n = names_of(s);
    const char *user = creds_get(c, n->user), *password = creds_get(c, n->password), *key = creds_get(c, n->key);
    s->creds = c;
    if (key && (user || password))
        return creds_err(err, errlen, s, "%s and a user are both set: give one way to log in (%s)", creds_name(n->key),
                         n->vars);
    if (!user != !password)
        return creds_err(err, errlen, s, "%s is set without %s", creds_name(user ? n->user : n->password),
                         creds_name(user ? n->password : n->user));
    s->user = user;
    s->password = password;
    if (key) {
        size_t len = strlen(n->header) + strlen(key) + 1;
        if (!(s->auth_header = malloc(len)))
            return set_err(err, errlen, s->url, "out of memory");
        snprintf(s->auth_header, len, "%s%s", n->header, key);
    }
    enum fs_cred ca = creds_get(c, n->ca) ? n->ca : FS_CA_FILE;
    s->ca_file = s->tls ? creds_get(c, ca) : NULL;
    if (s->ca_file && access(s->ca_file, R_OK) != 0)
        return creds_err(err, errlen, s, "%s=%.200s: cannot read that CA file: %s", creds_name(ca), s->ca_file,
                         strerror(errno));
    return 0;
}

/* Ask node i from now on: its host and port, and the HTTP URL a request goes to. */
static void use_node(struct sink *s, int i)
{
    const char *scheme = s->tls ? "https" : "http";
    fs_strlcpy(s->host, s->nodes[i].host, sizeof s->host);
    s->port = s->nodes[i].port;
    if (s->kind == SINK_HTTP)
        snprintf(s->endpoint, sizeof s->endpoint, "%s://%s:%d/%s", scheme, s->host, s->port, s->path);
    else if (s->kind == SINK_INFLUX)
        snprintf(s->endpoint, sizeof s->endpoint, "%s://%s:%d/write?db=%s&precision=ns", scheme, s->host, s->port,
                 s->path);
    else
        snprintf(s->endpoint, sizeof s->endpoint, "%s://%s:%d/_bulk", scheme, s->host, s->port);
}

int sink_open(struct sink *s, const struct fs_credentials *creds, char *err, size_t errlen)
{
    if (s->kind == SINK_PROMETHEUS)
        return (s->expo = expo_open(s->url, s->host, s->port, s->web_config[0] ? s->web_config : NULL, &s->select, err,
                                    errlen))
            ? 0
            : -1;
    if (s->kind != SINK_HTTP && s->kind != SINK_INFLUX && s->kind != SINK_ES)
        return 0;
    if (take_credentials(s, creds, err, errlen) != 0)
        return -1;
    s->curl = curl_easy_init();
    if (!s->curl)
        return set_err(err, errlen, s->url, "cannot set up an HTTP client (libcurl)");
    use_node(s, 0);
    return 0;
}

/* -- HTTP: the store policy -------------------------------------------------------------------- */

enum verdict { STORED, DOWN, REFUSED, FORBIDDEN };

static enum verdict judge_status(long status)
{
    if (status >= 200 && status < 300)
        return STORED;
    if (status >= 400 && status < 500 && status != 408 && status != 429)
        return REFUSED;
    return DOWN; /* 408, 429, 5xx; and a redirect or anything odd: nothing was stored */
}

/* One _bulk item: 2xx stored; 429 and 5xx to be sent again; 403 (the user may not write that
 * index) kept and sent again too, as a 403 to the whole batch; any other status refused. An item
 * with no status is no answer: sent again (idempotent, as every resend to Elasticsearch). */
static enum verdict judge_item(const cJSON *item, double *status)
{
    const cJSON *st = item && item->child ? cJSON_GetObjectItemCaseSensitive(item->child, "status") : NULL;
    if (!cJSON_IsNumber(st))
        return DOWN;
    *status = st->valuedouble;
    if (*status == 403)
        return FORBIDDEN;
    return *status >= 200 && *status < 300 ? STORED : *status == 429 || *status >= 500 ? DOWN : REFUSED;
}

/* -- 401, 403 and untrusted certificates: not the data's fault, so kept and sent again ---------- */

static int has_credentials(const struct sink *s)
{
    return s->user || s->auth_header;
}

/* Who a message says was refused: the user, or the key. */
static const char *who(const struct sink *s)
{
    return s->user ? s->user : s->auth_header ? names_of(s)->key_is : "anonymous";
}

/* A store's words, to be logged: a copy (malloc'd; NULL when out of memory) with every secret
 * replaced, whole, before any cut, as a store may echo what it was sent. The answer itself is
 * judged as it came: a short password replaced in it could break its JSON. */
static char *shown(const struct sink *s, const char *text)
{
    char *copy = strdup(text);
    if (copy)
        creds_redact(s->creds, copy);
    return copy;
}

/* The store's short reason: Elasticsearch's error.reason (with additional_unsuccessful_credentials,
 * where an expired API key is told), InfluxDB's "error"; else the answer's start. One line, no
 * secret. */
static void reason_of(const struct sink *s, const cJSON *error, const char *fallback, char *out, size_t n)
{
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(error, "reason");
    const cJSON *more = cJSON_GetObjectItemCaseSensitive(error, "additional_unsuccessful_credentials");
    struct fs_buf text = {0};
    if (cJSON_IsString(reason))
        fs_buf_printf(&text, "%s%s%s", reason->valuestring, cJSON_IsString(more) ? "; " : "",
                      cJSON_IsString(more) ? more->valuestring : "");
    else
        fs_buf_puts(&text, cJSON_IsString(error) ? error->valuestring : fallback[0] ? fallback : "(no reason given)");
    if (text.data)
        creds_redact(s->creds, text.data);
    snprintf(out, n, "%s", text.data ? text.data : "(out of memory)");
    fs_buf_free(&text);
    for (char *c = out; *c; c++)
        if ((unsigned char)*c < 0x20)
            *c = ' ';
}

/* What a 403 names: the index of a _bulk batch's first action, the database, or nothing. */
static void target_of(const struct sink *s, const char *data, size_t len, char *out, size_t n)
{
    out[0] = '\0';
    if (s->kind == SINK_INFLUX)
        snprintf(out, n, "%.199s", s->path);
    if (s->kind != SINK_ES)
        return;
    const char *nl = memchr(data, '\n', len);
    cJSON *action = cJSON_ParseWithLength(data, nl ? (size_t)(nl - data) : len);
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(action, "index"), "_index");
    if (cJSON_IsString(index))
        snprintf(out, n, "%.199s", index->valuestring);
    cJSON_Delete(action);
}

static void say_forbidden(const struct sink *s, const char *target, const char *reason, struct sink_outcome *o)
{
    o->trouble = TROUBLE_FORBIDDEN;
    if (target[0])
        snprintf(o->why, sizeof o->why, "%s may not write %s at %s: %s", who(s), target, s->url, reason);
    else
        snprintf(o->why, sizeof o->why, "%s may not write to %s: %s", who(s), s->url, reason);
}

/* _bulk items answered 403: the first one's index and reason. */
static void forbidden_documents(const struct sink *s, const cJSON *item, struct sink_outcome *o)
{
    char reason[300];
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(item, "_index");
    reason_of(s, cJSON_GetObjectItemCaseSensitive(item, "error"), "", reason, sizeof reason);
    say_forbidden(s, cJSON_IsString(index) ? index->valuestring : "", reason, o);
}

/* 401 or 403 to the whole batch: no credentials, wrong or expired ones, or a user that may not
 * write there. The batch is kept and sent again, as when the store is down (docs/security.md). */
static void judge_login(const struct sink *s, long status, const char *body, const char *data, size_t len,
                        struct sink_outcome *o)
{
    char reason[300];
    cJSON *doc = cJSON_Parse(body);
    reason_of(s, cJSON_GetObjectItemCaseSensitive(doc, "error"), body, reason, sizeof reason);
    cJSON_Delete(doc);
    o->down = 1;
    o->trouble = TROUBLE_AUTH;
    if (!has_credentials(s)) {
        snprintf(o->why, sizeof o->why, "%s needs credentials: set %s (HTTP %ld: %s)", s->url, names_of(s)->vars,
                 status, reason);
    } else if (status == 401) {
        snprintf(o->why, sizeof o->why, "authentication failed %s %s at %s (set %s): %s", s->user ? "as" : "with",
                 who(s), s->url, names_of(s)->vars, reason);
    } else {
        char target[200];
        target_of(s, data, len, target, sizeof target);
        say_forbidden(s, target, reason, o);
    }
}

static void untrusted(const struct sink *s, const char *detail, struct sink_outcome *o)
{
    o->down = 1;
    o->trouble = TROUBLE_TLS;
    snprintf(o->why, sizeof o->why,
             "TLS: the certificate of %s:%d is not trusted (set %s to the CA that signed it)%s%s", s->host, s->port,
             creds_name(names_of(s)->ca), detail[0] ? ": " : "", detail);
}

/* The N of an InfluxDB partial write ("partial write: ... dropped=N"), or -1 if body is not one. */
static int partial_write_dropped(const char *body)
{
    const char *dropped = body && strstr(body, "partial write") ? strstr(body, "dropped=") : NULL;
    if (!dropped)
        return -1;
    char *end = NULL;
    long n = strtol(dropped + 8, &end, 10);
    if (end == dropped + 8 || n < 0)
        return -1;
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* The action and document lines of the documents flagged in `again` (document i: lines 2i, 2i+1). */
static void copy_documents(const char *data, size_t len, const char *again, int count, struct fs_buf *out)
{
    size_t pos = 0;
    for (int line = 0; pos < len && line < 2 * count; line++) {
        const char *nl = memchr(data + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - data) + 1 : len;
        if (again[line / 2])
            fs_buf_append(out, data + pos, end - pos);
        pos = end;
    }
}

static void log_refused_document(const struct sink *s, int refused, int count, double status, const cJSON *error)
{
    char *text = error ? cJSON_PrintUnformatted(error) : NULL;
    if (text)
        creds_redact(s->creds, text);
    LOG_ERR("sink %s: %d of %d documents refused, the first with status %g: %.300s", s->url, refused, count, status,
            text ? text : "(no error given)");
    free(text);
}

/* _bulk answered 2xx: with "errors": true, item i tells what became of document i. A document
 * with no item is sent again, as one with no status. */
static void judge_bulk_items(const struct sink *s, const struct fs_buf *body, const char *data, size_t len, int count,
                             struct sink_outcome *o)
{
    cJSON *doc = body->data ? cJSON_ParseWithLength(body->data, body->len) : NULL;
    char *again = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "errors")) ? calloc((size_t)count, 1) : NULL;
    if (!again) {
        cJSON_Delete(doc);
        return;
    }
    const cJSON *item, *first_error = NULL, *first_forbidden = NULL;
    double first_status = 0;
    int i = 0;
    cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(doc, "items")) {
        if (i >= count)
            break;
        double status = 0;
        enum verdict v = judge_item(item, &status);
        again[i++] = v == DOWN || v == FORBIDDEN;
        if (v == FORBIDDEN && !first_forbidden)
            first_forbidden = item->child;
        if (v == REFUSED && o->refused++ == 0) {
            first_error = cJSON_GetObjectItemCaseSensitive(item->child, "error");
            first_status = status;
        }
    }
    memset(again + i, 1, (size_t)(count - i));
    for (int k = 0; k < count; k++)
        o->again_count += again[k];
    if (o->refused)
        log_refused_document(s, o->refused, count, first_status, first_error);
    if (first_forbidden)
        forbidden_documents(s, first_forbidden, o);
    if (o->again_count)
        copy_documents(data, len, again, count, &o->again);
    free(again);
    cJSON_Delete(doc);
}

/* "sink URL: HEAD: the store's answer" */
static void log_refused(const struct sink *s, const char *head, const char *text)
{
    char *words = shown(s, text);
    LOG_ERR("sink %s: %s: %.300s", s->url, head, words ? words : "(out of memory)");
    free(words);
}

static void judge_answer(const struct sink *s, long status, const struct fs_buf *body, const char *data, size_t len,
                         int count, struct sink_outcome *o)
{
    const char *text = body->data ? body->data : "";
    if (status == 401 || status == 403) {
        judge_login(s, status, text, data, len, o);
        return;
    }
    int dropped = status == 400 && s->kind != SINK_ES ? partial_write_dropped(text) : -1;
    if (dropped >= 0) {
        o->refused = dropped < count ? dropped : count;
        char head[80];
        snprintf(head, sizeof head, "partial write, %d of %d samples refused", o->refused, count);
        log_refused(s, head, text);
        return;
    }
    switch (judge_status(status)) {
    case DOWN: {
        char what[32];
        snprintf(what, sizeof what, "HTTP %ld", status);
        set_why(o, what, NULL);
        o->failover = status == 502 || status == 503 || status == 504; /* that node is down, or outside a cluster */
        return;
    }
    case REFUSED:
    case FORBIDDEN: { /* not from judge_status: judge_login's */
        char head[80];
        o->refused = count;
        snprintf(head, sizeof head, "HTTP %ld, %d samples refused", status, count);
        log_refused(s, head, text);
        return;
    }
    case STORED:
        if (s->kind == SINK_ES)
            judge_bulk_items(s, body, data, len, count, o);
        return;
    }
}

static size_t collect_body(char *data, size_t size, size_t nmemb, void *user)
{
    fs_buf_append(user, data, size * nmemb);
    return size * nmemb;
}

/* The headers of a request: its content type, and the key's Authorization header if any. */
static struct curl_slist *request_headers(const struct sink *s)
{
    const char *type =
        s->kind == SINK_ES ? "Content-Type: application/x-ndjson" : "Content-Type: text/plain; charset=utf-8";
    struct curl_slist *headers = curl_slist_append(NULL, type);
    if (headers && s->auth_header && !curl_slist_append(headers, s->auth_header)) {
        curl_slist_free_all(headers);
        return NULL;
    }
    return headers;
}

/* Basic authentication through curl's own options (never in the URL); https with the store's
 * certificate verified, against the CA file if one is given. */
static void login_options(struct sink *s)
{
    if (s->user) {
        curl_easy_setopt(s->curl, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
        curl_easy_setopt(s->curl, CURLOPT_USERNAME, s->user);
        curl_easy_setopt(s->curl, CURLOPT_PASSWORD, s->password);
    }
    if (s->tls) {
        curl_easy_setopt(s->curl, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(s->curl, CURLOPT_SSL_VERIFYHOST, 2L);
        if (s->ca_file)
            curl_easy_setopt(s->curl, CURLOPT_CAINFO, s->ca_file);
    }
}

static void send_http(struct sink *s, const char *data, size_t len, int count, struct sink_outcome *o)
{
    struct fs_buf body = {0};
    char detail[CURL_ERROR_SIZE] = "";
    struct curl_slist *headers = request_headers(s);
    if (!headers) {
        set_why(o, "out of memory", NULL);
        return;
    }
    curl_easy_reset(s->curl);
    curl_easy_setopt(s->curl, CURLOPT_URL, s->endpoint);
    curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS, data);
    curl_easy_setopt(s->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(s->curl, CURLOPT_HTTPHEADER, headers);
    long timeout_ms = s->timeout_s * 1000 < 1 ? 1L : (long)(s->timeout_s * 1000);
    curl_easy_setopt(s->curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(s->curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms < 2000L ? timeout_ms : 2000L);
    curl_easy_setopt(s->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, collect_body);
    curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(s->curl, CURLOPT_ERRORBUFFER, detail);
    login_options(s);
    CURLcode rc = curl_easy_perform(s->curl);
    long status = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_setopt(s->curl, CURLOPT_ERRORBUFFER, NULL); /* it is this call's */
    curl_slist_free_all(headers);
    if (rc == CURLE_PEER_FAILED_VERIFICATION)
        untrusted(s, detail, o);
    else if (rc != CURLE_OK) { /* no connection, a time-out, an answer cut short: whatever the status said */
        set_why(o, curl_easy_strerror(rc), NULL);
        o->failover = 1;
        curl_off_t connected_us = 0;
        curl_easy_getinfo(s->curl, CURLINFO_CONNECT_TIME_T, &connected_us);
        o->timed_out = rc == CURLE_OPERATION_TIMEDOUT && connected_us > 0;
    } else
        judge_answer(s, status, &body, data, len, count, o);
    fs_buf_free(&body);
}

/* -- sockets, files ---------------------------------------------------------------------------- */

/* Wait until fd takes more bytes, or the deadline passes (0). */
static int wait_writable(int fd, double deadline)
{
    for (;;) {
        double left = deadline - fs_monotonic();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc >= 0 || errno != EINTR)
            return rc > 0;
    }
}

/* The whole batch within TCP_SEND_TIMEOUT_S: SO_SNDTIMEO alone bounds each send() call, and a
 * receiver that trickles a little room now and then would hold a batch far longer. */
static void send_stream(struct sink *s, const char *data, size_t len, struct sink_outcome *o)
{
    const char *why = "";
    if (s->fd < 0)
        s->fd = connect_socket(s, SOCK_STREAM, &why);
    if (s->fd < 0) {
        set_why(o, "cannot connect", why);
        return;
    }
    double deadline = fs_monotonic() + TCP_SEND_TIMEOUT_S;
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(s->fd, data + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        int full = w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
        if ((w < 0 && errno == EINTR) || (full && wait_writable(s->fd, deadline)))
            continue;
        set_why(o, "send", full ? "timed out: the receiver does not read" : w == 0 ? "nothing sent" : strerror(errno));
        close(s->fd);
        s->fd = -1;
        return;
    }
}

static void send_datagrams(struct sink *s, const char *data, size_t len, struct sink_outcome *o)
{
    const char *why = "";
    if (s->fd < 0)
        s->fd = connect_socket(s, SOCK_DGRAM, &why);
    if (s->fd < 0) {
        set_why(o, "cannot open a socket", why);
        return;
    }
    size_t start = 0;
    while (start < len) { /* whole lines only: a datagram is parsed on its own */
        size_t end = len;
        if (len - start > UDP_MAX) {
            end = start + UDP_MAX;
            while (end > start && data[end - 1] != '\n')
                end--;
            if (end == start)
                end = start + UDP_MAX;
        }
        if (send(s->fd, data + start, end - start, MSG_NOSIGNAL) < 0 && errno != ECONNREFUSED) {
            set_why(o, "send", strerror(errno));
            return;
        }
        start = end;
    }
}

static void append_to_file(struct sink *s, const char *data, size_t len, struct sink_outcome *o)
{
    if (!s->file)
        s->file = fopen(s->path, "ab");
    if (!s->file || fwrite(data, 1, len, s->file) != len || fflush(s->file) != 0) {
        set_why(o, s->path, strerror(errno));
        if (s->file)
            fclose(s->file);
        s->file = NULL;
    }
}

/* -- Elasticsearch's nodes, in turn (sinks.h) --------------------------------------------------- */

/* The nodes to ask, in order: those not resting, as listed; when all rest, the one whose rest ends
 * first, alone. Returns how many. */
static int ask_order(const struct sink *s, int *order)
{
    double now = fs_monotonic();
    int n = 0, soonest = 0;
    for (int i = 0; i < s->nnodes; i++) {
        if (s->nodes[i].resting_until <= now)
            order[n++] = i;
        if (s->nodes[i].resting_until < s->nodes[soonest].resting_until)
            soonest = i;
    }
    if (!n)
        order[n++] = soonest;
    return n;
}

/* Node i took the batch: said once as the batches move to it — away from a node that failed, naming
 * the nodes that failed since they last answered (not "those resting": a slow answer may outlast a
 * short rest), and counted; or back to a node listed earlier, after its rest. Nothing at the first
 * answer of the first node. */
static void took(struct sink *s, int i)
{
    s->nodes[i].resting_until = 0;
    s->nodes[i].failing = 0;
    if (i == s->serving)
        return;
    int before = s->serving;
    s->serving = i;
    if (before < 0 && i == 0)
        return;
    /* A move away from a node that failed (or, at the start, past those that did); otherwise the
     * node listed earlier is back after its rest, whatever others still failed when last asked. */
    if (before >= 0 && !s->nodes[before].failing) {
        LOG_WARN("Elasticsearch at %s: %s:%d answers again; batches go to it now", s->url, s->nodes[i].host,
                 s->nodes[i].port);
        return;
    }
    struct fs_buf failed = {0}, whys = {0};
    for (int k = 0; k < s->nnodes; k++)
        if (s->nodes[k].failing) {
            fs_buf_printf(&failed, "%s%s:%d", failed.len ? ", " : "", s->nodes[k].host, s->nodes[k].port);
            fs_buf_printf(&whys, "%s%s", whys.len ? "; " : "", s->nodes[k].why);
        }
    if (failed.len)
        s->failovers++;
    if (failed.len)
        LOG_WARN("Elasticsearch at %s: %s failed (%s); batches go to %s:%d now (a node that fails is left alone for "
                 "%g s)",
                 s->url, failed.data, whys.data ? whys.data : "", s->nodes[i].host, s->nodes[i].port,
                 s->node_backoff_s);
    fs_buf_free(&failed);
    fs_buf_free(&whys);
}

static void send_to_nodes(struct sink *s, const char *data, size_t len, int count, struct sink_outcome *o)
{
    int order[SINK_NODES_MAX];
    int n = ask_order(s, order);
    int timed_out = 0;
    struct fs_buf list = {0};
    for (int k = 0; k < n; k++) {
        int i = order[k];
        use_node(s, i);
        memset(o, 0, sizeof *o);
        send_http(s, data, len, count, o);
        if (!o->failover) {
            took(s, i);
            break;
        }
        s->nodes[i].resting_until = fs_monotonic() + s->node_backoff_s;
        s->nodes[i].failing = 1;
        timed_out |= o->timed_out;
        snprintf(s->nodes[i].why, sizeof s->nodes[i].why, "%.150s", o->why);
        fs_buf_printf(&list, "%s%s:%d: %s", list.len ? "; " : "", s->host, s->port, o->why);
    }
    if (o->failover && s->nnodes > 1)
        snprintf(o->why, sizeof o->why, "no node answers (%.1370s)", list.data ? list.data : "");
    if (o->failover)
        o->timed_out = timed_out;
    fs_buf_free(&list);
}

void sink_send(struct sink *s, const char *data, size_t len, int count, struct sink_outcome *o)
{
    memset(o, 0, sizeof *o);
    switch (s->kind) {
    case SINK_STDOUT:
        if (fwrite(data, 1, len, stdout) != len || fflush(stdout) != 0)
            set_why(o, "stdout", strerror(errno));
        return;
    case SINK_FILE:
        append_to_file(s, data, len, o);
        return;
    case SINK_UDP:
        send_datagrams(s, data, len, o);
        return;
    case SINK_TCP:
        send_stream(s, data, len, o);
        return;
    case SINK_ES:
        send_to_nodes(s, data, len, count, o);
        return;
    case SINK_PROMETHEUS: /* a pull sink: its runner keeps the samples (delivery.c), nothing is sent */
        return;
    default:
        send_http(s, data, len, count, o);
        return;
    }
}

void sink_encoding_reset(struct sink_encoding *e)
{
    e->day = INT64_MIN;
    e->index = NULL;
}

static const char *bulk_action(struct sink_encoding *e, const char *index, int64_t ms)
{
    int64_t day = (ms >= 0 ? ms : ms - 86399999) / 86400000; /* floor: a time before 1970 too */
    if (day == e->day && index == e->index)
        return e->action;
    struct tm tm;
    time_t secs = (time_t)(day * 86400);
    if (!gmtime_r(&secs, &tm))
        memset(&tm, 0, sizeof tm);
    char name[sizeof e->action];
    snprintf(name, sizeof name, "%s-%04d.%02d.%02d", index, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
    struct fs_buf quoted = {0};
    fs_buf_json_string(&quoted, name);
    snprintf(e->action, sizeof e->action, "{\"index\":{\"_index\":%s,\"_id\":", quoted.data ? quoted.data : "\"\"");
    fs_buf_free(&quoted);
    e->day = day;
    e->index = index;
    return e->action;
}

void sink_encode(const struct sink *s, const struct fs_sample *sample, struct sink_encoding *e, struct fs_buf *out)
{
    if (s->kind == SINK_ES) {
        static const char *const index_of[] = {[FS_DOC_AGENT] = FS_AGENTS_INDEX, [FS_DOC_EDGE] = FS_EDGES_INDEX};
        const char *index = sample->schema->kind == FS_DOC_NODE ? s->path : index_of[sample->schema->kind];
        fs_buf_puts(out, bulk_action(e, index, sample->time_ms));
        sample_document_id(sample, out);
        fs_buf_append(out, "}}\n", 3);
    }
    if (s->json)
        sample_json(sample, out);
    else
        sample_line_protocol(sample, out);
}

void sink_close(struct sink *s)
{
    if (s->fd >= 0)
        close(s->fd);
    if (s->file)
        fclose(s->file);
    if (s->curl)
        curl_easy_cleanup(s->curl);
    if (s->auth_header)
        explicit_bzero(s->auth_header, strlen(s->auth_header));
    expo_close(s->expo);
    s->expo = NULL;
    free(s->auth_header);
    s->fd = -1;
    s->file = NULL;
    s->curl = NULL;
    s->auth_header = NULL;
}
