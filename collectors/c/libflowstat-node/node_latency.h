/* Input latency (flowstat.node.latency): how long objects waited between being sent and being
 * taken, in log buckets 2% wide. Each writing thread counts into a histogram of its own (see
 * node_internal.h); the control thread sums copies of them for the figures of an interval. */
#ifndef FLOWSTAT_NODE_LATENCY_H
#define FLOWSTAT_NODE_LATENCY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* int(log(1e4 / 1e-6) / log(1.02)) + 2: bucket 0 holds waits <= 1 us, bucket i (1e-6 * 1.02^(i-1),
 * 1e-6 * 1.02^i] s, the last one the rest. */
#define FSN_LATENCY_BUCKETS 1164

struct fsn_latency {
    _Atomic uint64_t counts[FSN_LATENCY_BUCKETS];
    _Atomic uint64_t max_bits; /* the longest wait (s, a double's bits) since the control thread took it */
    _Atomic uint64_t clock_skewed; /* waits below zero: sender and reader clocks out of step */
    _Atomic int hint; /* the last bucket counted: waits come in runs */
};

struct fsn_latency_figures {
    uint64_t objects;
    double p50_ms, p99_ms, max_ms; /* NaN when there are no objects */
};

/* The bucket boundaries, computed once per process before any fsn_latency_bucket. */
void fsn_latency_init(void);
/* ceil(log(max(wait, 1e-6) / 1e-6) / log(1.02)), at most the last bucket, as latency.py's _bucket,
 * found among the boundaries (starting at *hint, which it updates). */
int fsn_latency_bucket(double wait_s, int *hint);
/* Count the waits of n objects sent at sent_s (non-finite ones left out), taken at taken_s. shared:
 * other threads count into l too (atomic read-modify-writes), else only the caller does (plain
 * loads and stores, atomic only for the control thread's reads). */
void fsn_latency_record(struct fsn_latency *l, double taken_s, const double *sent_s, size_t n, int shared);
/* The longest wait recorded since the previous call (0 if none), and recording starts anew. */
double fsn_latency_take_max(struct fsn_latency *l);
/* counts += l's counts. */
void fsn_latency_add_counts(struct fsn_latency *l, uint64_t *counts);
/* p50, p99 (bucket middles capped by max_s) and max of counts, as flowstat/node/latency.py s _stats. */
void fsn_latency_figures(const uint64_t *counts, double max_s, struct fsn_latency_figures *out);

#endif
