#include "exposition.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OPENMETRICS_TYPE "application/openmetrics-text; version=1.0.0; charset=utf-8"
#define TEXT_0_0_4_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define TLS_HANDSHAKE 0x16 /* the first byte a TLS client sends */
/* exporter-toolkit's (Go's) answer to plain HTTP on a TLS port */
#define NOT_TLS                                                                                        \
    "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n" \
    "Client sent an HTTP request to an HTTPS server.\n"

/* -- rendering: flowstat.schema.prometheus.exposition, byte for byte ---------------------------- */

static const char *const PROM_TYPE_NAMES[] = {
    [FS_PROM_COUNTER] = "counter", [FS_PROM_GAUGE] = "gauge", [FS_PROM_STATESET] = "stateset"};

/* A label's value: backslash, double quote and newline escaped (whole runs of plain characters at
 * a time: every node's labels are written at each scrape). */
static void label_value(struct fs_buf *out, const char *v)
{
    for (;;) {
        size_t run = strcspn(v, "\\\"\n");
        fs_buf_append(out, v, run);
        if (!v[run])
            return;
        fs_buf_append(out, v[run] == '\n' ? "\\n" : v[run] == '"' ? "\\\"" : "\\\\", 2);
        v += run + 1;
    }
}

/* A sample's labels, its tags that hold a value (and are shown: shown NULL, all), name="value"
 * joined by commas (no braces), appended to out. */
static void doc_labels(const struct fs_sample *s, const int *labels, const unsigned char *shown, int nlabels,
                       struct fs_buf *out)
{
    size_t start = out->len;
    for (int i = 0; i < nlabels; i++) {
        int f = labels[i];
        if ((shown && !shown[i]) || !sample_has(s, f) || !s->v[f].s[0])
            continue;
        if (out->len > start)
            fs_buf_append(out, ",", 1);
        fs_buf_puts(out, s->schema->fields[f].name);
        fs_buf_append(out, "=\"", 2);
        label_value(out, s->v[f].s);
        fs_buf_append(out, "\"", 1);
    }
}

/* Each sample's labels, written once a rendering: text[at[i], at[i + 1]) are sample i's. */
struct label_sets {
    struct fs_buf text;
    size_t *at;
};

/* NAME{LABELS,EXTRA} or NAME when both are empty. */
static void sample_head(struct fs_buf *out, const char *name, const char *suffix, const char *labels, size_t nlabels,
                        const char *extra_name, const char *extra_value)
{
    fs_buf_puts(out, name);
    fs_buf_puts(out, suffix);
    if (!nlabels && !extra_name)
        return;
    fs_buf_append(out, "{", 1);
    fs_buf_append(out, labels, nlabels);
    if (extra_name) {
        fs_buf_puts(out, nlabels ? "," : "");
        fs_buf_puts(out, extra_name);
        fs_buf_append(out, "=\"", 2);
        label_value(out, extra_value);
        fs_buf_append(out, "\"", 1);
    }
    fs_buf_append(out, "}", 1);
}

/* A double as Python's _number writes a float. */
static void number(struct fs_buf *out, double v)
{
    if (isnan(v))
        fs_buf_puts(out, "NaN");
    else if (isinf(v))
        fs_buf_puts(out, v > 0 ? "+Inf" : "-Inf");
    else
        fs_buf_double(out, v);
}

/* A field's value in the family's base unit: an integer stays one when the scale is whole. */
static void field_value(struct fs_buf *out, const struct fs_prom_family *fam, const struct fs_sample *s)
{
    const struct fs_value *v = &s->v[fam->field];
    switch (s->schema->fields[fam->field].type) {
    case FS_T_BOOLEAN:
        fs_buf_puts(out, v->i ? "1" : "0");
        return;
    case FS_T_INTEGER:
        if (!fam->scaled)
            fs_buf_int(out, v->i);
        else if (fam->whole_scale)
            fs_buf_int(out, (long long)((double)v->i * fam->scale));
        else
            number(out, (double)v->i * fam->scale);
        return;
    default:
        number(out, fam->scaled ? v->d * fam->scale : v->d);
        return;
    }
}

/* # HELP, # TYPE and (OpenMetrics) # UNIT: 0.0.4 names a counter's family with its _total and
 * knows no stateset. */
static void family_head(struct fs_buf *out, const char *name, enum fs_prom_type type, const char *unit,
                        const char *help, int openmetrics)
{
    const char *suffix = !openmetrics && type == FS_PROM_COUNTER ? "_total" : "";
    const char *kind = !openmetrics && type == FS_PROM_STATESET ? "gauge" : PROM_TYPE_NAMES[type];
    fs_buf_printf(out, "# HELP %s%s ", name, suffix);
    fs_buf_puts(out, help);
    fs_buf_printf(out, "\n# TYPE %s%s %s\n", name, suffix, kind);
    if (openmetrics && unit[0])
        fs_buf_printf(out, "# UNIT %s %s\n", name, unit);
}

static void family_lines(struct fs_buf *out, const struct fs_prom_family *fam, const struct fs_sample *const *docs,
                         const struct label_sets *labels, size_t n, int openmetrics)
{
    size_t shown = 0;
    for (size_t i = 0; i < n; i++)
        shown += (size_t)sample_has(docs[i], fam->field);
    if (!shown)
        return;
    family_head(out, fam->name, fam->type, fam->unit, fam->help, openmetrics);
    for (size_t i = 0; i < n; i++) {
        const struct fs_sample *s = docs[i];
        if (!sample_has(s, fam->field))
            continue;
        const char *l = labels->text.data + labels->at[i];
        size_t nl = labels->at[i + 1] - labels->at[i];
        if (fam->type == FS_PROM_STATESET) {
            const struct fs_field_def *def = &s->schema->fields[fam->field];
            for (int k = 0; k < def->nvalues; k++) {
                sample_head(out, fam->name, "", l, nl, fam->name, def->values[k]);
                fs_buf_puts(out, strcmp(s->v[fam->field].s, def->values[k]) == 0 ? " 1\n" : " 0\n");
            }
            continue;
        }
        sample_head(out, fam->name, fam->type == FS_PROM_COUNTER ? "_total" : "", l, nl, NULL, NULL);
        fs_buf_append(out, " ", 1);
        field_value(out, fam, s);
        fs_buf_append(out, "\n", 1);
    }
}

