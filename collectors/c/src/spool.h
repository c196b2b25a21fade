/* A bounded on-disk FIFO of encoded batches while a sink is down (same layout as the Python
 * agent's: NNNNNNNNNNNN-COUNT.batch files, oldest dropped and counted past the bound), and a file
 * sink-url naming the sink they are for. One thread uses a spool: the one of its sink. */
#ifndef FLOWSTAT_SPOOL_H
#define FLOWSTAT_SPOOL_H

#include <stddef.h>

struct spool {
    char dir[512];
    long long max_bytes, bytes;
    unsigned long long first, next; /* batch numbers in the spool: [first, next) */
    long long samples; /* in the spool now */
    long long dropped_samples; /* dropped past the bound */
};

/* The file in a spool folder that names its sink (the URL and a newline), so that another program
 * (flowstat agent --flush-spool DIR) can resend a spool whose agent is gone. */
#define SPOOL_URL_FILE "sink-url"

int spool_open(struct spool *s, const char *dir, long long max_bytes);
/* Write SPOOL_URL_FILE if absent; -1 with a message in err if it cannot, or if it names another URL. */
int spool_claim(struct spool *s, const char *url, char *err, size_t errlen);
int spool_push(struct spool *s, const char *data, size_t len, int count);
/* The oldest batch (malloc'd, caller frees) and its sample count; NULL when empty. */
char *spool_peek(struct spool *s, size_t *len, int *count);
void spool_pop(struct spool *s);
int spool_empty(const struct spool *s);

#endif
