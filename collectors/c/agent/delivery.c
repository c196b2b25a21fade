#include "delivery.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RETRY_S 1.0
#define EXIT_SEND_MIN_S 5.0 /* at exit, what is queued gets at least one HTTP time-out to go out */
#define SPOOL_NAME_CHARS 64 /* bytes of the URL in its spool folder's name, then "-" and a hash of it all */
#define SPOOL_NAME_MAX (SPOOL_NAME_CHARS + 9)
/* Room kept for the next batch read from the spool, and for the next one encoded: a round's batch
 * at thousands of processes (about 600 bytes a sample), reused rather than mapped and faulted in
 * again each time; a larger one (a backlog sent together) is freed after use. */
#define TAKEN_KEPT_MAX (8u << 20)

struct batch {
    struct batch *next;
    char *data;
    size_t len;
    int count;
};

static void free_batch(struct batch *b)
{
    free(b->data);
    free(b);
}

static struct timespec monotonic_timespec(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* -- the queue: the sampling thread puts, the sink thread takes -------------------------------- */

/* Past the bound the oldest batch goes: the sink thread is stuck in a send (a sink that is down has
 * its batches moved to the spool at once), so it cannot spool it now, and memory is not endless.
 * Returns the samples dropped; the caller counts them as lost and says so. Under lock. */
static long long trim_queue(struct sink_runner *r)
{
    long long dropped = 0;
    while (r->queued_bytes > r->queue_max && r->head != r->tail) {
        struct batch *old = r->head;
        r->head = old->next;
        r->queued_bytes -= (long long)old->len;
        dropped += old->count;
        free_batch(old);
    }
    r->queue_dropped += dropped;
    return dropped;
}

/* The batch built so far, handed over (NULL if out of memory); the runner starts an empty one. */
static struct batch *take_built(struct sink_runner *r)
{
    struct fs_buf out = r->building;
    int count = r->building_count;
    memset(&r->building, 0, sizeof r->building);
    r->building_count = 0;
    struct batch *b = out.failed ? NULL : calloc(1, sizeof *b);
    if (!b) {
        fs_buf_free(&out);
        return NULL;
    }
    r->sample_bytes = out.len / (size_t)count;
    b->data = out.data;
    b->len = out.len;
    b->count = count;
    return b;
}

void runner_begin(struct sink_runner *r, size_t expected)
{
    if (r->sink.expo)
        return;
    sink_encoding_reset(&r->encoding);
    fs_buf_reserve(&r->building, expected * (r->sample_bytes + r->sample_bytes / 8));
}

void runner_add(struct sink_runner *r, const struct fs_sample *s)
{
    if (r->sink.expo) { /* prometheus://: kept for the scrapes, under a short lock; nothing to encode */
        /* edge counters are not served (flowstat verdict reads them from the stores): not counted */
        if (s->schema->kind == FS_DOC_EDGE)
            return;
        expo_put(r->sink.expo, s);
        r->building_count++;
        return;
    }
    sink_encode(&r->sink, s, &r->encoding, &r->building);
    r->building_count++;
}

/* Sampling thread: the batch goes to the spool before it is sent (1), so that an agent killed
 * while its sink is slow or hangs leaves it for the next one; or it cannot be written (a full
 * disk: 0), and waits in memory as a sink without a spool's do. Either is said once as it begins. */
static int write_ahead(struct sink_runner *r, const struct fs_buf *built, int count)
{
    if (spool_push(&r->spool, built->data, built->len, count, NULL) == 0) {
        if (r->ahead_failing)
            LOG_WARN("spool %s can be written again: batches go to it before they are sent", r->spool.dir);
        r->ahead_failing = 0;
        return 1;
    }
    if (!r->ahead_failing)
        LOG_ERR("spool %s: cannot write: %s: batches wait in memory until sent, lost if the agent is killed",
                r->spool.dir, strerror(errno));
    r->ahead_failing = 1;
    return 0;
}

void runner_submit(struct sink_runner *r, const struct fs_sample *samples, size_t n)
{
    runner_begin(r, n);
    for (size_t i = 0; i < n; i++)
        runner_add(r, &samples[i]);
    runner_submit_built(r);
}

/* prometheus://: what was kept is delivered (a scrape shows it), and nothing is queued. */
static void kept_for_scrapes(struct sink_runner *r)
{
    pthread_mutex_lock(&r->lock);
    r->delivered += r->building_count;
    r->published.delivered = r->delivered;
    pthread_mutex_unlock(&r->lock);
    r->building_count = 0;
}

void runner_submit_built(struct sink_runner *r)
{
    int n = r->building_count;
    if (n == 0)
        return;
    if (r->sink.expo) {
        kept_for_scrapes(r);
        return;
    }
    if (!r->building.failed && r->has_spool && write_ahead(r, &r->building, n)) {
        r->sample_bytes = r->building.len / (size_t)n;
        r->building.len = 0; /* its room kept for the next round's */
        r->building_count = 0;
        if (r->building.cap > TAKEN_KEPT_MAX)
            fs_buf_free(&r->building);
        pthread_mutex_lock(&r->lock);
        pthread_cond_signal(&r->wake);
        pthread_mutex_unlock(&r->lock);
        return;
    }
    struct batch *b = take_built(r);
    long long dropped = 0;
    pthread_mutex_lock(&r->lock);
    if (b) {
        if (r->tail)
            r->tail->next = b;
        else
            r->head = b;
        r->tail = b;
        r->queued_bytes += (long long)b->len;
        dropped = trim_queue(r);
        pthread_cond_signal(&r->wake);
    } else {
        r->queue_dropped += (long long)n;
    }
    pthread_mutex_unlock(&r->lock);
    if (!b)
        LOG_ERR("sink %s: out of memory encoding %d samples: they are lost", r->sink.url, n);
    if (dropped)
        LOG_ERR("sink %s has not taken a batch for a while and its queue is over %lld bytes: dropped the oldest "
                "queued batch (%lld samples)",
                r->sink.url, r->queue_max, dropped);
}

static int spool_pending(struct sink_runner *r)
{
    return r->has_spool && !spool_empty(&r->spool);
}

/* The sink thread's counters, where the sampling thread may read them (runner_figures). Under lock. */
static void publish(struct sink_runner *r)
{
    struct runner_figures *p = &r->published;
    p->delivered = r->delivered;
    p->refused = r->refused;
    p->lost = r->lost;
    p->send_failures = r->send_failures;
    p->failovers = r->sink.failovers;
    p->spool_dropped = p->spooled_batches = p->spooled_samples = 0;
    if (r->has_spool)
        spool_figures(&r->spool, &p->spooled_batches, &p->spooled_samples, &p->spool_dropped);
    p->down = r->down;
}

void runner_figures(struct sink_runner *r, struct runner_figures *out)
{
    pthread_mutex_lock(&r->lock);
    *out = r->published;
    out->lost += r->queue_dropped;
    pthread_mutex_unlock(&r->lock);
}

/* The batches queued behind b join it while all fit in send_max: batches queued in memory (no
 * spool, or one that cannot be written) catch up a request at a time, as spooled ones do. Out of
 * memory, they simply stay queued. Under lock. */
static void merge_queued(struct sink_runner *r, struct batch *b)
{
    while (b->next && (long long)(b->len + b->next->len) <= r->send_limit) {
        struct batch *n = b->next;
        char *data = realloc(b->data, b->len + n->len);
        if (!data)
            return;
        memcpy(data + b->len, n->data, n->len);
        b->data = data;
        b->len += n->len;
        b->count += n->count;
        b->next = n->next;
        if (r->tail == n)
            r->tail = b;
        free_batch(n);
    }
}

/* The next queued batch; NULL when it is time to resend the spool, or, with *stop set, when the
 * queue is empty and runner_stop was called. *exit_deadline: when runner_stop was called, the time
 * past which queued batches are no longer sent (0 before). What the last batch did is published
 * first. */
static struct batch *next_batch(struct sink_runner *r, int *stop, double *exit_deadline)
{
    pthread_mutex_lock(&r->lock);
    publish(r);
    while (!r->head && !r->stopping) {
        if (!spool_pending(r)) {
            pthread_cond_wait(&r->wake, &r->lock);
            continue;
        }
        if (fs_monotonic() >= r->next_retry)
            break;
        struct timespec until = monotonic_timespec(r->next_retry);
        pthread_cond_timedwait(&r->wake, &r->lock, &until);
        publish(r); /* a batch written ahead while the sink is down waits in the spool: say so */
    }
    struct batch *b = r->head;
    if (b) {
        merge_queued(r, b);
        r->head = b->next;
        if (!r->head)
            r->tail = NULL;
        r->queued_bytes -= (long long)b->len;
    }
    *stop = !b && r->stopping;
    *exit_deadline = r->exit_deadline;
    pthread_mutex_unlock(&r->lock);
    return b;
}

/* -- delivery: the sink thread ----------------------------------------------------------------- */

/* A trouble is logged once as it begins and once as it ends, never at each resend: a sink that
 * is down, or refuses the credentials, for hours says so twice. */
static void trouble_begins(const struct sink_runner *r, const struct sink_outcome *o)
{
    if (o->trouble == TROUBLE_DOWN)
        LOG_ERR("sink %s is down (%s): %s", r->sink.url, o->why,
                r->has_spool ? "spooling" : "samples are lost meanwhile");
    else
        LOG_ERR("%s; %s", o->why,
                r->has_spool ? "spooling, to be sent once it works"
                             : "the samples are lost meanwhile (no --spool-dir)");
}

static void trouble_ends(const struct sink_runner *r)
{
    static const char *const over[] = {[TROUBLE_AUTH] = "the credentials work now",
                                       [TROUBLE_FORBIDDEN] = "it may be written now",
                                       [TROUBLE_TLS] = "its certificate is trusted now"};
    if (r->trouble == TROUBLE_DOWN)
        LOG_WARN("sink %s is back", r->sink.url);
    else
        LOG_WARN("sink %s takes batches again: %s", r->sink.url, over[r->trouble]);
}

/* Documents answered 403 while others are stored (a user that may write the samples' index but
 * not the agents'): the trouble lasts until the sink took the batch they wait in, in the spool,
 * not until the next batch that happens to hold none of them. */
static int trouble_lasts(struct sink_runner *r, const struct sink_outcome *o)
{
    return o->trouble == TROUBLE_NONE && r->trouble == TROUBLE_FORBIDDEN && !r->down && r->forbidden_kept &&
        spool_holds(&r->spool, r->forbidden_batch);
}

/* What the last send said of the sink: down (nothing taken; not asked again before next_retry),
 * or up, with or without a trouble (documents answered 403 are a trouble of a sink that is up). */
static void note_outcome(struct sink_runner *r, const struct sink_outcome *o)
{
    if (o->trouble != r->trouble && !trouble_lasts(r, o)) {
        if (o->trouble != TROUBLE_NONE)
            trouble_begins(r, o);
        else
            trouble_ends(r);
        r->trouble = o->trouble;
    }
    r->down = o->down;
    if (o->down) {
        r->next_retry = fs_monotonic() + RETRY_S;
        r->backlog = 1;
        if (r->has_spool) { /* what comes next is fresh */
            r->fresh_from = spool_next(&r->spool);
            r->fresh_run = 0;
        }
    }
}

/* A batch the sink did not take waits in the spool; with no spool (or a spool that cannot be
 * written) it is lost, and counted. */
static void keep(struct sink_runner *r, const char *data, size_t len, int count)
{
    if (r->has_spool && spool_push(&r->spool, data, len, count, &r->last_kept) == 0)
        return;
    if (r->has_spool)
        LOG_ERR("spool %s: cannot write: %s", r->spool.dir, strerror(errno));
    r->lost += count;
}

/* Documents the store could not take now (429, 5xx) go to the back of the spool, and the sink is
 * given RETRY_S before it is sent anything again, as when it is down. */
static void send_again_later(struct sink_runner *r, const struct sink_outcome *o)
{
    if (o->trouble == TROUBLE_NONE) /* a trouble (403) is logged as it begins and ends */
        LOG_WARN("sink %s: %d documents not taken for now: %s", r->sink.url, o->again_count,
                 r->has_spool ? "spooled, to be sent again" : "lost (no --spool-dir)");
    if (o->again.failed) {
        LOG_ERR("sink %s: out of memory keeping %d documents: they are lost", r->sink.url, o->again_count);
        r->lost += o->again_count;
        return;
    }
    long long lost = r->lost;
    keep(r, o->again.data, o->again.len, o->again_count);
    if (o->trouble == TROUBLE_FORBIDDEN && r->lost == lost) { /* the trouble lasts until the sink took them */
        r->forbidden_batch = r->last_kept;
        r->forbidden_kept = 1;
    }
    r->next_retry = fs_monotonic() + RETRY_S;
}

/* Send one batch; -1 when the sink is down (the caller keeps the batch). Otherwise the batch is
 * settled: what the sink stored, refused for good, or wants again later is counted here. */
static int deliver(struct sink_runner *r, const char *data, size_t len, int count)
{
    struct sink_outcome o;
    sink_send(&r->sink, data, len, count, &o);
    note_outcome(r, &o);
    if (o.down) {
        if (o.timed_out) /* too big to be answered in time, maybe: it would otherwise go again as it is */
            r->send_limit /= 2;
        r->send_failures++;
        fs_buf_free(&o.again);
        return -1;
    }
    r->refused += o.refused;
    r->delivered += count - o.refused - o.again_count;
    if (o.again_count)
        send_again_later(r, &o);
    fs_buf_free(&o.again);
    return 0;
}

/* The exit deadline runner_stop set (INFINITY before): the sampling thread may set it meanwhile. */
static double exit_deadline_now(struct sink_runner *r)
{
    pthread_mutex_lock(&r->lock);
    double deadline = r->exit_deadline;
    pthread_mutex_unlock(&r->lock);
    return deadline > 0 ? deadline : INFINITY;
}

/* Send the spool, the fresh batches first and the backlog after them (delivery.h), each oldest first, until
 * it is empty (0) or `until` passes (-1), or, with watch_exit, the exit deadline; -1 too when the
 * sink must be left alone until next_retry (then every way out sets it: the caller waits for it).
 * A batch leaves the spool once the sink took it: a sink that took it and an agent killed before
 * it could say so get it again (the stores overwrite it). */
static int drain_spool(struct sink_runner *r, double until, int watch_exit)
{
    while (spool_pending(r)) {
        double now = fs_monotonic();
        if (now >= until || (watch_exit && now >= exit_deadline_now(r)))
            return -1;
        int count = 0;
        unsigned long long from = r->fresh_run >= BACKLOG_EVERY ? 0 : r->fresh_from;
        unsigned long long first = 0;
        int taken = spool_take(&r->spool, from, (size_t)r->send_limit, &r->taken, &count, &first) == 0;
        if (!taken && errno == 0)
            return 0;
        const char *data = taken ? (r->taken.data ? r->taken.data : "") : NULL;
        /* A batch that cannot be read gives the other side its turn. */
        int fresh = data ? from && first >= from : from != 0;
        r->fresh_run = fresh ? (data ? r->fresh_run + 1 : BACKLOG_EVERY) : 0;
        if (!data) {
            LOG_ERR("spool %s: cannot read its oldest batch: %s", r->spool.dir, strerror(errno));
            r->next_retry = fs_monotonic() + RETRY_S;
            return -1;
        }
        int rc = deliver(r, data, r->taken.len, count);
        if (r->taken.cap > TAKEN_KEPT_MAX) /* a backlog's request: its room goes back (util.h) */
            fs_buf_free(&r->taken);
        if (rc != 0) {
            spool_release(&r->spool);
            return -1;
        }
        spool_ack(&r->spool);
        if (fs_monotonic() < r->next_retry) /* part of it is to be sent again, after a pause */
            return -1;
    }
    return 0;
}

/* In order: nothing goes past what waits in the spool, and a sink that is down is not sent
 * anything before its retry time. */
static void take_batch(struct sink_runner *r, const struct batch *b, double until)
{
    int hold = (r->down || spool_pending(r)) && fs_monotonic() < r->next_retry;
    if (hold || drain_spool(r, until, 0) != 0 || deliver(r, b->data, b->len, b->count) != 0)
        keep(r, b->data, b->len, b->count);
}

/* A sink that takes each batch just within its time-out must not hold the exit for as many
 * time-outs as there are batches queued: past the exit deadline they stay in the spool unsent. */
static void too_slow(struct sink_runner *r)
{
    if (!r->put_aside++)
        LOG_ERR("sink %s is too slow to take what was queued before the exit: %s", r->sink.url,
                r->has_spool ? "the rest is spooled" : "the rest is lost (no --spool-dir)");
}

static void put_aside(struct sink_runner *r, const struct batch *b)
{
    too_slow(r);
    keep(r, b->data, b->len, b->count);
}

/* At exit, what was written ahead to the spool and not sent yet goes, as queued batches do: a sink
 * that is up gets until the exit deadline for it. */
static void send_written_ahead(struct sink_runner *r, double until)
{
    int held = r->down && fs_monotonic() < r->next_retry;
    if (held || !spool_pending(r))
        return;
    if (drain_spool(r, until, 0) != 0 && spool_pending(r) && fs_monotonic() >= until)
        too_slow(r);
}

static void sleep_until_monotonic(double t)
{
    struct timespec ts = monotonic_timespec(t);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* A sink that is down at exit gets drain_timeout more to come back (a store restarting as a run
 * ends); what it still has not taken then stays in the spool for the next start. */
static void drain_at_exit(struct sink_runner *r)
{
    double deadline = fs_monotonic() + r->drain_timeout;
    for (;;) {
        double now = fs_monotonic();
        if (!spool_pending(r) || now >= deadline)
            return;
        if (now >= r->next_retry)
            drain_spool(r, deadline, 0); /* empties it, or waits for next_retry, or stops at the deadline */
        else
            sleep_until_monotonic(r->next_retry < deadline ? r->next_retry : deadline);
    }
}

/* Nothing waits, in the spool or the queue: what goes together is send_max again (delivery.h), and
 * what a backlog took is given back to the system (util.h: fs_malloc_trim). */
static void note_caught_up(struct sink_runner *r)
{
    pthread_mutex_lock(&r->lock);
    int waiting = r->head != NULL;
    pthread_mutex_unlock(&r->lock);
    if (waiting || r->down || spool_pending(r))
        return;
    r->send_limit = r->send_max;
    if (r->backlog) {
        r->backlog = 0;
        fs_malloc_trim();
    }
}

static void *run_sink(void *arg)
{
    struct sink_runner *r = arg;
    for (;;) {
        int stop = 0;
        double exit_deadline = 0;
        struct batch *b = next_batch(r, &stop, &exit_deadline);
        double until = exit_deadline > 0 ? exit_deadline : INFINITY;
        if (b) {
            if (fs_monotonic() >= until)
                put_aside(r, b);
            else
                take_batch(r, b, until);
            free_batch(b);
        } else if (stop) {
            send_written_ahead(r, until);
            break;
        } else {
            drain_spool(r, until, 1);
        }
        if (r->has_spool && r->down) /* what the sink did not take stays: on disk for good */
            spool_sync(&r->spool);
        note_caught_up(r);
    }
    drain_at_exit(r);
    if (r->has_spool)
        spool_sync(&r->spool);
    return NULL;
}

/* -- life cycle -------------------------------------------------------------------------------- */

/* FNV-1a, 32 bits: the part of a spool folder's name that keeps two sinks apart (as the Python agent). */
static uint32_t url_hash(const char *url)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *u = (const unsigned char *)url; *u; u++)
        h = (h ^ *u) * 16777619u;
    return h;
}

