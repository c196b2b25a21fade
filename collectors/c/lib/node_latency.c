#include "node_latency.h"

#include <math.h>
#include <string.h>

#define LOW_S 1e-6
#define GROWTH 1.02

int fsn_latency_bucket(double wait_s)
{
    double safe = wait_s > LOW_S ? wait_s : LOW_S;
    double bucket = ceil(log(safe / LOW_S) / log(GROWTH));
    return bucket < FSN_LATENCY_BUCKETS - 1 ? (int)bucket : FSN_LATENCY_BUCKETS - 1;
}

static uint64_t bits_of(double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

static double double_of(uint64_t bits)
{
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

void fsn_latency_record(struct fsn_latency *l, double wait_s)
{
    atomic_fetch_add_explicit(&l->counts[fsn_latency_bucket(wait_s)], 1, memory_order_relaxed);
    if (wait_s < 0)
        atomic_fetch_add_explicit(&l->clock_skewed, 1, memory_order_relaxed);
    if (!(wait_s > 0))
        return;
    /* Positive doubles order as their bits do: a maximum without a lock. */
    uint64_t bits = bits_of(wait_s), seen = atomic_load_explicit(&l->max_bits, memory_order_relaxed);
    while (
        bits > seen &&
        !atomic_compare_exchange_weak_explicit(&l->max_bits, &seen, bits, memory_order_relaxed, memory_order_relaxed))
        ;
}

double fsn_latency_take_max(struct fsn_latency *l)
{
    return double_of(atomic_exchange_explicit(&l->max_bits, 0, memory_order_relaxed));
}

void fsn_latency_copy(struct fsn_latency *l, uint64_t *counts)
{
    for (int i = 0; i < FSN_LATENCY_BUCKETS; i++)
        counts[i] = atomic_load_explicit(&l->counts[i], memory_order_relaxed);
}

static double bucket_middle_ms(int bucket)
{
    return bucket == 0 ? LOW_S * 1e3 : LOW_S * 1e3 * pow(GROWTH, bucket - 0.5);
}

/* The first bucket where the running count reaches q * n (numpy's searchsorted, side left). */
static int quantile_bucket(const uint64_t *counts, uint64_t n, double q)
{
    uint64_t cumulative = 0;
    for (int i = 0; i < FSN_LATENCY_BUCKETS; i++) {
        cumulative += counts[i];
        if ((double)cumulative >= q * (double)n)
            return i;
    }
    return FSN_LATENCY_BUCKETS - 1;
}

void fsn_latency_figures(const uint64_t *counts, double max_s, struct fsn_latency_figures *out)
{
    out->objects = 0;
    for (int i = 0; i < FSN_LATENCY_BUCKETS; i++)
        out->objects += counts[i];
    if (out->objects == 0) {
        out->p50_ms = out->p99_ms = out->max_ms = NAN;
        return;
    }
    double top = max_s * 1e3;
    out->p50_ms = fmin(bucket_middle_ms(quantile_bucket(counts, out->objects, 0.5)), top);
    out->p99_ms = fmin(bucket_middle_ms(quantile_bucket(counts, out->objects, 0.99)), top);
    out->max_ms = top;
}
