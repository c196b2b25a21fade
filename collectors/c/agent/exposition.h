/* prometheus://HOST:PORT: the agent serves /metrics for a Prometheus to scrape, as the Python
 * agent's sink (src/flowstat/agent/sinks/exposition.py) and in the same bytes
 * (flowstat.schema.prometheus: the families the schemas mark x-prometheus, schema_fields.h).
 *
 * A pull sink: what the agent submits is kept, the latest sample of each node (by run_id, host,
 * node_id and agent) and of each agent, and each scrape is answered from it, in OpenMetrics 1.0 when
 * the scraper's Accept header asks for it (application/openmetrics-text), else in the text format
 * 0.0.4, with the agent's own process_* metrics. A node reported gone (STOPPED, DOWN, LEFT_TOP)
 * keeps its last figures (its report, holding only base fields, is laid over them) for two more
 * scrapes, then goes. The sampling thread hands each sample over under a short lock; the HTTP
 * thread copies what it shows under it, and renders and answers outside it. Loopback only, unless
 * ?web_config= gives TLS and basic authentication (webconfig.h): then the handshake is one more
 * state of a client in the poll loop (SSL_accept on a non-blocking socket, within the same
 * client time-out), and a request without a user's password is answered 401 before anything is
 * read for it (a scrape refused changes nothing). ?families= and ?drop_labels= choose the node
 * families and labels shown (expo_select_parse). At exit (expo_stop), a sink that was scraped keeps
 * serving until one scrape showing every sample put was answered whole (200), or the drain time-out
 * passed (said in one line); one never scraped stops at once. */
#ifndef FLOWSTAT_EXPOSITION_H
#define FLOWSTAT_EXPOSITION_H

#include <stddef.h>

#include "sample.h"
#include "util.h"
#include "webconfig.h"

#define EXPO_DEFAULT_PORT 9464
#define EXPO_SCRAPES_KEPT_GONE 2 /* a node gone is shown this many more scrapes with its final figures */
#define EXPO_HEAD_MAX 8192 /* a request's head, at most: a longer one is answered 400 */
#define EXPO_CLIENT_TIMEOUT_S 5.0 /* a client that has not sent its request and read the answer by then is dropped */
#define EXPO_CLIENTS_MAX 16 /* connections served at once; more wait in the listen queue */
/* A client's answer buffer is kept for its slot's next client up to this size (a few thousand
 * nodes); a larger one goes back after use, but for the largest scrape answer, kept for the next
 * scrape up to EXPO_SPARE_MAX (10,000 nodes: 17 MB). */
#define EXPO_KEPT_MAX (8u << 20)
#define EXPO_SPARE_MAX (64u << 20)

struct expo;

/* Which node families and labels /metrics shows (the sink URL's ?families= and ?drop_labels=); the
 * agent's own families and process_* are always shown. */
struct expo_select {
    unsigned char family[FS_FIELDS_NPROM]; /* FS_FIELDS_PROM's: 1 shown */
    unsigned char label[FS_FIELDS_NLABELS]; /* FS_FIELDS_LABELS': 1 shown */
};
/* Every family and label. */
void expo_select_all(struct expo_select *sel);
/* The selection of families (comma-separated names, each a sample field marked x-prometheus or its
 * family's name; NULL: all) and drop_labels (comma-separated node labels left out, node_id never;
 * NULL: none): 0, or -1 with why (the Python agent's words: flowstat.schema.prometheus.selection). */
int expo_select_parse(const char *families, const char *drop_labels, struct expo_select *sel, char *why, size_t n);

/* Whether host (a URL's, an IPv6 address in brackets or not) is a loopback one: 127.x.x.x, ::1 or
 * localhost. */
int expo_host_is_loopback(const char *host);
/* Why another address is refused (after the URL): the Python agent's words too. */
#define EXPO_BEYOND_LOOPBACK                                                                                      \
    "/metrics is served on loopback only (127.0.0.1, ::1) unless a web_config gives it TLS and basic_auth_users " \
    "(?web_config=PATH: docs/prometheus.md)"
/* Listen on host:port, with TLS and basic authentication as the web-config file at web_config
 * (NULL: none) says (webconfig.h); a host that is not a loopback one only with both; showing what
 * sel selects (NULL: all). NULL with a message naming url in err when it cannot (before any bind
 * when the file or the host is refused). */
struct expo *expo_open(const char *url, const char *host, int port, const char *web_config,
                       const struct expo_select *sel, char *err, size_t errlen);
/* The HTTP thread: 0, or -1 when it cannot be started. */
int expo_start(struct expo *e);
/* Sampling thread: the latest sample of its node (a self-sample: of its agent), kept for the scrapes. */
void expo_put(struct expo *e, const struct fs_sample *s);
/* The HTTP thread stops serving and ends (expo_join waits for it); expo_close frees it all. Called
 * after the last expo_put: when a scrape ever came, it serves on until one showing every sample put
 * was answered whole, for drain_s at most (then it says the final samples may not have been scraped);
 * drain_s < 0: at once, silently. */
void expo_stop(struct expo *e, double drain_s);
void expo_join(struct expo *e);
void expo_close(struct expo *e);

/* The agent's own process_* figures (flowstat.schema.prometheus.PROCESS_FAMILIES). */
struct expo_process {
    double cpu_seconds, start_time_seconds;
    long long resident_memory_bytes, virtual_memory_bytes, open_fds, max_fds;
};
/* The exposition of these nodes' and agents' samples and of process (NULL: none), in OpenMetrics
 * 1.0 (ending with # EOF) or the text format 0.0.4, the node families and labels sel selects (NULL:
 * all): flowstat.schema.prometheus.exposition. */
void expo_render(const struct fs_sample *const *nodes, size_t nnodes, const struct fs_sample *const *agents,
                 size_t nagents, const struct expo_process *process, const struct expo_select *sel, int openmetrics,
                 struct fs_buf *out);

#endif