/* One schema's families over its samples: those shown (NULL: all), with the labels shown (NULL: all). */
static void schema_families(struct fs_buf *out, const struct fs_sample *const *docs, size_t n,
                            const struct fs_prom_family *families, const unsigned char *families_shown, int nfamilies,
                            const int *label_fields, const unsigned char *labels_shown, int nlabels, int openmetrics)
{
    if (!n)
        return;
    struct label_sets labels = {.at = malloc((n + 1) * sizeof *labels.at)};
    fs_buf_reserve(&labels.text, 128 * n);
    if (!labels.at) {
        out->failed = 1;
        return;
    }
    labels.at[0] = 0;
    for (size_t i = 0; i < n; i++) {
        doc_labels(docs[i], label_fields, labels_shown, nlabels, &labels.text);
        labels.at[i + 1] = labels.text.len;
    }
    if (labels.text.failed)
        out->failed = 1;
    for (int f = 0; f < nfamilies && !out->failed; f++)
        if (!families_shown || families_shown[f])
            family_lines(out, &families[f], docs, &labels, n, openmetrics);
    fs_buf_free(&labels.text);
    free(labels.at);
}

/* The standard process_* families, as Prometheus's client libraries name and word them. */
static void process_family(struct fs_buf *out, const char *name, enum fs_prom_type type, const char *unit,
                           const char *help, int openmetrics)
{
    family_head(out, name, type, unit, help, openmetrics);
    fs_buf_puts(out, name);
    fs_buf_puts(out, type == FS_PROM_COUNTER ? "_total " : " ");
}

static void process_families(struct fs_buf *out, const struct expo_process *p, int om)
{
    const struct {
        const char *name;
        enum fs_prom_type type;
        const char *unit, *help;
        double value;
        int whole; /* a count: written as an integer */
    } rows[] = {
        {"process_cpu_seconds", FS_PROM_COUNTER, "seconds", "Total user and system CPU time spent in seconds.",
         p->cpu_seconds, 0},
        {"process_resident_memory_bytes", FS_PROM_GAUGE, "bytes", "Resident memory size in bytes.",
         (double)p->resident_memory_bytes, 1},
        {"process_virtual_memory_bytes", FS_PROM_GAUGE, "bytes", "Virtual memory size in bytes.",
         (double)p->virtual_memory_bytes, 1},
        {"process_start_time_seconds", FS_PROM_GAUGE, "seconds",
         "Start time of the process since unix epoch in seconds.", p->start_time_seconds, 0},
        {"process_open_fds", FS_PROM_GAUGE, "", "Number of open file descriptors.", (double)p->open_fds, 1},
        {"process_max_fds", FS_PROM_GAUGE, "", "Maximum number of open file descriptors.", (double)p->max_fds, 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        process_family(out, rows[i].name, rows[i].type, rows[i].unit, rows[i].help, om);
        if (rows[i].whole)
            fs_buf_int(out, (long long)rows[i].value);
        else
            number(out, rows[i].value);
        fs_buf_append(out, "\n", 1);
    }
}

void expo_render(const struct fs_sample *const *nodes, size_t nnodes, const struct fs_sample *const *agents,
                 size_t nagents, const struct expo_process *process, const struct expo_select *sel, int openmetrics,
                 struct fs_buf *out)
{
    schema_families(out, nodes, nnodes, FS_FIELDS_PROM, sel ? sel->family : NULL, FS_FIELDS_NPROM, FS_FIELDS_LABELS,
                    sel ? sel->label : NULL, FS_FIELDS_NLABELS, openmetrics);
    schema_families(out, agents, nagents, FS_AGENT_FIELDS_PROM, NULL, FS_AGENT_FIELDS_NPROM, FS_AGENT_FIELDS_LABELS,
                    NULL, FS_AGENT_FIELDS_NLABELS, openmetrics);
    if (process)
        process_families(out, process, openmetrics);
    if (openmetrics)
        fs_buf_puts(out, "# EOF\n");
}

/* -- which node families and labels are shown: ?families=, ?drop_labels= ------------------------ */

void expo_select_all(struct expo_select *sel)
{
    memset(sel->family, 1, sizeof sel->family);
    memset(sel->label, 1, sizeof sel->label);
}

int expo_select_parse(const char *families, const char *drop_labels, struct expo_select *sel, char *why, size_t n)
{
    char list[1024];
    expo_select_all(sel);
    if (families) {
        memset(sel->family, 0, sizeof sel->family);
        fs_strlcpy(list, families, sizeof list);
        int named = 0;
        for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
            int f = 0;
            while (f < FS_FIELDS_NPROM && strcmp(name, FS_FIELDS[FS_FIELDS_PROM[f].field].name) != 0 &&
                   strcmp(name, FS_FIELDS_PROM[f].name) != 0)
                f++;
            if (f == FS_FIELDS_NPROM) {
                snprintf(why, n,
                         "families: no node family %s (a sample field marked x-prometheus, e.g. vmrss_kb, or its "
                         "family's name, e.g. flowstat_node_resident_memory_bytes)",
                         name);
                return -1;
            }
            sel->family[f] = 1;
            named = 1;
        }
        if (!named) {
            snprintf(why, n, "families needs at least one name (a sample field, or its flowstat_node_ family)");
            return -1;
        }
    }
    if (drop_labels) {
        fs_strlcpy(list, drop_labels, sizeof list);
        for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
            if (strcmp(name, FS_FIELDS[FS_F_NODE_ID].name) == 0) {
                snprintf(why, n, "drop_labels: %s cannot be dropped: it tells the nodes' series apart", name);
                return -1;
            }
            int l = 0;
            while (l < FS_FIELDS_NLABELS && strcmp(name, FS_FIELDS[FS_FIELDS_LABELS[l]].name) != 0)
                l++;
            if (l == FS_FIELDS_NLABELS) {
                char can[256] = "";
                for (int k = 0; k < FS_FIELDS_NLABELS; k++)
                    if (FS_FIELDS_LABELS[k] != FS_F_NODE_ID)
                        snprintf(can + strlen(can), sizeof can - strlen(can), "%s%s", can[0] ? ", " : "",
                                 FS_FIELDS[FS_FIELDS_LABELS[k]].name);
                snprintf(why, n, "drop_labels: no node label %s (%s)", name, can);
                return -1;
            }
            sel->label[l] = 0;
        }
    }
    return 0;
}

