/* One delivery thread per sink, like the Python agent's SinkRunner: a sink that hangs (an HTTP
 * store holding its answer up to the 5 s time-out, a TCP receiver that stops reading) must never
 * delay sampling. The sampling thread only encodes each tick's batch for the sink and, when the
 * sink has a spool, writes it there (write-ahead: an agent killed while its sink hangs leaves what
 * it sampled on disk, for the next one to send); else, or when the spool cannot be written, it
 * queues it in memory. The sink's thread sends the spool, oldest first, removing each batch once
 * the sink took it, then what is queued; while the sink is down it asks again every second. The
 * sink and its counters are that thread's own; the spool is shared (spool.h). After an outage, what
 * is sampled since goes before the backlog (fresh_from below). A prometheus:// sink (exposition.h)
 * is pulled, not sent to: runner_add keeps each sample for the scrapes, and its thread serves them. */
#ifndef FLOWSTAT_DELIVERY_H
#define FLOWSTAT_DELIVERY_H

#include <pthread.h>

#include "sinks.h"
#include "spool.h"

/* The backlog's request, at least every this many while fresh batches wait (fresh_from below). */
#define BACKLOG_EVERY 8

/* --spool-dir's longest path: each sink's folder in it is named by up to 80 characters more. */
#define SPOOL_DIR_MAX 400

struct batch;

/* What became of a sink's samples so far, and what waits in its spool: a self-sample's figures. */
struct runner_figures {
    long long delivered, refused, lost, send_failures, spool_dropped;
    long long failovers; /* the sink's moves to another of its nodes (sinks.h) */
    long long spooled_batches, spooled_samples;
    int down; /* its last send found it down */
};

struct sink_runner {
    struct sink sink;

    /* the sink thread's own: read by others only after runner_join */
    struct spool spool;
    int has_spool, down;
    enum sink_trouble trouble; /* what the last send found wrong, logged as it began */
    double next_retry, drain_timeout;
    long long send_max; /* bytes: spooled batches sent together, at most (runner_open: SPOOL_SEND_MAX_BYTES) */
    long long send_limit; /* what goes together now: halved at each send the sink took and did not answer
                             in time (a request too big for the time-out would go again as it is), kept
                             while the sink catches up, send_max again once nothing waits; 0: one batch */
    long long delivered, refused, lost;
    long long send_failures; /* sends that found the sink down */
    int put_aside; /* batches spooled unsent at exit: the sink was too slow */
    unsigned long long last_kept; /* the spool's number of the last batch keep() put there */
    unsigned long long forbidden_batch; /* the newest batch of documents answered 403 (forbidden_kept) */
    int forbidden_kept;
    int ahead_failing; /* the sampling thread's: the spool could not be written ahead of a send */
    /* the sampling thread's: the batch being encoded, a sample at a time as each is taken (while
     * it is in the cache: encoding a round's samples afterwards read 5 MB again at 1,000 processes) */
    struct fs_buf building;
    int building_count;
    struct sink_encoding encoding;
    size_t sample_bytes; /* the last batch's bytes per sample: the next one's room is taken at once */
    int backlog; /* the sink was found down since it last caught up: once it has, memory goes back (util.h) */
    /* Batches numbered from fresh_from on were written after the sink was last found down (or
     * after the agent started, behind what an earlier one left): they go first, the backlog when
     * none waits, so that what is sampled after an outage is stored at once, whatever the store
     * can take beside it (a tick's batch may be a whole request: taking the backlog in turns would
     * halve what the live ones get of a store that is slow to recover). The backlog gets a request
     * at least every BACKLOG_EVERY (fresh_run: fresh requests in a row), so that live batches that
     * never run out (documents a store answers 403, written again at the back while that lasts)
     * cannot stop it. fresh_from is set again each time the whole sink is found down. */
    unsigned long long fresh_from;
    int fresh_run;
    struct fs_buf taken; /* what was last read from the spool to be sent (drain_spool) */

    /* shared with the sampling thread, under lock */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct batch *head, *tail;
    long long queued_bytes, queue_max;
    int stopping;
    double exit_deadline; /* set by runner_stop */
    long long queue_dropped; /* samples dropped from the front of a full queue */
    struct runner_figures published; /* the thread's figures as of its last settled batch */

    pthread_t thread;
    int started;
};

/* How a runner's sink waits: an HTTP request's time-out (each node's), and how long a node of an
 * Elasticsearch list that failed rests (--sink-timeout, --node-backoff). */
struct sink_waits {
    double timeout_s, node_backoff_s;
};

/* Parse url, open the sink (an HTTP store's with its credentials from creds, which must outlive
 * the runner; may be NULL) and, when spool_dir is given and the sink is reliable, its spool
 * (spool_dir/URL-with-only-alphanumerics, which gets a sink-url file). The in-memory queue is
 * bounded by max_bytes too. waits may be NULL (SINK_TIMEOUT_S, SINK_NODE_BACKOFF_S). -1 with a
 * message in err on failure. */
int runner_open(struct sink_runner *r, const char *url, const struct fs_credentials *creds, const char *spool_dir,
                long long max_bytes, double drain_timeout, const struct sink_waits *waits, char *err, size_t errlen);
int runner_start(struct sink_runner *r);
/* Sampling thread: a batch of about `expected` samples begins; runner_add encodes each into it as
 * it is taken; runner_submit_built queues it (never waits on the sink). */
void runner_begin(struct sink_runner *r, size_t expected);
void runner_add(struct sink_runner *r, const struct fs_sample *s);
void runner_submit_built(struct sink_runner *r);
/* The three at once: n samples encoded and queued. */
void runner_submit(struct sink_runner *r, const struct fs_sample *samples, size_t n);
/* No more batches: the thread sends what is queued (for up to drain_timeout, at least 5 s; what
 * is left then is spooled unsent), then gives a sink that is down drain_timeout to take what is
 * spooled (what it does not take stays spooled), and ends. */
void runner_stop(struct sink_runner *r);
void runner_join(struct sink_runner *r);
/* Samples lost for good (not delivered, not refused, not spooled); after runner_join. */
long long runner_lost(const struct sink_runner *r);
/* Any thread, any time: the figures the sink thread published last (it does after each batch it
 * settled, before it waits for the next), its queue's losses included. */
void runner_figures(struct sink_runner *r, struct runner_figures *out);
void runner_close(struct sink_runner *r);

#endif
