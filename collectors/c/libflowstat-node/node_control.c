/* The control thread: answers check-state, get-metrics, start, stop and clock (docs/control-protocol.md)
 * on the node's ROUTER socket, keeping per client (ZeroMQ identity) the baselines of its rates,
 * overload flags and input latency. It reads the node's atomics and never waits on the node; it
 * never waits on a client either: replies that cannot go at once are dropped. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "node_internal.h"
#include "node_json.h"
#include "node_request.h"

#define MAX_CLIENTS 256 /* clients remembered, the least recently asking forgotten first */
#define POLL_MS 50 /* how soon fs_node_close is heard when there is no eventfd to wake the thread ... */
#define WAKE_POLL_MS 1000 /* ... and when there is one, in case writing to it failed */
#define REQUESTS_PER_TURN 64

struct client {
    unsigned char identity[256];
    size_t identity_len;
    uint64_t last_used; /* 0: a free slot */
    double wall, cpu; /* at its previous get-metrics */
    uint64_t merged, send_events, receive_events;
    uint64_t phase_ns[FSN_PHASES]; /* the phases' totals then */
    uint64_t *latency_then; /* the latency counts then (NULL: none kept) */
    double latency_max; /* the longest wait since then */
};

struct fsn_control {
    struct client clients[MAX_CLIENTS];
    uint64_t uses;
    uint64_t errors; /* control_errors */
    double latency_max; /* the longest wait since the node started */
    uint64_t phase_ns[FSN_PHASES]; /* the phases' totals last reported: none ever goes back */
    uint64_t counts[FSN_LATENCY_BUCKETS], interval[FSN_LATENCY_BUCKETS];
    /* How the node's end is told: fs_node_close reads these from the node's thread. */
    pthread_mutex_t end_lock;
    pthread_cond_t end_told; /* on CLOCK_MONOTONIC */
    double asked_at[2]; /* the last two get-metrics (CLOCK_MONOTONIC, s) */
    int asks, told_stopped;
};

/* What a get-metrics client's interval says. */
struct interval {
    double phase_s[FSN_PHASES]; /* since the node started */
    double phase_ratio[FSN_PHASES]; /* of the interval's time (NaN: none) */
    double cpu_hz, merged_per_second;
    int send_overloaded, receive_overloaded;
    struct fsn_latency_figures latency;
};

#define LOAD(v) atomic_load_explicit(&(v), memory_order_relaxed)

/* -- clients ----------------------------------------------------------------------------------- */

/* The client of this identity, or a slot for it (a free one, else the least recently used, forgotten). */
static struct client *find_client(struct fsn_control *c, const zmq_msg_t *identity, int *is_new)
{
    size_t len = zmq_msg_size((zmq_msg_t *)identity);
    const void *data = zmq_msg_data((zmq_msg_t *)identity);
    struct client *oldest = &c->clients[0];
    for (size_t i = 0; i < MAX_CLIENTS; i++) {
        struct client *k = &c->clients[i];
        if (k->last_used && k->identity_len == len && memcmp(k->identity, data, len) == 0) {
            *is_new = 0;
            return k;
        }
        if (k->last_used < oldest->last_used)
            oldest = k;
    }
    uint64_t *keep = oldest->latency_then;
    memset(oldest, 0, sizeof *oldest);
    oldest->latency_then = keep;
    oldest->identity_len = len < sizeof oldest->identity ? len : sizeof oldest->identity;
    memcpy(oldest->identity, data, oldest->identity_len);
    *is_new = 1;
    return oldest;
}

/* The longest wait since each client's previous request: what was recorded since any client last asked
 * goes to every client's maximum. */
static void spread_latency_max(fs_node *n, struct fsn_control *c)
{
    double recent = 0;
    for (int i = 0; i < FSN_SHARDS; i++) {
        double shard_max = fsn_latency_take_max(&n->shards[i].latency);
        if (shard_max > recent)
            recent = shard_max;
    }
    if (recent > c->latency_max)
        c->latency_max = recent;
    for (size_t i = 0; i < MAX_CLIENTS; i++)
        if (c->clients[i].last_used && recent > c->clients[i].latency_max)
            c->clients[i].latency_max = recent;
}