/* -- what the scrapes are answered from: the latest sample of each node, of each agent ---------- */

static const int NODE_KEY[] = {FS_F_RUN_ID, FS_F_HOST, FS_F_NODE_ID, FS_F_AGENT};

struct entry {
    uint64_t hash; /* of its key's values */
    int gone; /* -1; or, reported gone, the scrapes it was shown in since */
    struct fs_sample s;
};

struct latest {
    struct entry *v;
    size_t n, cap;
    /* an index by key hash, open addressing: each slot an entry's index + 1, 0 empty; nslot a power
     * of two at least twice n (a round puts every node: a linear search was O(n^2) a round) */
    size_t *slot, nslot;
};

enum client_tls {
    CLIENT_PLAIN, /* no TLS on this port, or plain HTTP sent to it (answered 400 in plain) */
    CLIENT_FIRST_BYTE, /* TLS: its first byte tells a TLS client from a plain one */
    CLIENT_HANDSHAKE, /* SSL_accept under way */
    CLIENT_TLS /* the handshake done: requests and answers through ssl */
};

struct client {
    int fd; /* -1: a free slot */
    double deadline;
    enum client_tls tls;
    SSL *ssl;
    short want; /* TLS: what the last SSL call waits for (POLLIN, POLLOUT); 0: as the state says */
    size_t got;
    char head[EXPO_HEAD_MAX + 1];
    struct fs_buf reply;
    size_t sent;
    int scrape; /* the reply is a scrape's 200, showing the samples up to version */
    unsigned long long version;
};

struct expo {
    char url[512];
    struct webconfig web; /* ?web_config=: TLS (web.tls) and basic authentication (web.nusers) */
    /* over nodes, agents, version and drain_s: the sampling thread puts, the HTTP thread copies */
    pthread_mutex_t lock;
    struct latest nodes, agents;
    unsigned long long version; /* +1 at each sample put */
    double drain_s; /* expo_stop's */
    struct expo_select select;
    /* the HTTP thread's own */
    struct latest shown_nodes, shown_agents;
    /* a scrape's answer buffer, kept for the next one after it was sent (up to EXPO_SPARE_MAX): the
     * answer is rendered in place, and its pages are not faulted in again at each scrape */
    struct fs_buf spare;
    struct client clients[EXPO_CLIENTS_MAX];
    double start_time;
    int asked; /* a scrape ever came */
    int answered; /* a scrape's 200 was answered whole; answered_version: the samples the last one showed */
    unsigned long long answered_version;
    int listen_fd, wake[2];
    pthread_t thread;
    int started;
};

static const char *key_value(const struct fs_sample *s, int f)
{
    return sample_has(s, f) ? s->v[f].s : "";
}

static uint64_t key_hash(const struct fs_sample *s, const int *key, int nkey)
{
    uint64_t h = 1469598103934665603ull;
    for (int k = 0; k < nkey; k++)
        for (const unsigned char *c = (const unsigned char *)key_value(s, key[k]);; c++) {
            h = (h ^ *c) * 1099511628211ull; /* its NUL too: ("ab", "c") is not ("a", "bc") */
            if (!*c)
                break;
        }
    return h;
}

static int same_key(const struct entry *e, const struct fs_sample *s, uint64_t hash, const int *key, int nkey)
{
    int same = e->hash == hash;
    for (int k = 0; k < nkey && same; k++)
        same = strcmp(key_value(&e->s, key[k]), key_value(s, key[k])) == 0;
    return same;
}

static struct entry *find(struct latest *l, const struct fs_sample *s, uint64_t hash, const int *key, int nkey)
{
    if (!l->nslot) { /* no index (it could not be made): every entry looked at */
        for (size_t i = 0; i < l->n; i++)
            if (same_key(&l->v[i], s, hash, key, nkey))
                return &l->v[i];
        return NULL;
    }
    for (size_t at = hash & (l->nslot - 1); l->slot[at]; at = (at + 1) & (l->nslot - 1))
        if (same_key(&l->v[l->slot[at] - 1], s, hash, key, nkey))
            return &l->v[l->slot[at] - 1];
    return NULL;
}

static void index_entry(struct latest *l, size_t i)
{
    size_t at = l->v[i].hash & (l->nslot - 1);
    while (l->slot[at])
        at = (at + 1) & (l->nslot - 1);
    l->slot[at] = i + 1;
}

/* The index made again for the entries there are, room for one more; -1 out of memory (then the index
 * is dropped, and find looks at every entry). */
static int reindex(struct latest *l)
{
    size_t nslot = 64;
    while (nslot < 2 * (l->n + 1))
        nslot *= 2;
    size_t *slot = calloc(nslot, sizeof *slot);
    free(l->slot);
    l->slot = slot;
    l->nslot = slot ? nslot : 0;
    if (!slot)
        return -1;
    for (size_t i = 0; i < l->n; i++)
        index_entry(l, i);
    return 0;
}

