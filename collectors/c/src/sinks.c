#include "sinks.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cJSON.h>
#include <curl/curl.h>

#define UDP_MAX 60000
#define RETRY_S 1.0

static int set_err(char *err, size_t n, const char *url, const char *what)
{
    snprintf(err, n, "%s: %s", url, what);
    return -1;
}

int sink_parse_url(const char *url, struct sink *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
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
        if (strcmp(query, "format=json") == 0)
            s->json = 1;
        else if (strcmp(query, "format=line") != 0)
            return set_err(err, errlen, url, "format must be line or json");
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
    static const struct { const char *name; enum sink_kind kind; int default_port; } kinds[] = {
        {"udp", SINK_UDP, 0}, {"tcp", SINK_TCP, 0}, {"http", SINK_HTTP, 80},
        {"influxdb", SINK_INFLUX, 8086}, {"elasticsearch", SINK_ES, 9200}};
    size_t k;
    for (k = 0; k < sizeof kinds / sizeof kinds[0] && strcmp(scheme, kinds[k].name) != 0; k++)
        ;
    if (k == sizeof kinds / sizeof kinds[0])
        return set_err(err, errlen, url, "unknown sink (stdout, file, udp, tcp, http, influxdb, elasticsearch)");
    s->kind = kinds[k].kind;
    char *slash = strchr(rest, '/');
    if (slash) {
        fs_strlcpy(s->path, slash + 1, sizeof s->path);
        *slash = '\0';
    }
    char *colon = strrchr(rest, ':');
    if (colon) {
        *colon = '\0';
        char *end = NULL;
        long port = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || port < 1 || port > 65535)
            return set_err(err, errlen, url, "bad port");
        s->port = (int)port;
    } else {
        s->port = kinds[k].default_port;
    }
    if (!rest[0] || !s->port)
        return set_err(err, errlen, url, "needs HOST:PORT");
    fs_strlcpy(s->host, rest, sizeof s->host);
    if (s->kind == SINK_UDP && s->json)
        return set_err(err, errlen, url, "UDP carries line protocol only");
    if ((s->kind == SINK_INFLUX || s->kind == SINK_ES) && !s->path[0])
        return set_err(err, errlen, url, s->kind == SINK_INFLUX ? "needs a database" : "needs an index");
    if (s->kind == SINK_ES)
        s->json = 1;
    return 0;
}

static int connect_socket(struct sink *s, int type)
{
    struct addrinfo hints = {.ai_socktype = type}, *res = NULL;
    char port[8];
    snprintf(port, sizeof port, "%d", s->port);
    if (getaddrinfo(s->host, port, &hints, &res) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

int sink_open(struct sink *s, const char *spool_dir, long long spool_max_bytes)
{
    if (s->kind == SINK_HTTP || s->kind == SINK_INFLUX || s->kind == SINK_ES) {
        s->curl = curl_easy_init();
        if (!s->curl)
            return -1;
        if (s->kind == SINK_HTTP)
            snprintf(s->endpoint, sizeof s->endpoint, "http://%s:%d/%s", s->host, s->port, s->path);
        else if (s->kind == SINK_INFLUX)
            snprintf(s->endpoint, sizeof s->endpoint, "http://%s:%d/write?db=%s&precision=ns", s->host, s->port, s->path);
        else
            snprintf(s->endpoint, sizeof s->endpoint, "http://%s:%d/_bulk", s->host, s->port);
    }
    int reliable = s->kind != SINK_STDOUT && s->kind != SINK_UDP;
    if (reliable && spool_dir) {
        char dir[900], *p;
        snprintf(dir, sizeof dir, "%s/", spool_dir);
        p = dir + strlen(dir);
        for (const char *u = s->url; *u && p < dir + sizeof dir - 1 && p - dir < 80 + (long)strlen(spool_dir); u++)
            *p++ = (char)((*u >= 'a' && *u <= 'z') || (*u >= 'A' && *u <= 'Z') || (*u >= '0' && *u <= '9') ? *u : '_');
        *p = '\0';
        if (spool_open(&s->spool, dir, spool_max_bytes) != 0) {
            LOG_ERR("spool %s: %s", dir, strerror(errno));
            return -1;
        }
        s->has_spool = 1;
    }
    return 0;
}

static size_t collect_body(char *data, size_t size, size_t nmemb, void *user)
{
    fs_buf_append(user, data, size * nmemb);
    return size * nmemb;
}

static enum send_result send_http(struct sink *s, const char *data, size_t len)
{
    struct fs_buf body = {0};
    struct curl_slist *headers = curl_slist_append(NULL, s->kind == SINK_ES ? "Content-Type: application/x-ndjson"
                                                                            : "Content-Type: text/plain; charset=utf-8");
    curl_easy_reset(s->curl);
    curl_easy_setopt(s->curl, CURLOPT_URL, s->endpoint);
    curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS, data);
    curl_easy_setopt(s->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(s->curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(s->curl, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(s->curl, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(s->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, collect_body);
    curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, &body);
    CURLcode rc = curl_easy_perform(s->curl);
    long status = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    enum send_result result = SEND_OK;
    if (rc != CURLE_OK || status >= 500 || status == 429) {
        result = SEND_DOWN;
    } else if (status >= 400) {
        LOG_ERR("sink %s: HTTP %ld: %.300s", s->url, status, body.data ? body.data : "");
        result = SEND_REJECTED;
    } else if (s->kind == SINK_ES && body.data) {
        cJSON *doc = cJSON_ParseWithLength(body.data, body.len);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "errors"))) {
            /* a resend is idempotent (deterministic _id): retry unless every failure is the data's fault */
            result = SEND_REJECTED;
            const cJSON *item;
            cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(doc, "items")) {
                const cJSON *st = cJSON_GetObjectItemCaseSensitive(item->child, "status");
                if (cJSON_IsNumber(st) && (st->valuedouble >= 500 || st->valuedouble == 429))
                    result = SEND_DOWN;
            }
        }
        cJSON_Delete(doc);
    }
    fs_buf_free(&body);
    return result;
}