static int open_spool(struct sink_runner *r, const char *spool_dir, long long max_bytes, char *err, size_t errlen)
{
    _Static_assert(SPOOL_DIR_MAX + 1 + SPOOL_NAME_MAX < sizeof r->spool.dir, "room for the sink's folder name");
    char dir[sizeof r->spool.dir];
    if (strlen(spool_dir) > SPOOL_DIR_MAX) {
        snprintf(err, errlen, "--spool-dir: a path longer than the limit of %d characters", SPOOL_DIR_MAX);
        return -1;
    }
    size_t n = (size_t)snprintf(dir, sizeof dir, "%s/", spool_dir);
    for (const char *u = r->sink.url; *u && u - r->sink.url < SPOOL_NAME_CHARS; u++)
        dir[n++] = (char)((*u >= 'a' && *u <= 'z') || (*u >= 'A' && *u <= 'Z') || (*u >= '0' && *u <= '9') ? *u : '_');
    snprintf(dir + n, sizeof dir - n, "-%08x", (unsigned)url_hash(r->sink.url));
    if (spool_open(&r->spool, dir, max_bytes) != 0) {
        snprintf(err, errlen, "spool %s: %s", dir, strerror(errno));
        return -1;
    }
    if (spool_claim(&r->spool, r->sink.url, err, errlen) != 0) {
        spool_close(&r->spool);
        return -1;
    }
    r->has_spool = 1;
    r->fresh_from = r->spool.next; /* what an earlier agent left is a backlog */
    return 0;
}