/* A new entry, its hash set and indexed. */
static struct entry *append(struct latest *l, uint64_t hash)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        struct entry *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return NULL;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n].hash = hash;
    if (2 * (l->n + 1) > l->nslot)
        reindex(l); /* out of memory: no index, found by looking at every entry */
    if (l->nslot)
        index_entry(l, l->n);
    return &l->v[l->n++];
}

static int is_gone(const struct fs_sample *s)
{
    const char *state = key_value(s, FS_F_NODE_STATE);
    return strcmp(state, "STOPPED") == 0 || strcmp(state, "DOWN") == 0 || strcmp(state, "LEFT_TOP") == 0;
}

/* A gone node's report holds no figures: laid over its last sample, whose are its final counters. */
static void merge(struct fs_sample *into, const struct fs_sample *s)
{
    for (int f = 0; f < s->schema->nfields; f++)
        if (sample_has(s, f))
            into->v[f] = s->v[f];
    into->set |= s->set;
    into->time_ms = s->time_ms;
}

/* Under lock. Out of memory, a new node or agent is not shown until it can be. */
static void put(struct latest *l, const struct fs_sample *s, const int *key, int nkey, int gone)
{
    uint64_t hash = key_hash(s, key, nkey);
    struct entry *e = find(l, s, hash, key, nkey);
    int known = e != NULL;
    if (!e && !(e = append(l, hash)))
        return;
    if (gone && known)
        merge(&e->s, s);
    else
        e->s = *s;
    e->hash = hash;
    e->gone = gone ? 0 : -1;
}

void expo_put(struct expo *e, const struct fs_sample *s)
{
    pthread_mutex_lock(&e->lock);
    e->version++;
    if (s->schema->kind == FS_DOC_AGENT)
        put(&e->agents, s, FS_AGENT_FIELDS_LABELS, FS_AGENT_FIELDS_NLABELS, 0);
    else
        put(&e->nodes, s, NODE_KEY, (int)(sizeof NODE_KEY / sizeof NODE_KEY[0]), is_gone(s));
    pthread_mutex_unlock(&e->lock);
}

static void copy_value(struct fs_sample *to, const struct fs_sample *from, int f)
{
    if (!sample_has(from, f))
        return;
    if (from->schema->fields[f].type == FS_T_STRING)
        memcpy(to->v[f].s, from->v[f].s, strnlen(from->v[f].s, FS_STR_MAX - 1) + 1);
    else
        to->v[f] = (struct fs_value){.i = from->v[f].i, .d = from->v[f].d};
}

/* What a scrape reads of each sample, copied: its families' fields and its labels. A whole sample
 * is 5 kB, and a whole copy of 10,000 was most of the time the lock was held. */
static int copy_latest(struct latest *to, const struct latest *from, const struct fs_prom_family *families,
                       int nfamilies, const int *labels, int nlabels)
{
    if (to->cap < from->n) {
        struct entry *v = realloc(to->v, from->n * sizeof *v);
        if (!v)
            return -1;
        to->v = v;
        to->cap = from->n;
    }
    for (size_t i = 0; i < from->n; i++) {
        const struct fs_sample *s = &from->v[i].s;
        struct fs_sample *t = &to->v[i].s;
        t->schema = s->schema;
        t->set = s->set;
        t->time_ms = s->time_ms;
        for (int k = 0; k < nfamilies; k++)
            copy_value(t, s, families[k].field);
        for (int k = 0; k < nlabels; k++)
            copy_value(t, s, labels[k]);
    }
    to->n = from->n;
    return 0;
}

/* The gone nodes shown long enough leave (in order: the others keep their places). Under lock. */
static void count_scrape(struct latest *l)
{
    size_t kept = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].gone >= 0 && ++l->v[i].gone >= EXPO_SCRAPES_KEPT_GONE)
            continue;
        if (kept != i)
            l->v[kept] = l->v[i];
        kept++;
    }
    if (kept != l->n) { /* entries moved: their index made again */
        l->n = kept;
        reindex(l);
    }
}

/* The HTTP thread's copy of what to show now (the samples up to *version); the scrape counted. -1
 * out of memory. */
static int snapshot(struct expo *e, unsigned long long *version)
{
    pthread_mutex_lock(&e->lock);
    *version = e->version;
    int rc = copy_latest(&e->shown_nodes, &e->nodes, FS_FIELDS_PROM, FS_FIELDS_NPROM, FS_FIELDS_LABELS,
                         FS_FIELDS_NLABELS) == 0 &&
            copy_latest(&e->shown_agents, &e->agents, FS_AGENT_FIELDS_PROM, FS_AGENT_FIELDS_NPROM,
                        FS_AGENT_FIELDS_LABELS, FS_AGENT_FIELDS_NLABELS) == 0
        ? 0
        : -1;
    if (rc == 0)
        count_scrape(&e->nodes);
    pthread_mutex_unlock(&e->lock);
    return rc;
}

/* -- the agent's own process_* figures, from /proc/self ----------------------------------------- */

/* /proc/self/stat's fields after the command's closing parenthesis: field N is fields[N - 3]. */
static int self_stat(unsigned long long *fields, int nfields)
{
    char text[2048];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return -1;
    text[n] = '\0';
    char *p = strrchr(text, ')');
    if (!p)
        return -1;
    p += 2;
    for (int i = 0; i < nfields; i++) {
        char *end = NULL;
        fields[i] = i == 0 ? 0 : strtoull(p, &end, 10);
        if (i == 0)
            end = p + strcspn(p, " "); /* the state letter */
        if (end == p || (*end != ' ' && *end != '\n'))
            return -1;
        p = end + 1;
    }
    return 0;
}

static long long open_fds(void)
{
    /* Linux >= 6.2 tells the count as the directory's size: a walk of 20,000 descriptors (an agent
     * watching 10,000 nodes) cost a tenth of a scrape */
    struct stat st;
    if (stat("/proc/self/fd", &st) == 0 && st.st_size > 0)
        return (long long)st.st_size;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long long n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A small /proc file's text (cut to n - 1 bytes): 0, or -1 when it cannot be read. */
static int read_small(const char *path, char *buf, size_t n)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, n - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (got < 0)
        return -1;
    buf[got] = '\0';
    return 0;
}

