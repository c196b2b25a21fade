/* A bounded on-disk FIFO of encoded batches for one sink (same layout as the Python agent's:
 * NNNNNNNNNNNN-COUNT.batch files, oldest dropped and counted past the bound), and a file sink-url
 * naming the sink they are for.
 *
 * Every batch of a sink that has a spool is written here before it is sent (write-ahead), by the
 * sampling thread, and removed once the sink took it (spool_ack), by the sink's thread: so what an
 * agent sampled is on disk, not only in its memory, from the moment it is encoded, and an agent
 * killed at any point leaves it for the next one. The two threads share a spool: its index and
 * counters are under its lock; files are written and read outside it. */
#ifndef FLOWSTAT_SPOOL_H
#define FLOWSTAT_SPOOL_H

#include <pthread.h>
#include <stddef.h>

#include "util.h"

struct spool_entry {
    unsigned long long number; /* its place in the order: the file's name */
    long long bytes;
    int count; /* samples */
};

struct spool {
    char dir[512];
    long long max_bytes;

    pthread_mutex_t lock; /* all below */
    long long bytes; /* of the batch files on disk */
    long long samples; /* in the spool now, the batch being sent included until it is settled */
    long long dropped_samples; /* dropped past the bound */
    unsigned long long next; /* the number of the next batch */
    unsigned long long synced; /* batches below this number were flushed to disk (spool_sync) */
    unsigned long long tmp_seq; /* names of files being written */
    struct spool_entry *entries; /* oldest first: entries[off .. off + len) */
    size_t off, len, cap;
    /* The batches the sink thread is sending (spool_take), numbered taken_first to taken_last
     * (the oldest, or the freshest: spool_take): the bound may drop their files meanwhile
     * (taken_gone of them, taken_gone_samples); they are settled, as delivered or as dropped, by
     * spool_ack or spool_release. */
    int taken;
    unsigned long long taken_first, taken_last;
    long long taken_samples;
    long long taken_gone, taken_gone_samples;
};

/* Spooled batches go to the sink together, up to this many bytes a request (one batch larger than
 * this goes alone): a sink slower than one request a sampling tick would otherwise never catch up
 * (the Python agent's SEND_MAX_BYTES). At most SPOOL_TAKE_MAX batches a request. */
#define SPOOL_SEND_MAX_BYTES (1 << 20)
#define SPOOL_TAKE_MAX 256 /* read under the spool's lock: the sampling thread's push waits meanwhile */

/* The file in a spool folder that names its sink (the URL and a newline), so that another program
 * (flowstat agent --flush-spool DIR) can resend a spool whose agent is gone. */
#define SPOOL_URL_FILE "sink-url"

/* Open (creating it) the spool folder dir and find what an earlier agent left there, in order. */
int spool_open(struct spool *s, const char *dir, long long max_bytes);
void spool_close(struct spool *s);
/* Write SPOOL_URL_FILE if absent; -1 with a message in err if it cannot, or if it names another URL. */
int spool_claim(struct spool *s, const char *url, char *err, size_t errlen);
/* Append a batch (any thread), its number in *number (may be NULL); past the bound the oldest
 * batches are dropped and counted, never the one just written. -1 with errno when it cannot be
 * written (a full disk): nothing is left of it. */
int spool_push(struct spool *s, const char *data, size_t len, int count, unsigned long long *number);
/* The sink thread: the oldest batch numbered fresh_from or above when there is one and older ones
 * wait too (live batches go before a backlog: what was sampled after a sink came back is queryable
 * at once, not after the outage's backlog), else the oldest; and those after it while all fit in
 * max_bytes (a sink's batches are lines, and run together), read into out (emptied first: the
 * caller's, kept from one take to the next so that its room is not mapped again each time), their
 * sample count; they are taken until spool_ack or spool_release. 0; -1 with errno 0 when empty, or
 * with errno when it cannot be read. fresh_from 0: oldest first, always. *first: the number of the
 * first batch taken (whether it was a fresh one). */
int spool_take(struct spool *s, unsigned long long fresh_from, size_t max_bytes, struct fs_buf *out, int *count,
               unsigned long long *first);
/* The taken batches went to the sink: their files are removed. */
void spool_ack(struct spool *s);
/* The taken batches did not go: they keep their place in the order (those the bound dropped
 * meanwhile are counted). */
void spool_release(struct spool *s);
/* The number the next batch pushed will have. */
unsigned long long spool_next(struct spool *s);
/* Flush to disk the batches written since the last call, and the folder (they are written without
 * it: an agent killed loses nothing in the kernel's cache; a machine that stops may). */
void spool_sync(struct spool *s);
int spool_empty(struct spool *s);
/* Whether batch `number` is still in the spool (the sink has not taken it). */
int spool_holds(struct spool *s, unsigned long long number);
/* Batches and samples in the spool now, and samples dropped past the bound so far. */
void spool_figures(struct spool *s, long long *batches, long long *samples, long long *dropped);

#endif