int runner_open(struct sink_runner *r, const char *url, const struct fs_credentials *creds, const char *spool_dir,
                long long max_bytes, double drain_timeout, const struct sink_waits *waits, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->sink.fd = -1;
    r->queue_max = max_bytes;
    r->send_max = r->send_limit = SPOOL_SEND_MAX_BYTES;
    r->drain_timeout = drain_timeout;
    pthread_condattr_t attr; /* timed waits on the monotonic clock: the wall clock may jump */
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&r->wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&r->lock, NULL);
    err[0] = '\0';
    if (sink_parse_url(url, &r->sink, err, errlen) != 0)
        return -1;
    if (waits) {
        r->sink.timeout_s = waits->timeout_s;
        r->sink.node_backoff_s = waits->node_backoff_s;
    }
    if (sink_open(&r->sink, creds, err, errlen) != 0)
        return -1;
    return spool_dir && sink_is_reliable(&r->sink) ? open_spool(r, spool_dir, max_bytes, err, errlen) : 0;
}

int runner_start(struct sink_runner *r)
{
    if (r->sink.expo) /* its thread serves /metrics: no batch to deliver */
        return expo_start(r->sink.expo);
    if (pthread_create(&r->thread, NULL, run_sink, r) != 0)
        return -1;
    r->started = 1;
    return 0;
}

void runner_stop(struct sink_runner *r)
{
    if (r->sink.expo) {
        expo_stop(r->sink.expo, r->drain_timeout); /* its final samples scraped, within the same bound */
        return;
    }
    double grace = r->drain_timeout > EXIT_SEND_MIN_S ? r->drain_timeout : EXIT_SEND_MIN_S;
    pthread_mutex_lock(&r->lock);
    r->stopping = 1;
    r->exit_deadline = fs_monotonic() + grace;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->lock);
}

void runner_join(struct sink_runner *r)
{
    if (r->sink.expo)
        expo_join(r->sink.expo);
    if (r->started)
        pthread_join(r->thread, NULL);
    r->started = 0;
}

long long runner_lost(const struct sink_runner *r)
{
    return r->lost + r->queue_dropped;
}

void runner_close(struct sink_runner *r)
{
    while (r->head) {
        struct batch *b = r->head;
        r->head = b->next;
        free_batch(b);
    }
    r->tail = NULL;
    fs_buf_free(&r->building);
    fs_buf_free(&r->taken);
    if (r->has_spool)
        spool_close(&r->spool);
    r->has_spool = 0;
    sink_close(&r->sink);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->lock);
}