static int process_figures(const struct expo *e, struct expo_process *p)
{
    unsigned long long f[21];
    long pages = 0;
    char text[128];
    int got = read_small("/proc/self/statm", text, sizeof text) == 0 && sscanf(text, "%*s %ld", &pages) == 1;
    struct rlimit lim;
    if (!got || self_stat(f, 21) != 0 || getrlimit(RLIMIT_NOFILE, &lim) != 0)
        return -1;
    p->cpu_seconds = (double)(f[11] + f[12]) / (double)sysconf(_SC_CLK_TCK); /* utime, stime */
    p->resident_memory_bytes = (long long)pages * sysconf(_SC_PAGESIZE);
    p->virtual_memory_bytes = (long long)f[20]; /* vsize */
    p->start_time_seconds = e->start_time;
    p->open_fds = open_fds();
    p->max_fds = (long long)lim.rlim_cur; /* RLIM_INFINITY: -1, as Python's resource */
    return 0;
}

/* When the agent started, in seconds since the epoch: its start ticks against /proc/uptime
 * (flowstat.proc.procfs.start_time). */
static double start_time(void)
{
    unsigned long long f[20];
    double uptime = 0;
    char text[128];
    int got = read_small("/proc/uptime", text, sizeof text) == 0 && sscanf(text, "%lf", &uptime) == 1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (!got || self_stat(f, 20) != 0)
        return 0;
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9 - uptime + (double)f[19] / (double)sysconf(_SC_CLK_TCK);
}

/* -- the HTTP server: GET /metrics, HTTP/1.0 and 1.1, one request per connection ----------------- */

static void drop(struct client *c)
{
    if (c->ssl)
        SSL_free(c->ssl);
    c->ssl = NULL;
    c->want = 0;
    c->tls = CLIENT_PLAIN;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->got = c->sent = 0;
    c->scrape = 0;
    c->reply.len = 0;
    if (c->reply.cap > EXPO_KEPT_MAX)
        fs_buf_free(&c->reply);
}

static void respond(struct client *c, const char *status, const char *type, const char *body, size_t len)
{
    c->reply.len = 0;
    c->reply.failed = 0;
    fs_buf_reserve(&c->reply, len + 256); /* at once: not doubled and copied up to a large answer */
    const char *extra = strncmp(status, "405", 3) == 0 ? "Allow: GET\r\n"
        : strncmp(status, "401", 3) == 0               ? "WWW-Authenticate: Basic realm=\"" WEBCONFIG_REALM "\"\r\n"
                                                       : "";
    fs_buf_printf(&c->reply, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                  status, type, len, extra);
    fs_buf_append(&c->reply, body, len);
    if (c->reply.failed)
        drop(c);
}

static void respond_text(struct client *c, const char *status, const char *text)
{
    respond(c, status, "text/plain; charset=utf-8", text, strlen(text));
}

/* "METHOD /TARGET HTTP/1.x": 0 with the method's and the target's lengths, or -1. */
static int request_line(const char *line, size_t len, size_t *method, size_t *target)
{
    *method = strcspn(line, " ");
    if (*method == 0 || *method >= len || line[*method + 1] != '/')
        return -1;
    const char *t = line + *method + 1;
    *target = strcspn(t, " \r\n");
    const char *version = t + *target;
    size_t rest = len - (size_t)(version - line);
    if (rest < 9 || (strncmp(version, " HTTP/1.0", 9) != 0 && strncmp(version, " HTTP/1.1", 9) != 0))
        return -1;
    return rest == 9 || (rest == 10 && version[9] == '\r') ? 0 : -1;
}

/* The value of the head's first header named `name` (after its request line), spaces before it
 * skipped, up to the end of its line, in out (cut to n - 1 bytes): 0, or -1 when there is none. */
static int header_value(const char *head, const char *name, char *out, size_t n)
{
    size_t len = strlen(name);
    for (const char *line = strchr(head, '\n'); line; line = strchr(line, '\n')) {
        line++;
        if (strncasecmp(line, name, len) != 0 || line[len] != ':')
            continue;
        const char *v = line + len + 1;
        v += strspn(v, " \t");
        size_t end = strcspn(v, "\r\n");
        snprintf(out, n, "%.*s", (int)end, v);
        return 0;
    }
    return -1;
}

/* Whether a header of the head (after its request line) named `name` holds `word`. */
static int header_holds(const char *head, const char *name, const char *word)
{
    size_t n = strlen(name);
    for (const char *line = strchr(head, '\n'); line; line = strchr(line, '\n')) {
        line++;
        if (strncasecmp(line, name, n) != 0 || line[n] != ':')
            continue;
        size_t end = strcspn(line, "\r\n");
        if (memmem(line + n + 1, end - n - 1, word, strlen(word)))
            return 1;
    }
    return 0;
}

/* A scrape's answer is rendered in the client's reply after this much room, where its head is
 * written once its length is known (no copy of the body). */
#define HEAD_ROOM 256

/* The head of a 200 whose body (its length: body_len) follows HEAD_ROOM bytes in: written just
 * before it, where the answer is sent from. */
static void head_before_body(struct client *c, const char *type, size_t body_len)
{
    char head[HEAD_ROOM];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", type,
                     body_len);
    memcpy(c->reply.data + HEAD_ROOM - n, head, (size_t)n);
    c->sent = HEAD_ROOM - (size_t)n;
}

/* A scrape's answer sent: its buffer kept for the next scrape, when it is the largest yet. */
static void keep_spare(struct expo *e, struct client *c)
{
    if (c->reply.cap <= e->spare.cap || c->reply.cap > EXPO_SPARE_MAX)
        return;
    struct fs_buf kept = e->spare;
    e->spare = c->reply;
    e->spare.len = 0;
    e->spare.failed = 0;
    c->reply = kept;
}

