/* Where samples go. Same URLs as the Python agent:
 *   stdout://[?format=json]   file:///PATH[?format=json]   udp://HOST:PORT   tcp://HOST:PORT[?format=json]
 *   http://HOST:PORT/PATH     influxdb://HOST:PORT/DB      elasticsearch://HOST:PORT/INDEX
 * This is the transport: encoding a batch, sending it and telling what became of it. Who sends
 * when, spooling and counting is delivery.h's. */
#ifndef FLOWSTAT_SINKS_H
#define FLOWSTAT_SINKS_H

#include <stdio.h>

#include "sample.h"
#include "util.h"

#define SINK_URL_MAX 511

enum sink_kind { SINK_STDOUT, SINK_FILE, SINK_UDP, SINK_TCP, SINK_HTTP, SINK_INFLUX, SINK_ES };

struct sink {
    enum sink_kind kind;
    int json;
    char url[SINK_URL_MAX + 1];
    char host[256];
    int port;
    char path[512]; /* file path, database, index, or HTTP path */
    int fd;
    FILE *file;
    void *curl;
    char endpoint[800]; /* full HTTP URL for curl */
};

/* What became of one batch of `count` samples. The store policy (both agents):
 *  - no connection, a time-out, a cut answer; HTTP 408, 429, 5xx (and anything not 2xx or 4xx):
 *    down: nothing was stored, the whole batch is to be sent again later;
 *  - HTTP 2xx: stored; other 4xx: the data is refused (rejected), never sent again;
 *  - InfluxDB partial write (400, "partial write ... dropped=N"): N rejected, the rest stored;
 *  - Elasticsearch _bulk with "errors": true: per document, 2xx stored, 429 and 5xx to be sent
 *    again (their action and document lines are in `again`), any other status rejected. */
struct sink_outcome {
    int down;
    int rejected;       /* samples refused for good */
    int again_count;    /* samples (documents) to send again later, in `again` */
    struct fs_buf again;
    char why[160];      /* when down: what went wrong */
};

/* Fill s from url; on error returns -1 with a message naming what is wrong in err. */
int sink_parse_url(const char *url, struct sink *s, char *err, size_t errlen);
/* Whether a successful send means the data arrived, so that a spool is worth keeping (not so for
 * stdout or UDP). */
int sink_is_reliable(const struct sink *s);
int sink_open(struct sink *s);
/* Append the sink's encoding of the samples to out. */
void sink_encode(const struct sink *s, const struct fs_sample *samples, size_t n, struct fs_buf *out);
/* Send one encoded batch of `count` samples; the caller frees o->again (fs_buf_free). */
void sink_send(struct sink *s, const char *data, size_t len, int count, struct sink_outcome *o);
void sink_close(struct sink *s);

#endif