static void latency_interval(fs_node *n, struct fsn_control *c, struct client *k, int is_new, struct interval *out)
{
    spread_latency_max(n, c);
    memset(c->counts, 0, sizeof c->counts);
    for (int i = 0; i < FSN_SHARDS; i++)
        fsn_latency_add_counts(&n->shards[i].latency, c->counts);
    const uint64_t *then = is_new ? NULL : k->latency_then;
    for (int i = 0; i < FSN_LATENCY_BUCKETS; i++)
        c->interval[i] = c->counts[i] - (then ? then[i] : 0);
    fsn_latency_figures(c->interval, is_new ? c->latency_max : k->latency_max, &out->latency);
    if (!k->latency_then)
        k->latency_then = malloc(sizeof c->counts); /* no memory: the next interval counts from the start */
    if (k->latency_then)
        memcpy(k->latency_then, c->counts, sizeof c->counts);
    k->latency_max = 0;
}

/* The node's time in each phase to now (a reading that missed a slice just ended may be below the
 * last reported: the last reported then stands), and each one's share of the time since k's previous
 * request (its first: since the node started). */
static void time_interval(fs_node *n, struct fsn_control *c, struct client *k, uint64_t now_ns, struct interval *out)
{
    uint64_t now[FSN_PHASES], interval = 0;
    fsn_phase_totals(n, now_ns, now);
    for (int p = 0; p < FSN_PHASES; p++) {
        if (now[p] < c->phase_ns[p])
            now[p] = c->phase_ns[p];
        c->phase_ns[p] = now[p];
        interval += now[p] - k->phase_ns[p];
    }
    for (int p = 0; p < FSN_PHASES; p++) {
        out->phase_s[p] = (double)now[p] / 1e9;
        out->phase_ratio[p] = interval ? (double)(now[p] - k->phase_ns[p]) / (double)interval : NAN;
        k->phase_ns[p] = now[p];
    }
}

/* This client's interval since its previous get-metrics (its first: since the node started); its
 * baselines move to now. */
static void client_interval(fs_node *n, struct fsn_control *c, const zmq_msg_t *identity, struct interval *out)
{
    int is_new;
    struct client *k = find_client(c, identity, &is_new);
    uint64_t wall_ns = fsn_monotonic_ns();
    double wall = (double)wall_ns / 1e9, cpu = fsn_clock(CLOCK_PROCESS_CPUTIME_ID);
    time_interval(n, c, k, wall_ns, out);
    uint64_t merged = LOAD(n->objects_merged), send = LOAD(n->send_overload_events);
    uint64_t receive = LOAD(n->receive_overload_events);
    double wall0 = is_new ? n->started_wall : k->wall, cpu0 = is_new ? n->started_cpu : k->cpu;
    double elapsed = wall - wall0;
    out->cpu_hz = elapsed > 0 ? (cpu - cpu0) * 1e6 / elapsed : 0.0;
    out->merged_per_second = elapsed > 0 ? (double)(merged - k->merged) / elapsed : 0.0;
    out->send_overloaded = send != k->send_events;
    out->receive_overloaded = receive != k->receive_events;
    latency_interval(n, c, k, is_new, out);
    k->wall = wall;
    k->cpu = cpu;
    k->merged = merged;
    k->send_events = send;
    k->receive_events = receive;
    k->last_used = ++c->uses;
}

/* -- replies ----------------------------------------------------------------------------------- */