static void scrape(struct expo *e, struct client *c, int openmetrics)
{
    if (e->spare.cap > c->reply.cap) {
        struct fs_buf mine = c->reply;
        c->reply = e->spare;
        e->spare = mine;
    }
    struct fs_buf *body = &c->reply;
    body->len = 0;
    body->failed = 0;
    e->asked = 1;
    unsigned long long version = 0;
    if (snapshot(e, &version) != 0) {
        respond_text(c, "500 Internal Server Error", "flowstat agent: out of memory\n");
        return;
    }
    const struct fs_sample **nodes = calloc(e->shown_nodes.n + e->shown_agents.n + 1, sizeof *nodes);
    if (!nodes) {
        respond_text(c, "500 Internal Server Error", "flowstat agent: out of memory\n");
        return;
    }
    const struct fs_sample **agents = nodes + e->shown_nodes.n;
    for (size_t i = 0; i < e->shown_nodes.n; i++)
        nodes[i] = &e->shown_nodes.v[i].s;
    for (size_t i = 0; i < e->shown_agents.n; i++)
        agents[i] = &e->shown_agents.v[i].s;
    struct expo_process p;
    int has_process = process_figures(e, &p) == 0;
    fs_buf_reserve(body, HEAD_ROOM);
    body->len = body->failed ? 0 : HEAD_ROOM;
    expo_render(nodes, e->shown_nodes.n, agents, e->shown_agents.n, has_process ? &p : NULL, &e->select, openmetrics,
                body);
    free(nodes);
    if (body->failed) {
        respond_text(c, "500 Internal Server Error", "flowstat agent: out of memory\n");
        return;
    }
    head_before_body(c, openmetrics ? OPENMETRICS_TYPE : TEXT_0_0_4_TYPE, body->len - HEAD_ROOM);
    c->scrape = 1;
    c->version = version;
}

/* The request line is read: a bad one is answered 400 at once; a whole head, what it asks. */
static void answer(struct expo *e, struct client *c)
{
    size_t method = 0, target = 0;
    size_t line = strcspn(c->head, "\n");
    if (c->head[line] != '\n' && c->got < EXPO_HEAD_MAX)
        return; /* more to come */
    if (request_line(c->head, line, &method, &target) != 0) {
        respond_text(c, "400 Bad Request", "flowstat agent: not an HTTP request\n");
        return;
    }
    int whole = strstr(c->head, "\r\n\r\n") || strstr(c->head, "\n\n");
    if (!whole) {
        if (c->got >= EXPO_HEAD_MAX)
            respond_text(c, "400 Bad Request", "flowstat agent: request head too long\n");
        return;
    }
    const char *t = c->head + method + 1;
    size_t path = strcspn(t, "? \r\n");
    if (e->web.unusable) { /* as exporter-toolkit answers a request when its file cannot be used */
        respond_text(c, "500 Internal Server Error", "Internal Server Error\n");
        return;
    }
    if (e->web.nusers) { /* before anything is read: a scrape refused changes nothing */
        char authorization[1200];
        int given = header_value(c->head, "Authorization", authorization, sizeof authorization) == 0;
        int allowed = given && webconfig_allows(&e->web, authorization);
        OPENSSL_cleanse(authorization, sizeof authorization);
        if (!allowed) {
            respond_text(c, "401 Unauthorized", "Unauthorized\n");
            return;
        }
    }
    if (method != 3 || strncmp(c->head, "GET", 3) != 0)
        respond_text(c, "405 Method Not Allowed", "flowstat agent: GET only\n");
    else if (path != 8 || strncmp(t, "/metrics", 8) != 0)
        respond_text(c, "404 Not Found", "flowstat agent: /metrics only\n");
    else
        scrape(e, c, header_holds(c->head, "Accept", "application/openmetrics-text"));
}

/* An SSL call's outcome: > 0 done (bytes), 0 to be called again when c->want is ready, -1 failed
 * (the connection is to be dropped). */
static int ssl_outcome(struct client *c, int rc)
{
    if (rc > 0) {
        c->want = 0;
        return rc;
    }
    int err = SSL_get_error(c->ssl, rc);
    ERR_clear_error(); /* a failed handshake leaves its reasons: none is kept for the next client */
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        c->want = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return 0;
    }
    return -1;
}

/* Bytes read into buf: > 0, 0 for none yet (would block), -1 when the client is gone or failed. */
static ssize_t client_recv(struct client *c, char *buf, size_t n)
{
    if (c->ssl) {
        return ssl_outcome(c, SSL_read(c->ssl, buf, (int)n));
    }
    ssize_t got = recv(c->fd, buf, n, 0);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    return got > 0 ? got : -1;
}

static void client_read(struct expo *e, struct client *c)
{
    /* TLS: what the client sent may wait in the SSL object's buffers, where poll() does not see
     * it: read until it would block, or the request is answered */
    do {
        ssize_t n = client_recv(c, c->head + c->got, EXPO_HEAD_MAX - c->got);
        if (n == 0)
            return;
        if (n < 0) { /* gone before its request was whole */
            drop(c);
            return;
        }
        c->got += (size_t)n;
        c->head[c->got] = '\0';
        if (memchr(c->head, '\0', c->got)) {
            respond_text(c, "400 Bad Request", "flowstat agent: not an HTTP request\n");
            return;
        }
        answer(e, c);
    } while (c->ssl && c->fd >= 0 && !c->reply.len && c->got < EXPO_HEAD_MAX);
}

