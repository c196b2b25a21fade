#include "node_latency.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#define LOW_S 1e-6
#define GROWTH 1.02

/* upper[i]: the longest wait of bucket i (for i below the last), so that a wait's bucket is the
 * first whose upper bound it does not exceed: the formula's own results, found once by search. */
static double upper[FSN_LATENCY_BUCKETS - 1];
static pthread_once_t upper_once = PTHREAD_ONCE_INIT;

static int formula_bucket(double wait_s)
{
    double safe = wait_s > LOW_S ? wait_s : LOW_S;
    double bucket = ceil(log(safe / LOW_S) / log(GROWTH));
    return bucket < FSN_LATENCY_BUCKETS - 1 ? (int)bucket : FSN_LATENCY_BUCKETS - 1;
}

static void compute_upper_bounds(void)
{
    for (int i = 0; i < FSN_LATENCY_BUCKETS - 1; i++) {
        double w = LOW_S * pow(GROWTH, i);
        while (formula_bucket(w) > i)
            w = nextafter(w, 0);
        while (formula_bucket(nextafter(w, INFINITY)) <= i)
            w = nextafter(w, INFINITY);
        upper[i] = w;
    }
}

void fsn_latency_init(void)
{
    pthread_once(&upper_once, compute_upper_bounds);
}

static int in_bucket(double wait_s, int b)
{
    return (b == FSN_LATENCY_BUCKETS - 1 || wait_s <= upper[b]) && (b == 0 || wait_s > upper[b - 1]);
}

int fsn_latency_bucket(double wait_s, int *hint)
{
    /* Objects taken together were sent one after the other: the bucket of the last, or next to it. */
    for (int b = *hint - 1; b <= *hint + 1; b++) {
        if (b >= 0 && b < FSN_LATENCY_BUCKETS && in_bucket(wait_s, b)) {
            *hint = b;
            return b;
        }
    }
    int lo = 0, hi = FSN_LATENCY_BUCKETS - 1; /* the first bucket whose bound wait_s does not exceed */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (wait_s <= upper[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    *hint = lo;
    return lo;
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

static void count(_Atomic uint64_t *counter, uint64_t v, int shared)
{
    if (shared)
        atomic_fetch_add_explicit(counter, v, memory_order_relaxed);
    else /* the only writer: no lock needed, the control thread reads whole values */
        atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + v, memory_order_relaxed);
}

static void raise_max(struct fsn_latency *l, double wait_s)
{
    /* Positive doubles order as their bits do: a maximum without a lock (the control thread resets it). */
    uint64_t bits = bits_of(wait_s), seen = atomic_load_explicit(&l->max_bits, memory_order_relaxed);
    while (
        bits > seen &&
        !atomic_compare_exchange_weak_explicit(&l->max_bits, &seen, bits, memory_order_relaxed, memory_order_relaxed))
        ;
}

void fsn_latency_record(struct fsn_latency *l, double taken_s, const double *sent_s, size_t n, int shared)
{
    int hint = atomic_load_explicit(&l->hint, memory_order_relaxed);
    double longest = 0;
    uint64_t skewed = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(sent_s[i]))
            continue;
        double wait_s = taken_s - sent_s[i];
        count(&l->counts[fsn_latency_bucket(wait_s, &hint)], 1, shared);
        skewed += wait_s < 0;
        longest = wait_s > longest ? wait_s : longest;
    }
    atomic_store_explicit(&l->hint, hint, memory_order_relaxed);
    if (skewed)
        count(&l->clock_skewed, skewed, shared);
    if (longest > 0)
        raise_max(l, longest);
}

double fsn_latency_take_max(struct fsn_latency *l)
{
    return double_of(atomic_exchange_explicit(&l->max_bits, 0, memory_order_relaxed));
}

void fsn_latency_add_counts(struct fsn_latency *l, uint64_t *counts)
{
    for (int i = 0; i < FSN_LATENCY_BUCKETS; i++)
        counts[i] += atomic_load_explicit(&l->counts[i], memory_order_relaxed);
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