/* VmRSS in kB from /proc/self/status; -1 when it cannot be read. */
static long long vmrss_kb(void)
{
    char buf[8192];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    for (;;) {
        ssize_t got = read(fd, buf + len, sizeof buf - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    const char *line = strstr(buf, "\nVmRSS:");
    long long kb;
    return line && sscanf(line + 7, "%lld", &kb) == 1 ? kb : -1;
}

static double average_merge_ms(fs_node *n, uint64_t merges)
{
    uint64_t kept = merges < FSN_MERGE_WINDOW ? merges : FSN_MERGE_WINDOW;
    double sum = 0;
    for (uint64_t i = 0; i < kept; i++) {
        uint64_t bits = LOAD(n->merge_ms_bits[i]);
        double ms;
        memcpy(&ms, &bits, sizeof ms);
        sum += ms;
    }
    return sum / (double)kept;
}

static void size_or_null(struct fsn_json *j, const char *key, long size)
{
    if (size < 0)
        fsn_json_raw(j, key, "null");
    else
        fsn_json_int(j, key, size);
}

static void state_fields(fs_node *n, struct fsn_json *j, const struct interval *since)
{
    fsn_json_str(j, "node_id", n->node_id);
    fsn_json_str(j, "node_state", fsn_state_name(LOAD(n->state)));
    fsn_json_int(j, "PID", (long long)n->pid);
    size_or_null(j, "receive_buffer_size", n->receive_buffer_size);
    fsn_json_bool(j, "receive_buffer_overloaded", LOAD(n->receive_overloaded) || (since && since->receive_overloaded));
    size_or_null(j, "send_buffer_size", n->send_buffer_size);
    fsn_json_bool(j, "send_buffer_overloaded", LOAD(n->send_overloaded) || (since && since->send_overloaded));
}

/* "received_from": {"a": 12, ...}, the objects of each source fs_node_source named (none: left out). */
static void received_from(fs_node *n, struct fsn_json *j)
{
    int count = atomic_load_explicit(&n->nsources, memory_order_acquire);
    if (count == 0)
        return;
    struct fsn_json by_source = {0};
    fsn_json_open(&by_source);
    for (int i = 0; i < count; i++)
        fsn_json_uint(&by_source, n->source_id[i], LOAD(n->source_objects[i]));
    fsn_json_close(&by_source);
    if (by_source.buf.failed)
        j->buf.failed = 1;
    else
        fsn_json_raw(j, "received_from", by_source.buf.data);
    fsn_buf_free(&by_source.buf);
}

static void counters(fs_node *n, struct fsn_control *c, struct fsn_json *j)
{
    fsn_json_str(j, "role", n->role);
    fsn_json_str(j, "run_id", n->run_id);
    fsn_json_num(j, "uptime_s", fsn_clock(CLOCK_MONOTONIC) - n->started_wall, 3);
    fsn_json_uint(j, "control_errors", c->errors);
    fsn_json_uint(j, "objects_sent", FSN_TOTAL(n, objects_sent));
    fsn_json_uint(j, "bytes_sent", FSN_TOTAL(n, bytes_sent));
    fsn_json_uint(j, "objects_received", FSN_TOTAL(n, objects_received));
    fsn_json_uint(j, "bytes_received", FSN_TOTAL(n, bytes_received));
    fsn_json_uint(j, "objects_merged", LOAD(n->objects_merged));
    fsn_json_uint(j, "merges", LOAD(n->merges));
    fsn_json_uint(j, "send_overload_events", LOAD(n->send_overload_events));
    fsn_json_uint(j, "receive_overload_events", LOAD(n->receive_overload_events));
    received_from(n, j);
}

static void metric_fields(fs_node *n, struct fsn_control *c, struct fsn_json *j, const struct interval *since)
{
    uint64_t merges = atomic_load_explicit(&n->merges, memory_order_acquire);
    long long rss = vmrss_kb();
    fsn_json_num(j, "average_merge_time", merges ? average_merge_ms(n, merges) : NAN, 6);
    if (rss < 0)
        fsn_json_raw(j, "VmRSS", "null");
    else
        fsn_json_int(j, "VmRSS", rss);
    fsn_json_num(j, "cpu_clock", since->cpu_hz, 1);
    fsn_json_num(j, "merged_objects_per_second", merges ? since->merged_per_second : NAN, 3);
    counters(n, c, j);
    fsn_json_num(j, "input_latency_p50_ms", since->latency.p50_ms, 3);
    fsn_json_num(j, "input_latency_p99_ms", since->latency.p99_ms, 3);
    fsn_json_num(j, "input_latency_max_ms", since->latency.max_ms, 3);
    fsn_json_uint(j, "input_latency_objects", since->latency.objects);
    static const char *const phases[FSN_PHASES] = {"busy", "backpressured", "idle"};
    char key[32];
    for (int p = 0; p < FSN_PHASES; p++) {
        snprintf(key, sizeof key, "%s_seconds", phases[p]);
        fsn_json_num(j, key, since->phase_s[p], 6);
    }
    for (int p = 0; p < FSN_PHASES; p++) {
        snprintf(key, sizeof key, "%s_ratio", phases[p]);
        fsn_json_num(j, key, since->phase_ratio[p], 4);
    }
}

static void note_asked(struct fsn_control *c, int stopped)
{
    pthread_mutex_lock(&c->end_lock);
    c->asked_at[0] = c->asked_at[1];
    c->asked_at[1] = fsn_clock(CLOCK_MONOTONIC);
    c->asks++;
    if (stopped) {
        c->told_stopped = 1;
        pthread_cond_broadcast(&c->end_told);
    }
    pthread_mutex_unlock(&c->end_lock);
}

/* The command's effect, and its reply's fields; received_s: the wall clock when the request came. */
static void answer(fs_node *n, struct fsn_control *c, const zmq_msg_t *identity, const struct fsn_request *r,
                   struct fsn_json *j, double received_s)
{
    struct interval since;
    switch (r->command) {
    case FSN_CLOCK: /* one round of an NTP-style offset measurement (flowstat run's clocks) */
        fsn_json_str(j, "node_id", n->node_id);
        fsn_json_num(j, "received_s", received_s, 6);
        fsn_json_num(j, "sent_s", fsn_clock(CLOCK_REALTIME), 6);
        return;
    case FSN_GET_METRICS: {
        int stopped = LOAD(n->state) == FS_NODE_STOPPED; /* read before the reply: it says at least this */
        client_interval(n, c, identity, &since);
        state_fields(n, j, &since);
        metric_fields(n, c, j, &since);
        note_asked(c, stopped);
        return;
    }
    case FSN_START: {
        int ready = FS_NODE_READY;
        atomic_store_explicit(&n->start_requested, 1, memory_order_relaxed);
        atomic_compare_exchange_strong(&n->state, &ready, FS_NODE_RUNNING);
        break;
    }
    case FSN_STOP:
        atomic_store_explicit(&n->stop_requested, 1, memory_order_relaxed);
        break;
    default:
        break;
    }
    state_fields(n, j, NULL);
}

static void refusal(fs_node *n, struct fsn_control *c, const struct fsn_request *r, struct fsn_json *j)
{
    c->errors++;
    fsn_json_key(j, "command");
    if (r->command_text)
        fsn_json_string(&j->buf, r->command_text, r->command_len);
    else
        fsn_buf_puts(&j->buf, "null");
    fsn_json_str(j, "node_id", n->node_id);
    fsn_json_str(j, "error", r->error ? r->error : "request not read: out of memory");
}

/* The reply to one request, into j. */
static void reply_to(fs_node *n, struct fsn_control *c, const zmq_msg_t *identity, const zmq_msg_t *payload,
                     struct fsn_json *j)
{
    char received[40], responded[40];
    struct fsn_request r;
    double received_s = fsn_clock(CLOCK_REALTIME);
    fsn_iso_now(received, sizeof received);
    int parsed = fsn_request_parse(zmq_msg_data((zmq_msg_t *)payload), zmq_msg_size((zmq_msg_t *)payload), &r);
    fsn_json_open(j);
    if (parsed == 0 && !r.error) {
        fsn_json_str(j, "command", r.command_text);
        answer(n, c, identity, &r, j, received_s);
    } else {
        refusal(n, c, &r, j);
    }
    if (r.id_json)
        fsn_json_raw(j, "id", r.id_json);
    fsn_json_str(j, "request_timestamp", received);
    fsn_iso_now(responded, sizeof responded);
    fsn_json_str(j, "response_timestamp", responded);
    fsn_json_close(j);
    fsn_request_free(&r);
}

/* -- the socket -------------------------------------------------------------------------------- */

void fsn_message_close(struct fsn_message *m)
{
    for (int i = 0; i < m->count; i++)
        zmq_msg_close(&m->frames[i]);
    m->count = 0;
}

int fsn_message_receive(void *sock, struct fsn_message *m)
{
    m->count = m->too_long = 0;
    for (;;) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, sock, m->count || m->too_long ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            fsn_message_close(m);
            return -1;
        }
        int more = zmq_msg_more(&part);
        if (m->count < FSN_MAX_FRAMES) {
            zmq_msg_init(&m->frames[m->count]);
            zmq_msg_move(&m->frames[m->count++], &part);
        } else {
            m->too_long = 1;
        }
        zmq_msg_close(&part);
        if (!more)
            return 0;
    }
}