static void client_write(struct expo *e, struct client *c)
{
    ssize_t n;
    if (c->ssl) {
        n = ssl_outcome(c, SSL_write(c->ssl, c->reply.data + c->sent, (int)(c->reply.len - c->sent)));
        if (n == 0)
            return;
    } else {
        n = send(c->fd, c->reply.data + c->sent, c->reply.len - c->sent, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
    }
    if (n <= 0) {
        drop(c);
        return;
    }
    c->sent += (size_t)n;
    if (c->sent == c->reply.len) {
        if (c->scrape && (!e->answered || c->version > e->answered_version)) { /* answered whole */
            e->answered = 1;
            e->answered_version = c->version;
        }
        if (c->scrape)
            keep_spare(e, c);
        if (c->ssl) {
            SSL_shutdown(c->ssl); /* its close_notify, once: no wait for the client's */
            ERR_clear_error();
        }
        shutdown(c->fd, SHUT_WR);
        drop(c);
    }
}

static void client_handshake(struct expo *e, struct client *c)
{
    int rc = ssl_outcome(c, SSL_accept(c->ssl));
    if (rc < 0) {
        drop(c); /* not silent for long, nor a stall: the next client is served */
        return;
    }
    if (rc > 0) {
        c->tls = CLIENT_TLS;
        client_read(e, c); /* its request may have come with the handshake's last flight */
    }
}

/* TLS port: a TLS client's first byte begins a handshake record; anything else is a plain HTTP
 * client, told in plain HTTP where it is (as exporter-toolkit does). */
static void client_first_byte(struct expo *e, struct client *c)
{
    unsigned char first;
    ssize_t n = recv(c->fd, &first, 1, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        drop(c);
        return;
    }
    if (first != TLS_HANDSHAKE) {
        char sink[4096]; /* what it sent so far, read: its close is then no reset that could lose the answer */
        for (int i = 0; i < 16 && recv(c->fd, sink, sizeof sink, 0) > 0; i++)
            ;
        c->tls = CLIENT_PLAIN;
        c->reply.len = 0;
        fs_buf_puts(&c->reply, NOT_TLS);
        if (c->reply.failed)
            drop(c);
        return;
    }
    if (!e->web.tls || !(c->ssl = SSL_new(e->web.tls)) || SSL_set_fd(c->ssl, c->fd) != 1) {
        ERR_clear_error();
        drop(c);
        return;
    }
    SSL_set_accept_state(c->ssl);
    c->tls = CLIENT_HANDSHAKE;
    client_handshake(e, c);
}

/* What the client's socket is ready for is what its state waits for. */
static void client_step(struct expo *e, struct client *c)
{
    if (c->tls == CLIENT_FIRST_BYTE)
        client_first_byte(e, c);
    else if (c->tls == CLIENT_HANDSHAKE)
        client_handshake(e, c);
    else if (c->reply.len)
        client_write(e, c);
    else
        client_read(e, c);
}

/* The web-config read again if it changed (webconfig_reload), said in one line when it was. */
static void web_reload(struct expo *e)
{
    char text[900];
    int rc = webconfig_reload(&e->web, text, sizeof text);
    if (rc < 0)
        LOG_WARN("sink %s: web_config %s: /metrics refused until the file is fixed", e->url, text);
    else if (rc > 0)
        LOG_INFO("sink %s: web_config %s: read again (%zu users)", e->url, e->web.files[0], e->web.nusers);
}

static void accept_client(struct expo *e)
{
    int fd = accept4(e->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    web_reload(e);
    if (e->web.unusable && e->web.tls_fixed) { /* no handshake, as exporter-toolkit's fails */
        close(fd);
        return;
    }
    for (int i = 0; i < EXPO_CLIENTS_MAX; i++)
        if (e->clients[i].fd < 0) {
            e->clients[i].fd = fd;
            e->clients[i].deadline = fs_monotonic() + EXPO_CLIENT_TIMEOUT_S; /* its handshake included */
            e->clients[i].tls = e->web.tls_fixed ? CLIENT_FIRST_BYTE : CLIENT_PLAIN;
            return;
        }
    close(fd);
}

/* The poll set: the wake pipe, the listening socket (while a slot is free), each client; the
 * time-out: the nearest client's deadline (ms, -1: none). */
static int poll_set(struct expo *e, struct pollfd *p, int *who, int *n)
{
    int free_slot = 0, timeout = -1;
    double now = fs_monotonic();
    *n = 2;
    p[0] = (struct pollfd){.fd = e->wake[0], .events = POLLIN};
    for (int i = 0; i < EXPO_CLIENTS_MAX; i++) {
        struct client *c = &e->clients[i];
        if (c->fd < 0) {
            free_slot = 1;
            continue;
        }
        int ms = c->deadline <= now ? 0 : (int)((c->deadline - now) * 1000) + 1;
        timeout = timeout < 0 || ms < timeout ? ms : timeout;
        short events = c->want ? c->want : c->reply.len ? POLLOUT : POLLIN;
        p[*n] = (struct pollfd){.fd = c->fd, .events = events};
        who[(*n)++] = i;
    }
    p[1] = (struct pollfd){.fd = e->listen_fd, .events = free_slot ? POLLIN : 0};
    return timeout;
}

/* Told to stop: whether to serve on (1), until *until, for a scrape of the final samples (*final);
 * not when no scrape ever came, one already showed them, or drain_s < 0. */
static int drain_begins(struct expo *e, double *until, unsigned long long *final)
{
    char x[16];
    while (read(e->wake[0], x, sizeof x) > 0)
        ;
    pthread_mutex_lock(&e->lock);
    double drain_s = e->drain_s;
    *final = e->version;
    pthread_mutex_unlock(&e->lock);
    *until = fs_monotonic() + (drain_s > 0 ? drain_s : 0);
    return drain_s >= 0 && e->asked && !(e->answered && e->answered_version >= *final);
}

static void *serve(void *arg)
{
    struct expo *e = arg;
    struct pollfd p[2 + EXPO_CLIENTS_MAX];
    int who[2 + EXPO_CLIENTS_MAX];
    int draining = 0;
    double until = 0;
    unsigned long long final = 0;
    for (;;) {
        int n = 0;
        int timeout = poll_set(e, p, who, &n);
        if (draining) {
            double left = until - fs_monotonic();
            int ms = left <= 0 ? 0 : (int)(left * 1000) + 1;
            timeout = timeout < 0 || ms < timeout ? ms : timeout;
        }
        if (poll(p, (nfds_t)n, timeout) < 0 && errno != EINTR) {
            LOG_ERR("sink %s: poll: %s: /metrics is no longer served", e->url, strerror(errno));
            break;
        }
        if (p[0].revents) {
            double first_until = until;
            if (!drain_begins(e, &until, &final))
                break;
            if (draining) /* told again: the drain does not begin anew */
                until = first_until;
            draining = 1;
        }
        if (p[1].revents & POLLIN)
            accept_client(e);
        for (int k = 2; k < n; k++)
            if (p[k].revents)
                client_step(e, &e->clients[who[k]]);
        double now = fs_monotonic();
        for (int i = 0; i < EXPO_CLIENTS_MAX; i++)
            if (e->clients[i].fd >= 0 && e->clients[i].deadline <= now)
                drop(&e->clients[i]); /* silent, or too slow to read its answer */
        if (draining && e->answered && e->answered_version >= final)
            break; /* the final samples were scraped */
        if (draining && now >= until) {
            LOG_WARN("sink %s: no scrape came within the drain time-out (--drain-timeout) after the last samples: "
                     "the final samples may not have been scraped",
                     e->url);
            break;
        }
    }
    return NULL;
}

/* -- life cycle -------------------------------------------------------------------------------- */

int expo_host_is_loopback(const char *host)
{
    char bare[256];
    size_t len = strlen(host);
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']' && len - 2 < sizeof bare) {
        memcpy(bare, host + 1, len - 2);
        bare[len - 2] = '\0';
        host = bare;
    }
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return strcasecmp(host, "localhost") == 0;
}

static int listen_on(const char *host, int port, const char **why)
{
    char bare[256], service[8];
    size_t len = strlen(host);
    fs_strlcpy(bare, host[0] == '[' ? host + 1 : host, sizeof bare);
    if (host[0] == '[' && len >= 2)
        bare[len - 2] = '\0';
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
    int rc = getaddrinfo(bare, service, &hints, &res);
    if (rc != 0) {
        *why = rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc);
        return -1;
    }
    int fd = -1, err = EADDRNOTAVAIL, one = 1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        *why = strerror(err);
    return fd;
}

