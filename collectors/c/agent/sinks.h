/* Where samples go. Same URLs as the Python agent:
 *   stdout://[?format=json]   file:///PATH[?format=json]   udp://HOST:PORT   tcp://HOST:PORT[?format=json]
 *   http(s)://HOST:PORT/PATH  influxdb[+https]://HOST:PORT/DB  elasticsearch[+https]://HOST:PORT/INDEX
 *   prometheus://HOST[:PORT][?web_config=PATH&families=A,B&drop_labels=L] (port 9464 by default):
 *   /metrics served for a Prometheus to scrape (exposition.h): a pull sink, its runner keeps the
 *   latest samples, the node families and labels the options choose; with TLS
 *   and basic authentication from an exporter-toolkit web-config.yml (webconfig.h), and beyond
 *   loopback only with both
 *   elasticsearch[+https]://HOST:PORT,HOST:PORT,.../INDEX: every node of a cluster (up to
 *   SINK_NODES_MAX), the same scheme, credentials and CA for each. A batch goes to the first node
 *   listed that has not failed lately; a node that cannot be reached, times out or answers 502, 503
 *   or 504 has failed: the batch goes to the next at once, and the failed node rests node_backoff_s
 *   (30 s), then is asked first again. Every node failing is the sink down, as with one node (all
 *   resting: the one whose rest ends first is asked, alone). Any other answer is the store's
 *   (4xx, 429, 500: not failed over). Each change of the node that takes the batches is logged once,
 *   not each batch: a failover (naming the nodes resting, and why each failed), a node back.
 *   As the Python agent (flowstat.stores._base). Resending is safe: each document has its _id.
 * This is the transport: encoding a batch, sending it and telling what became of it. Who sends
 * when, spooling and counting is delivery.h's. The stores' credentials and CA files are creds.h's
 * (docs/security.md): a URL holding a user or a password is refused. */
#ifndef FLOWSTAT_SINKS_H
#define FLOWSTAT_SINKS_H

#include <stdio.h>

#include "creds.h"
#include "exposition.h"
#include "sample.h"
#include "util.h"

#define SINK_URL_MAX 511
#define SINK_NODES_MAX 16 /* nodes an elasticsearch:// URL may list (the Python agent's bound too) */
#define SINK_TIMEOUT_S 5.0 /* an HTTP sink's request time-out, each node's (--sink-timeout) */
#define SINK_NODE_BACKOFF_S 30.0 /* how long a node that failed rests (--node-backoff) */

struct sink_node {
    char host[256];
    int port;
    double resting_until; /* fs_monotonic(): a node that failed is not asked before */
    char why[160]; /* what its last failure was */
    int failing; /* failed since it last answered: named when the batches move on, however long that took */
};

enum sink_kind { SINK_STDOUT, SINK_FILE, SINK_UDP, SINK_TCP, SINK_HTTP, SINK_INFLUX, SINK_ES, SINK_PROMETHEUS };

struct sink {
    enum sink_kind kind;
    long long failovers; /* times the requests moved to another node because the one used failed */
    int json;
    char url[SINK_URL_MAX + 1];
    char host[256]; /* the node asked now (one of nodes) */
    int port;
    struct sink_node nodes[SINK_NODES_MAX]; /* as the URL lists them: one but for Elasticsearch */
    int nnodes;
    int serving; /* the node that took the last batch; -1: none yet */
    double timeout_s, node_backoff_s; /* SINK_TIMEOUT_S, SINK_NODE_BACKOFF_S unless set after sink_parse_url */
    char path[512]; /* file path, database, index, or HTTP path */
    int fd;
    FILE *file;
    void *curl;
    char endpoint[800]; /* full HTTP URL for curl */
    int tls; /* https: the store's certificate is verified */
    /* The store's credentials (the agent's, read only; NULL: none): basic authentication, or an
     * Authorization header of its own (ApiKey, Token), and the CA file for https. */
    const struct fs_credentials *creds;
    const char *user, *password, *ca_file;
    char *auth_header;
    struct expo *expo; /* prometheus://: what /metrics is answered from, and its HTTP server */
    char web_config[SINK_URL_MAX + 1]; /* prometheus://...?web_config=PATH: its TLS and users; "": none */
    /* prometheus://...?families=A,B&drop_labels=L,M: as given (has_*: given), and what they select */
    char families[SINK_URL_MAX + 1], drop_labels[SINK_URL_MAX + 1];
    int has_families, has_drop_labels;
    struct expo_select select;
};