/* The envelope back, then the reply; dropped when it cannot go at once (the client is gone, or not
 * reading: a ROUTER socket drops what exceeds its high-water mark rather than block). */
static void send_reply(void *router, struct fsn_message *m, const struct fsn_buf *reply)
{
    for (int i = 0; i < m->count - 1; i++)
        if (zmq_msg_send(&m->frames[i], router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
            return;
    zmq_send(router, reply->data, reply->len, ZMQ_DONTWAIT);
}

static void serve_one(fs_node *n, struct fsn_message *m)
{
    if (m->too_long || m->count < 2) { /* no identity and payload: not a request a client could read */
        n->control->errors++;
        return;
    }
    struct fsn_json reply;
    reply_to(n, n->control, &m->frames[0], &m->frames[m->count - 1], &reply);
    if (!reply.buf.failed)
        send_reply(n->router, m, &reply.buf);
    fsn_buf_free(&reply.buf);
}

/* What the thread waits on: requests, then the guard's ZAP requests and handshake failures (a
 * secured node), then fs_node_close's wake-up. */
static int poll_items(fs_node *n, zmq_pollitem_t *items)
{
    int k = 0;
    items[k++] = (zmq_pollitem_t){.socket = n->router, .events = ZMQ_POLLIN};
    if (n->guard) {
        items[k++] = (zmq_pollitem_t){.socket = n->guard->zap, .events = ZMQ_POLLIN};
        items[k++] = (zmq_pollitem_t){.socket = n->guard->monitor, .events = ZMQ_POLLIN};
    }
    if (n->wake_fd >= 0)
        items[k++] = (zmq_pollitem_t){.fd = n->wake_fd, .events = ZMQ_POLLIN};
    return k;
}

static void *control_thread(void *arg)
{
    fs_node *n = arg;
    struct fsn_message m;
    zmq_pollitem_t items[4];
    int count = poll_items(n, items);
    while (!atomic_load_explicit(&n->quit, memory_order_acquire)) {
        if (zmq_poll(items, count, n->wake_fd >= 0 ? WAKE_POLL_MS : POLL_MS) < 0) {
            if (errno == ETERM)
                break;
            continue; /* EINTR */
        }
        if (n->guard)
            fsn_guard_serve(n); /* a client's handshake waits for it: before the requests */
        for (int k = 0; k < REQUESTS_PER_TURN && fsn_message_receive(n->router, &m) == 0; k++) {
            serve_one(n, &m);
            fsn_message_close(&m);
        }
    }
    return NULL;
}

int fsn_control_start(fs_node *n)
{
    n->control = calloc(1, sizeof *n->control);
    if (!n->control) {
        fprintf(stderr, "flowstat-node %s: no memory for the control thread; running unmonitored\n", n->node_id);
        return -1;
    }
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_mutex_init(&n->control->end_lock, NULL);
    pthread_cond_init(&n->control->end_told, &monotonic);
    pthread_condattr_destroy(&monotonic);
    n->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    /* The node's signals are for its own threads: this one blocks them all. */
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &before);
    int rc = pthread_create(&n->thread, NULL, control_thread, n);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (rc != 0) {
        fprintf(stderr, "flowstat-node %s: cannot start the control thread: %s; running unmonitored\n", n->node_id,
                strerror(rc));
        pthread_cond_destroy(&n->control->end_told);
        pthread_mutex_destroy(&n->control->end_lock);
        free(n->control);
        n->control = NULL;
        if (n->wake_fd >= 0)
            close(n->wake_fd);
        n->wake_fd = -1;
        return -1;
    }
    n->thread_running = 1;
    return 0;
}

void fsn_control_stop(fs_node *n)
{
    if (n->thread_running) {
        atomic_store_explicit(&n->quit, 1, memory_order_release);
        uint64_t one = 1;
        if (n->wake_fd >= 0 && write(n->wake_fd, &one, sizeof one) != (ssize_t)sizeof one)
            fprintf(stderr, "flowstat-node %s: cannot wake the control thread: %s; it stops within %d ms\n", n->node_id,
                    strerror(errno), WAKE_POLL_MS);
        pthread_join(n->thread, NULL);
        n->thread_running = 0;
    }
    if (n->wake_fd >= 0)
        close(n->wake_fd);
    n->wake_fd = -1;
    if (n->control) {
        for (size_t i = 0; i < MAX_CLIENTS; i++)
            free(n->control->clients[i].latency_then);
        pthread_cond_destroy(&n->control->end_told);
        pthread_mutex_destroy(&n->control->end_lock);
        free(n->control);
        n->control = NULL;
    }
}

void fsn_control_wait_to_tell_the_end(fs_node *n)
{
    struct fsn_control *c = n->control;
    if (!n->thread_running || !c)
        return;
    pthread_mutex_lock(&c->end_lock);
    if (c->asks >= 2) { /* asked at an interval: an agent will ask again within it */
        double period = c->asked_at[1] - c->asked_at[0];
        double deadline =
            c->asked_at[1] + period + (period > FSN_FINAL_REPORT_SLACK_S ? period : FSN_FINAL_REPORT_SLACK_S);
        double latest = fsn_clock(CLOCK_MONOTONIC) + FSN_FINAL_REPORT_MAX_S;
        if (deadline > latest)
            deadline = latest;
        struct timespec until = {.tv_sec = (time_t)deadline,
                                 .tv_nsec = (long)((deadline - (double)(time_t)deadline) * 1e9)};
        while (!c->told_stopped && pthread_cond_timedwait(&c->end_told, &c->end_lock, &until) == 0)
            ;
    }
    pthread_mutex_unlock(&c->end_lock);
}
