/* Input latency (flowstat.harness.latency): how long objects waited between being sent and being
 * taken, in log buckets 2% wide, counted by relaxed atomics from any thread; the figures of an
 * interval are computed by the control thread from copies of the counts. */
#ifndef FLOWSTAT_NODE_LATENCY_H
#define FLOWSTAT_NODE_LATENCY_H

#include <stdatomic.h>
#include <stdint.h>

/* int(log(1e4 / 1e-6) / log(1.02)) + 2: bucket 0 holds waits <= 1 us, bucket i (1e-6 * 1.02^(i-1),
 * 1e-6 * 1.02^i] s, the last one the rest (checked against the formula by fsn_latency_bucket's caller
 * in the tests: test_node_c.py). */
#define FSN_LATENCY_BUCKETS 1164

struct fsn_latency {
    _Atomic uint64_t counts[FSN_LATENCY_BUCKETS];
    _Atomic uint64_t max_bits; /* the longest wait (s, a double's bits) since the control thread took it */
    _Atomic uint64_t clock_skewed; /* waits below zero: sender and reader clocks out of step */
};

struct fsn_latency_figures {
    uint64_t objects;
    double p50_ms, p99_ms, max_ms; /* NaN when there are no objects */
};

int fsn_latency_bucket(double wait_s);
void fsn_latency_record(struct fsn_latency *l, double wait_s);
/* The longest wait recorded since the previous call (0 if none), and recording starts anew. */
double fsn_latency_take_max(struct fsn_latency *l);
void fsn_latency_copy(struct fsn_latency *l, uint64_t *counts);
/* p50, p99 (bucket middles capped by max_s) and max of counts, as harness/latency.py's _stats. */
void fsn_latency_figures(const uint64_t *counts, double max_s, struct fsn_latency_figures *out);

#endif