static enum send_result send_stream(struct sink *s, const char *data, size_t len)
{
    if (s->fd < 0)
        s->fd = connect_socket(s, SOCK_STREAM);
    if (s->fd < 0)
        return SEND_DOWN;
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(s->fd, data + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            close(s->fd);
            s->fd = -1;
            return SEND_DOWN;
        }
        off += (size_t)w;
    }
    return SEND_OK;
}

static enum send_result send_datagrams(struct sink *s, const char *data, size_t len)
{
    if (s->fd < 0)
        s->fd = connect_socket(s, SOCK_DGRAM);
    if (s->fd < 0)
        return SEND_DOWN;
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
        if (send(s->fd, data + start, end - start, MSG_NOSIGNAL) < 0 && errno != ECONNREFUSED)
            return SEND_DOWN;
        start = end;
    }
    return SEND_OK;
}

static enum send_result send_payload(struct sink *s, const char *data, size_t len)
{
    switch (s->kind) {
    case SINK_STDOUT:
        return fwrite(data, 1, len, stdout) == len && fflush(stdout) == 0 ? SEND_OK : SEND_DOWN;
    case SINK_FILE:
        if (!s->file)
            s->file = fopen(s->path, "ab");
        if (!s->file || fwrite(data, 1, len, s->file) != len || fflush(s->file) != 0) {
            if (s->file)
                fclose(s->file);
            s->file = NULL;
            return SEND_DOWN;
        }
        return SEND_OK;
    case SINK_UDP:
        return send_datagrams(s, data, len);
    case SINK_TCP:
        return send_stream(s, data, len);
    default:
        return send_http(s, data, len);
    }
}

static void encode(const struct sink *s, const struct fs_sample *samples, size_t n, struct fs_buf *out)
{
    for (size_t i = 0; i < n; i++) {
        if (s->kind == SINK_ES) {
            char id[600];
            sample_document_id(&samples[i], id, sizeof id);
            fs_buf_puts(out, "{\"index\":{\"_index\":");
            fs_buf_json_string(out, s->path);
            fs_buf_puts(out, ",\"_id\":");
            fs_buf_json_string(out, id);
            fs_buf_puts(out, "}}\n");
        }
        if (s->json)
            sample_json(&samples[i], out);
        else
            sample_line_protocol(&samples[i], out);
    }
}

/* Send one batch; on failure the caller keeps it. */
static int deliver(struct sink *s, const char *data, size_t len, int count)
{
    enum send_result r = send_payload(s, data, len);
    if (r == SEND_DOWN) {
        if (!s->down)
            LOG_ERR("sink %s is down: %s", s->url, s->has_spool ? "spooling" : "samples are lost meanwhile");
        s->down = 1;
        s->next_retry = fs_monotonic() + RETRY_S;
        return -1;
    }
    if (s->down)
        LOG_WARN("sink %s is back", s->url);
    s->down = 0;
    if (r == SEND_REJECTED)
        s->rejected += count;
    else
        s->delivered += count;
    return 0;
}

static int drain_spool(struct sink *s)
{
    while (s->has_spool && !spool_empty(&s->spool)) {
        size_t len = 0;
        int count = 0;
        char *data = spool_peek(&s->spool, &len, &count);
        if (!data)
            return spool_empty(&s->spool) ? 0 : -1;
        int rc = deliver(s, data, len, count);
        free(data);
        if (rc != 0)
            return -1;
        spool_pop(&s->spool);
    }
    return 0;
}

static void keep(struct sink *s, const char *data, size_t len, int count)
{
    if (s->has_spool && spool_push(&s->spool, data, len, count) == 0)
        return;
    if (s->has_spool)
        LOG_ERR("spool %s: cannot write: %s", s->spool.dir, strerror(errno));
    s->lost += count;
}

void sink_retry(struct sink *s)
{
    if (s->has_spool && !spool_empty(&s->spool) && fs_monotonic() >= s->next_retry)
        drain_spool(s);
}

int sink_pending(const struct sink *s)
{
    return s->has_spool && !spool_empty(&s->spool);
}

void sink_submit(struct sink *s, const struct fs_sample *samples, size_t n)
{
    if (n == 0)
        return;
    struct fs_buf out = {0};
    encode(s, samples, n, &out);
    if (out.failed) {
        LOG_ERR("sink %s: out of memory encoding %zu samples", s->url, n);
        s->lost += (long long)n;
    } else if (s->down && fs_monotonic() < s->next_retry) {
        keep(s, out.data, out.len, (int)n); /* do not hammer a sink that is down */
    } else if (drain_spool(s) != 0 || deliver(s, out.data, out.len, (int)n) != 0) {
        keep(s, out.data, out.len, (int)n);
    }
    fs_buf_free(&out);
}

void sink_close(struct sink *s)
{
    if (s->fd >= 0)
        close(s->fd);
    if (s->file)
        fclose(s->file);
    if (s->curl)
        curl_easy_cleanup(s->curl);
    s->fd = -1;
    s->file = NULL;
    s->curl = NULL;
}