struct expo *expo_open(const char *url, const char *host, int port, const char *web_config,
                       const struct expo_select *sel, char *err, size_t errlen)
{
    const char *why = "out of memory";
    struct expo *e = calloc(1, sizeof *e);
    if (e) {
        e->wake[0] = e->wake[1] = -1;
        e->listen_fd = -1;
        if (sel)
            e->select = *sel;
        else
            expo_select_all(&e->select);
        for (int i = 0; i < EXPO_CLIENTS_MAX; i++)
            e->clients[i].fd = -1;
    }
    if (e && web_config) {
        char text[900];
        if (webconfig_load(web_config, &e->web, text, sizeof text) != 0) {
            snprintf(err, errlen, "%s: web_config %s", url, text);
            expo_close(e);
            return NULL;
        }
    }
    if (e)
        e->web.users_needed = !expo_host_is_loopback(host); /* a reload leaving none: refused */
    if (e && !expo_host_is_loopback(host) && !(e->web.tls && e->web.nusers)) { /* before any bind */
        snprintf(err, errlen, "%s: %s", url, EXPO_BEYOND_LOOPBACK);
        expo_close(e);
        return NULL;
    }
    if (e)
        e->listen_fd = listen_on(host, port, &why);
    if (!e || e->listen_fd < 0 || pipe2(e->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        if (e && e->listen_fd >= 0)
            why = strerror(errno);
        snprintf(err, errlen, "%s: cannot listen on %s:%d: %s", url, host, port, why);
        if (e)
            expo_close(e);
        return NULL;
    }
    fs_strlcpy(e->url, url, sizeof e->url);
    pthread_mutex_init(&e->lock, NULL);
    e->start_time = start_time();
    char users[64] = "";
    if (e->web.nusers)
        snprintf(users, sizeof users, ", basic authentication (%zu users)", e->web.nusers);
    LOG_INFO("serving /metrics on %s://%s:%d/metrics%s", e->web.tls ? "https" : "http", host, port, users);
    return e;
}

int expo_start(struct expo *e)
{
    if (pthread_create(&e->thread, NULL, serve, e) != 0)
        return -1;
    e->started = 1;
    return 0;
}

void expo_stop(struct expo *e, double drain_s)
{
    if (e->url[0]) { /* the lock is made */
        pthread_mutex_lock(&e->lock);
        e->drain_s = drain_s;
        pthread_mutex_unlock(&e->lock);
    }
    if (e->wake[1] >= 0 && write(e->wake[1], "x", 1) < 0)
        LOG_ERR("sink %s: cannot tell its HTTP thread to stop: %s", e->url, strerror(errno));
}

void expo_join(struct expo *e)
{
    if (e->started)
        pthread_join(e->thread, NULL);
    e->started = 0;
}

void expo_close(struct expo *e)
{
    if (!e)
        return;
    if (e->started) /* never left running: a close without a stop stops it, at once */
        expo_stop(e, -1);
    expo_join(e);
    for (int i = 0; i < EXPO_CLIENTS_MAX; i++) {
        drop(&e->clients[i]);
        fs_buf_free(&e->clients[i].reply);
    }
    fs_buf_free(&e->spare);
    if (e->listen_fd >= 0)
        close(e->listen_fd);
    for (int i = 0; i < 2; i++)
        if (e->wake[i] >= 0)
            close(e->wake[i]);
    if (e->url[0]) /* set once the lock was */
        pthread_mutex_destroy(&e->lock);
    webconfig_free(&e->web);
    free(e->nodes.v);
    free(e->nodes.slot);
    free(e->agents.v);
    free(e->agents.slot);
    free(e->shown_nodes.v);
    free(e->shown_agents.v);
    free(e);
}
