/* A bounded on-disk FIFO of encoded batches while a sink is down (same layout as the Python
 * agent's: NNNNNNNNNNNN-COUNT.batch files, oldest dropped and counted past the bound). */
#ifndef FLOWSTAT_SPOOL_H
#define FLOWSTAT_SPOOL_H

#include <stddef.h>

struct spool {
    char dir[512];
    long long max_bytes, bytes;
    unsigned long long first, next; /* batch numbers in the spool: [first, next) */
    long long dropped_samples;
};

int spool_open(struct spool *s, const char *dir, long long max_bytes);
int spool_push(struct spool *s, const char *data, size_t len, int count);
/* The oldest batch (malloc'd, caller frees) and its sample count; NULL when empty. */
char *spool_peek(struct spool *s, size_t *len, int *count);
void spool_pop(struct spool *s);
int spool_empty(const struct spool *s);

#endif