/* Why a sink did not take a batch, or some of its documents: each is logged once as it begins
 * and once as it ends (delivery.c), not at every resend. */
enum sink_trouble {
    TROUBLE_NONE,
    TROUBLE_DOWN, /* no connection, a time-out, 408, 429, 5xx... */
    TROUBLE_AUTH, /* 401: no credentials, or wrong or expired ones */
    TROUBLE_FORBIDDEN, /* 403: the user may not write there */
    TROUBLE_TLS /* the store's certificate is not trusted */
};

/* What became of one batch of `count` samples. The store policy (both agents):
 *  - no connection, a time-out, a cut answer; HTTP 408, 429, 5xx (and anything not 2xx or 4xx):
 *    down: nothing was stored, the whole batch is to be sent again later;
 *  - HTTP 2xx: stored; other 4xx: the data is refused for good, never sent again;
 *  - InfluxDB partial write (400, "partial write ... dropped=N"): N refused, the rest stored;
 *  - Elasticsearch _bulk with "errors": true: per document, 2xx stored, 429 and 5xx to be sent
 *    again (their action and document lines are in `again`), any other status refused. */
struct sink_outcome {
    int down;
    int refused; /* samples refused for good */
    int again_count; /* samples (documents) to send again later, in `again` */
    struct fs_buf again;
    enum sink_trouble trouble; /* when down, or documents answered 403 are in `again` */
    int failover; /* down as a node can be: no answer, 502, 503, 504 (another node may take it) */
    int timed_out; /* down: a node took the request and gave no answer in time (a smaller one may go) */
    char why[1400]; /* then: what went wrong, secrets redacted */
};

/* Fill s from url; on error returns -1 with a message naming what is wrong in err (a URL holding
 * a user or a password is refused, and not repeated: see sink_check_userinfo). */
int sink_parse_url(const char *url, struct sink *s, char *err, size_t errlen);
/* -1 with a message in err when url holds a user or a password ("http://u:p@host/..."): it would
 * show in process lists and logs. The message says where they go instead, and does not hold them. */
int sink_check_userinfo(const char *url, char *err, size_t errlen);
/* Whether a successful send means the data arrived, so that a spool is worth keeping (not so for
 * stdout or UDP). */
int sink_is_reliable(const struct sink *s);
/* Set up the sink's client; an HTTP store's takes its credentials and CA file from creds (may be
 * NULL). -1 with a message in err when they do not fit together (a user and a key, a user without
 * a password, a CA file that cannot be read) or the client cannot be made. */
int sink_open(struct sink *s, const struct fs_credentials *creds, char *err, size_t errlen);
/* What an encoding keeps from one sample to the next of a batch: an Elasticsearch bulk action names
 * INDEX-YYYY.MM.DD, the UTC day of the document's own time (retention deletes whole days), and a
 * batch's documents mostly share their day: its action is written once per day seen. */
struct sink_encoding {
    int64_t day; /* days since the epoch; INT64_MIN: none yet */
    const char *index;
    char action[2 * sizeof((struct sink *)0)->path + 128]; /* {"index":{"_index":"INDEX-YYYY.MM.DD","_id": */
};
void sink_encoding_reset(struct sink_encoding *e);
/* Append the sink's encoding of one sample to out. */
void sink_encode(const struct sink *s, const struct fs_sample *sample, struct sink_encoding *e, struct fs_buf *out);
/* Send one encoded batch of `count` samples; the caller frees o->again (fs_buf_free). */
void sink_send(struct sink *s, const char *data, size_t len, int count, struct sink_outcome *o);
void sink_close(struct sink *s);

#endif
