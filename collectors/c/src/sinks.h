/* Where samples go. Same URLs as the Python agent:
 *   stdout://[?format=json]   file:///PATH[?format=json]   udp://HOST:PORT   tcp://HOST:PORT[?format=json]
 *   http://HOST:PORT/PATH     influxdb://HOST:PORT/DB      elasticsearch://HOST:PORT/INDEX */
#ifndef FLOWSTAT_SINKS_H
#define FLOWSTAT_SINKS_H

#include <stdio.h>

#include "sample.h"
#include "spool.h"

enum sink_kind { SINK_STDOUT, SINK_FILE, SINK_UDP, SINK_TCP, SINK_HTTP, SINK_INFLUX, SINK_ES };
enum send_result { SEND_OK, SEND_DOWN, SEND_REJECTED };

struct sink {
    enum sink_kind kind;
    int json;
    char url[512];
    char host[256];
    int port;
    char path[512]; /* file path, database, index, or HTTP path */
    int fd;
    FILE *file;
    void *curl;
    char endpoint[800]; /* full HTTP URL for curl */
    int has_spool, down;
    struct spool spool;
    double next_retry;
    long long delivered, rejected, lost;
};

/* Fill s from url; on error returns -1 with a message naming what is wrong in err. */
int sink_parse_url(const char *url, struct sink *s, char *err, size_t errlen);
int sink_open(struct sink *s, const char *spool_dir, long long spool_max_bytes);
/* Deliver a batch (spooling it, in order, when the sink is down). */
void sink_submit(struct sink *s, const struct fs_sample *samples, size_t n);
/* Retry what is spooled, if the retry time has come. */
void sink_retry(struct sink *s);
/* Whether batches still wait in the spool. */
int sink_pending(const struct sink *s);
void sink_close(struct sink *s);

#endif
