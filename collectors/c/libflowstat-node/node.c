/* libflowstat-node: opening and closing a node, what the node tells, and its endpoints file. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "node_internal.h"
#include "node_json.h"

#define FS_API __attribute__((visibility("default")))
#define ROLE_PATTERN "^[a-z][a-z0-9_-]{0,31}$"
#define FILE_NAME_ID_MAX 200 /* bytes of node_id in the endpoints file's name (NAME_MAX is 255) */

static const char *const STATE_NAMES[] = {"STARTING", "READY", "RUNNING", "DRAINING", "STOPPED"};

double fsn_clock(clockid_t clock)
{
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

uint64_t fsn_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the vDSO: no system call */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void fsn_iso_now(char *out, size_t n)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(out, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000));
}

const char *fsn_state_name(int state)
{
    return state >= FS_NODE_STARTING && state <= FS_NODE_STOPPED ? STATE_NAMES[state] : "UP";
}

/* -- options --------------------------------------------------------------------------------- */

static int role_allowed(const char *role)
{
    size_t n = strlen(role);
    if (n < 1 || n > 32 || role[0] < 'a' || role[0] > 'z')
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!((role[i] >= 'a' && role[i] <= 'z') || (role[i] >= '0' && role[i] <= '9') || role[i] == '_' ||
              role[i] == '-'))
            return 0;
    return 1;
}

/* Node ids joined by commas: none empty (no leading, trailing or doubled comma). */
static int upstream_allowed(const char *up)
{
    if (!fsn_utf8_valid(up, strlen(up)))
        return 0;
    for (const char *c = up;; c++) {
        if ((*c == ',' || !*c) && (c == up || c[-1] == ','))
            return 0; /* an empty id */
        if (!*c)
            return 1;
    }
}

static int options_valid(const struct fs_node_options *o, char *why, size_t why_len)
{
    if (!o) {
        fsn_say(why, why_len, "no options");
        return 0;
    }
    if (!o->node_id || !o->node_id[0]) {
        fsn_say(why, why_len, "node_id is required");
        return 0;
    }
    if (!fsn_utf8_valid(o->node_id, strlen(o->node_id))) {
        fsn_say(why, why_len, "node_id is not UTF-8");
        return 0;
    }
    if (o->role && !role_allowed(o->role)) {
        fsn_say(why, why_len, "role \"%.64s\" does not match %s", o->role, ROLE_PATTERN);
        return 0;
    }
    if (o->run_id && !fsn_utf8_valid(o->run_id, strlen(o->run_id))) {
        fsn_say(why, why_len, "run_id is not UTF-8");
        return 0;
    }
    if (o->bind && !o->bind[0]) {
        fsn_say(why, why_len, "bind is empty (NULL binds %s)", FSN_DEFAULT_BIND);
        return 0;
    }
    if (o->curve_keys && !o->curve_keys[0]) {
        fsn_say(why, why_len, "curve_keys is empty (NULL: $FLOWSTAT_CURVE_KEYS, else none)");
        return 0;
    }
    if (o->upstream && !upstream_allowed(o->upstream)) {
        fsn_say(why, why_len, "upstream \"%.64s\": node ids joined by commas, none empty, in UTF-8", o->upstream);
        return 0;
    }
    return 1;
}

static char *copy_or_null(const char *s, int *failed)
{
    if (!s)
        return NULL;
    char *copy = strdup(s);
    if (!copy)
        *failed = 1;
    return copy;
}

static void node_free(fs_node *n)
{
    free(n->node_id);
    free(n->role);
    free(n->run_id);
    free(n->bind);
    free(n->upstream);
    free(n->endpoints_file);
    for (int i = 0; i < atomic_load(&n->nsources); i++)
        free(n->source_id[i]);
    pthread_mutex_destroy(&n->sources_lock);
    free(n);
}

static fs_node *node_new(const struct fs_node_options *o)
{
    static atomic_uint_fast64_t serials = 1;
    fs_node *n = aligned_alloc(_Alignof(fs_node), sizeof *n); /* the shards are cache-line aligned */
    if (!n)
        return NULL;
    memset(n, 0, sizeof *n);
    n->serial = atomic_fetch_add(&serials, 1);
    n->shards[FSN_SHARDS - 1].shared = 1;
    n->wake_fd = -1;
    pthread_mutex_init(&n->sources_lock, NULL);
    int failed = 0;
    n->node_id = copy_or_null(o->node_id, &failed);
    n->role = copy_or_null(o->role ? o->role : "other", &failed);
    n->run_id = copy_or_null(o->run_id, &failed);
    n->bind = copy_or_null(o->bind ? o->bind : FSN_DEFAULT_BIND, &failed);
    n->upstream = copy_or_null(o->upstream, &failed);
    if (failed) {
        node_free(n);
        return NULL;
    }
    n->receive_buffer_size = o->receive_buffer_size;
    n->send_buffer_size = o->send_buffer_size;
    n->pid = getpid();
    n->started_ns = fsn_monotonic_ns();
    n->started_wall = (double)n->started_ns / 1e9;
    /* The first thread that counts is busy from now on (it takes the first shard). */
    atomic_init(&n->shards[0].phase, FSN_PHASE_WORD(n->started_ns, FSN_BUSY));
    n->started_cpu = fsn_clock(CLOCK_PROCESS_CPUTIME_ID);
    atomic_init(&n->state, FS_NODE_RUNNING);
    return n;
}

/* -- the control socket ------------------------------------------------------------------------ */

static void close_socket(fs_node *n)
{
    fsn_guard_close(n); /* its sockets are of the context: closed before it is terminated */
    if (n->router)
        zmq_close(n->router);
    if (n->zmq_context)
        zmq_ctx_term(n->zmq_context);
    n->router = n->zmq_context = NULL;
}

static int make_router(fs_node *n)
{
    int zero = 0, hwm = 100;
    int64_t max_request = 1024 * 1024; /* bigger ones cost the sender its connection, not our memory */
    n->zmq_context = zmq_ctx_new();
    n->router = n->zmq_context ? zmq_socket(n->zmq_context, ZMQ_ROUTER) : NULL;
    return n->router && zmq_setsockopt(n->router, ZMQ_LINGER, &zero, sizeof zero) == 0 &&
            zmq_setsockopt(n->router, ZMQ_SNDHWM, &hwm, sizeof hwm) == 0 &&
            zmq_setsockopt(n->router, ZMQ_MAXMSGSIZE, &max_request, sizeof max_request) == 0
        ? 0
        : -1;
}

static int bind_router(fs_node *n)
{
    size_t len = sizeof n->endpoint;
    return zmq_bind(n->router, n->bind) == 0 && zmq_getsockopt(n->router, ZMQ_LAST_ENDPOINT, n->endpoint, &len) == 0
        ? 0
        : -1;
}

static int bind_control(fs_node *n)
{
    int made = make_router(n) == 0, armed = made && (!n->guard || fsn_guard_arm(n) == 0);
    if (armed && bind_router(n) == 0)
        return 0;
    const char *why = zmq_strerror(errno);
    if (armed)
        fprintf(stderr, "flowstat-node %s: cannot bind the control socket to %s: %s; running unmonitored\n", n->node_id,
                n->bind, why);
    else
        fprintf(stderr, "flowstat-node %s: cannot %s the control socket: %s; running unmonitored\n", n->node_id,
                made ? "secure" : "make", why);
    n->endpoint[0] = '\0';
    close_socket(n);
    return -1;
}

/* Keys given: a CURVE server, or, when they cannot be used, no channel at all (never in the clear).
 * No keys: in the clear, said when the address may be reached from another host. */
static int open_control(fs_node *n, const struct fs_node_options *o)
{
    const char *keys = fsn_guard_keys_dir(o);
    if (keys && fsn_guard_load(n, keys) != 0)
        return -1;
    if (!keys && !fsn_is_loopback(n->bind))
        fprintf(stderr,
                "flowstat-node %s: the control channel binds %s without CURVE: anyone who reaches it may ask and "
                "stop (give curve_keys, or $FLOWSTAT_CURVE_KEYS)\n",
                n->node_id, n->bind);
    return bind_control(n);
}

/* -- the endpoints file ------------------------------------------------------------------------ */

static int make_dirs(const char *dir)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* <node_id>.<pid>.json, every byte of node_id outside [A-Za-z0-9._-] made '_'. */
static void file_name(const fs_node *n, char *out, size_t size)
{
    char id[FILE_NAME_ID_MAX + 1];
    size_t len = 0;
    for (const char *c = n->node_id; *c && len < FILE_NAME_ID_MAX; c++, len++) {
        int plain = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '.' ||
            *c == '_' || *c == '-';
        id[len] = plain ? *c : '_';
    }
    id[len] = '\0';
    snprintf(out, size, "%s.%ld.json", id, (long)n->pid);
}

/* "upstream": ["a", "b"] from "a,b". */
static void upstream_array(struct fsn_json *node, const char *up)
{
    struct fsn_buf list = {0};
    fsn_buf_puts(&list, "[");
    for (const char *c = up; *c;) {
        size_t len = strcspn(c, ",");
        if (c != up)
            fsn_buf_puts(&list, ", ");
        fsn_json_string(&list, c, len);
        c += len + (c[len] == ',');
    }
    fsn_buf_puts(&list, "]");
    if (list.failed)
        node->buf.failed = 1;
    else
        fsn_json_raw(node, "upstream", list.data);
    fsn_buf_free(&list);
}

static void endpoints_document(const fs_node *n, struct fsn_buf *doc)
{
    struct fsn_json node;
    fsn_json_open(&node);
    fsn_json_str(&node, "node_id", n->node_id);
    fsn_json_str(&node, "role", n->role);
    fsn_json_int(&node, "pid", (long long)n->pid);
    char host[256];
    if (gethostname(host, sizeof host) == 0) { /* its pid is a process of this host: other hosts' agents leave it */
        host[sizeof host - 1] = '\0';
        fsn_json_str(&node, "host", host);
    }
    fsn_json_str(&node, "control", n->endpoint);
    if (n->curve_server_key[0]) /* the key a client needs: the channel takes CURVE clients only */
        fsn_json_str(&node, "curve_server_key", n->curve_server_key);
    if (n->upstream)
        upstream_array(&node, n->upstream);
    fsn_json_close(&node);
    fsn_buf_puts(doc, "{");
    if (n->run_id) {
        fsn_json_string(doc, "run_id", 6);
        fsn_buf_puts(doc, ": ");
        fsn_json_string(doc, n->run_id, strlen(n->run_id));
        fsn_buf_puts(doc, ", ");
    }
    fsn_buf_puts(doc, "\"nodes\": [");
    fsn_buf_append(doc, node.buf.data ? node.buf.data : "", node.buf.len);
    fsn_buf_puts(doc, "]}\n");
    if (node.buf.failed)
        doc->failed = 1;
    fsn_buf_free(&node.buf);
}

static int write_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Written to .<name>.tmp beside it, then renamed: a reader sees all of it or nothing. */
static int write_atomically(const char *dir, const char *name, const struct fsn_buf *doc, char **written)
{
    char tmp[PATH_MAX], path[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name) >= (int)sizeof tmp ||
        snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    int ok = fchmod(fd, 0644) == 0 && write_all(fd, doc->data, doc->len) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        int saved = errno;
        unlink(tmp);
        errno = saved;
        return -1;
    }
    *written = strdup(path);
    return 0;
}

static void announce(fs_node *n, const char *dir)
{
    char name[FILE_NAME_ID_MAX + 64];
    struct fsn_buf doc = {0};
    file_name(n, name, sizeof name);
    endpoints_document(n, &doc);
    if (doc.failed)
        errno = ENOMEM;
    if (doc.failed || make_dirs(dir) != 0 || write_atomically(dir, name, &doc, &n->endpoints_file) != 0)
        fprintf(stderr, "flowstat-node %s: cannot write the endpoints file %s/%s: %s; not announced\n", n->node_id, dir,
                name, strerror(errno));
    fsn_buf_free(&doc);
}

static const char *endpoints_dir(const struct fs_node_options *o)
{
    const char *dir = o->endpoints_dir ? o->endpoints_dir : getenv("FLOWSTAT_ENDPOINTS_DIR");
    return dir && dir[0] ? dir : NULL;
}

/* -- the API ----------------------------------------------------------------------------------- */

FS_API fs_node *fs_node_open(const struct fs_node_options *options, char *why, size_t why_len)
{
    if (!options_valid(options, why, why_len))
        return NULL;
    fsn_latency_init();
    fs_node *n = node_new(options);
    if (!n) {
        fsn_say(why, why_len, "out of memory");
        return NULL;
    }
    if (open_control(n, options) == 0 && fsn_control_start(n) != 0) {
        n->endpoint[0] = '\0';
        close_socket(n);
    }
    const char *dir = endpoints_dir(options);
    if (n->thread_running && dir)
        announce(n, dir);
    return n;
}

FS_API const char *fs_node_endpoint(const fs_node *n)
{
    return n && n->endpoint[0] ? n->endpoint : NULL;
}

#define ADD(counter, v) atomic_fetch_add_explicit(&(counter), (v), memory_order_relaxed)

/* The shards this thread counts into, for the last few nodes it told something (most recent first). */
#define REMEMBERED_SHARDS 4
static _Thread_local struct {
    uint64_t serial;
    struct fsn_shard *shard;
} my_shards[REMEMBERED_SHARDS] __attribute__((tls_model("initial-exec")));

/* A shard's timeline begins busy, when its first thread takes it (the shared one: its first). */
static void begin_timeline(struct fsn_shard *shard)
{
    uint64_t unused = 0;
    if (!atomic_load_explicit(&shard->phase, memory_order_relaxed))
        atomic_compare_exchange_strong_explicit(&shard->phase, &unused, FSN_PHASE_WORD(fsn_monotonic_ns(), FSN_BUSY),
                                                memory_order_relaxed, memory_order_relaxed);
}

/* This thread's shard of the node: one it had, or a new one (the shared last one when all are taken). */
static __attribute__((noinline)) struct fsn_shard *claim_shard(fs_node *n)
{
    int k = 1;
    while (k < REMEMBERED_SHARDS && my_shards[k].serial != n->serial)
        k++;
    struct fsn_shard *shard;
    if (k < REMEMBERED_SHARDS) {
        shard = my_shards[k].shard;
    } else {
        unsigned taken = atomic_fetch_add_explicit(&n->shards_claimed, 1, memory_order_relaxed);
        shard = &n->shards[taken < FSN_SHARDS - 1 ? taken : FSN_SHARDS - 1];
        begin_timeline(shard);
        k = REMEMBERED_SHARDS - 1;
    }
    memmove(&my_shards[1], &my_shards[0], (size_t)k * sizeof my_shards[0]);
    my_shards[0].serial = n->serial;
    my_shards[0].shard = shard;
    return shard;
}

static inline struct fsn_shard *my_shard(fs_node *n)
{
    return my_shards[0].serial == n->serial ? my_shards[0].shard : claim_shard(n);
}

static inline void add(_Atomic uint64_t *counter, uint64_t v, int shared)
{
    if (shared)
        atomic_fetch_add_explicit(counter, v, memory_order_relaxed);
    else /* the only writer: the control thread only reads */
        atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + v, memory_order_relaxed);
}

uint64_t fsn_total(const fs_node *n, size_t offset)
{
    uint64_t sum = 0;
    for (int i = 0; i < FSN_SHARDS; i++)
        sum += atomic_load_explicit((_Atomic uint64_t *)((char *)&n->shards[i] + offset), memory_order_relaxed);
    return sum;
}

void fsn_phase_totals(const fs_node *n, uint64_t now_ns, uint64_t totals[FSN_PHASES])
{
    for (int p = 0; p < FSN_PHASES; p++)
        totals[p] = 0;
    for (int i = 0; i < FSN_SHARDS; i++) {
        const struct fsn_shard *s = &n->shards[i];
        for (int p = 0; p < FSN_PHASES; p++) /* before the word (see struct fsn_shard) */
            totals[p] += atomic_load_explicit(&s->phase_ns[p], memory_order_acquire);
        uint64_t word = atomic_load_explicit(&s->phase, memory_order_relaxed);
        if (word && !(word & FSN_PHASE_CHANGING) && now_ns > FSN_PHASE_SINCE(word))
            totals[FSN_PHASE_OF(word)] += now_ns - FSN_PHASE_SINCE(word);
    }
}

/* The phase changes: the word marked changing, the clock read once, the slice that ended added to
 * its phase, the new word (see struct fsn_shard). While the word is marked, its marker is the one
 * thread that writes the shard's time. */
static __attribute__((noinline)) void change_phase(struct fsn_shard *s, uint64_t word, enum fsn_phase phase)
{
    if (!s->shared) { /* the only writer */
        atomic_store_explicit(&s->phase, word | FSN_PHASE_CHANGING, memory_order_relaxed);
    } else { /* the first thread to mark it changes it; the others leave it to that one */
        while (!atomic_compare_exchange_weak_explicit(&s->phase, &word, word | FSN_PHASE_CHANGING, memory_order_acquire,
                                                      memory_order_relaxed))
            if ((word & FSN_PHASE_CHANGING) || FSN_PHASE_OF(word) == (int)phase)
                return;
    }
    uint64_t now = fsn_monotonic_ns(), since = FSN_PHASE_SINCE(word);
    _Atomic uint64_t *spent = &s->phase_ns[FSN_PHASE_OF(word)];
    uint64_t before = atomic_load_explicit(spent, memory_order_relaxed);
    atomic_store_explicit(spent, before + (now > since ? now - since : 0), memory_order_release); /* after the mark */
    atomic_store_explicit(&s->phase, FSN_PHASE_WORD(now, phase), memory_order_release); /* after the time */
}

/* The calling thread is in phase from now on: without a clock read when it already was. */
static inline void enter(struct fsn_shard *s, enum fsn_phase phase)
{
    uint64_t word = atomic_load_explicit(&s->phase, memory_order_relaxed);
    if (FSN_PHASE_OF(word) != (int)phase && !(word & FSN_PHASE_CHANGING)) /* marked: another thread's change */
        change_phase(s, word, phase);
}

FS_API void fs_node_received(fs_node *n, uint64_t objects, uint64_t bytes)
{
    if (!n)
        return;
    struct fsn_shard *s = my_shard(n);
    add(&s->objects_received, objects, s->shared);
    add(&s->bytes_received, bytes, s->shared);
    enter(s, FSN_BUSY);
}

FS_API int fs_node_source(fs_node *n, const char *id)
{
    if (!n || !id || !*id || strlen(id) > FS_NODE_SOURCE_MAX || !fsn_utf8_valid(id, strlen(id)))
        return -1;
    pthread_mutex_lock(&n->sources_lock);
    int count = atomic_load_explicit(&n->nsources, memory_order_relaxed), found = -1;
    for (int i = 0; i < count && found < 0; i++)
        if (strcmp(n->source_id[i], id) == 0)
            found = i;
    if (found < 0 && count < FS_NODE_MAX_SOURCES && (n->source_id[count] = strdup(id)) != NULL) {
        found = count;
        atomic_store_explicit(&n->nsources, count + 1, memory_order_release); /* its id is in place */
    }
    pthread_mutex_unlock(&n->sources_lock);
    return found;
}

FS_API void fs_node_received_from(fs_node *n, int source, uint64_t objects, uint64_t bytes)
{
    if (!n)
        return;
    fs_node_received(n, objects, bytes);
    if (source >= 0 && source < atomic_load_explicit(&n->nsources, memory_order_relaxed))
        ADD(n->source_objects[source], objects); /* shared by the threads taking from it: an atomic add */
}

FS_API void fs_node_sent(fs_node *n, uint64_t objects, uint64_t bytes)
{
    if (!n)
        return;
    struct fsn_shard *s = my_shard(n);
    add(&s->objects_sent, objects, s->shared);
    add(&s->bytes_sent, bytes, s->shared);
    if (atomic_load_explicit(&n->send_overloaded, memory_order_relaxed)) /* a read costs less than a write */
        atomic_store_explicit(&n->send_overloaded, 0, memory_order_relaxed);
    enter(s, FSN_BUSY);
}

static uint64_t bits_of(double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

FS_API void fs_node_merged(fs_node *n, uint64_t objects, double seconds)
{
    if (!n)
        return;
    double ms = isfinite(seconds) && seconds > 0 ? seconds * 1e3 : 0.0;
    uint64_t slot = ADD(n->merge_tickets, 1) % FSN_MERGE_WINDOW;
    atomic_store_explicit(&n->merge_ms_bits[slot], bits_of(ms), memory_order_relaxed);
    ADD(n->objects_merged, objects);
    atomic_fetch_add_explicit(&n->merges, 1, memory_order_release); /* its duration is in place */
    enter(my_shard(n), FSN_BUSY);
}

FS_API void fs_node_send_refused(fs_node *n)
{
    if (!n)
        return;
    if (!atomic_exchange_explicit(&n->send_overloaded, 1, memory_order_relaxed))
        ADD(n->send_overload_events, 1);
    enter(my_shard(n), FSN_BACKPRESSURED);
}

FS_API void fs_node_waiting(fs_node *n)
{
    if (n)
        enter(my_shard(n), FSN_IDLE);
}

FS_API void fs_node_sending(fs_node *n)
{
    if (n)
        enter(my_shard(n), FSN_BACKPRESSURED);
}

FS_API void fs_node_input_backlog(fs_node *n, int backlogged)
{
    if (!n)
        return;
    if (backlogged) {
        if (!atomic_load_explicit(&n->receive_overloaded, memory_order_relaxed) &&
            !atomic_exchange_explicit(&n->receive_overloaded, 1, memory_order_relaxed))
            ADD(n->receive_overload_events, 1);
    } else if (atomic_load_explicit(&n->receive_overloaded, memory_order_relaxed)) {
        atomic_store_explicit(&n->receive_overloaded, 0, memory_order_relaxed);
    }
}

FS_API void fs_node_latency(fs_node *n, double sent_unix_s)
{
    fs_node_latencies(n, &sent_unix_s, 1);
}

FS_API void fs_node_latencies(fs_node *n, const double *sent_unix_s, size_t count)
{
    if (!n || count == 0)
        return;
    struct fsn_shard *s = my_shard(n);
    fsn_latency_record(&s->latency, fsn_clock(CLOCK_REALTIME), sent_unix_s, count, s->shared);
}

FS_API void fs_node_set_state(fs_node *n, enum fs_node_state state)
{
    if (n && state >= FS_NODE_STARTING && state <= FS_NODE_STOPPED)
        atomic_store_explicit(&n->state, (int)state, memory_order_relaxed);
}

FS_API enum fs_node_state fs_node_get_state(const fs_node *n)
{
    return n ? (enum fs_node_state)atomic_load_explicit(&n->state, memory_order_relaxed) : FS_NODE_STOPPED;
}

FS_API int fs_node_stop_requested(const fs_node *n)
{
    return n && atomic_load_explicit(&n->stop_requested, memory_order_relaxed);
}

FS_API int fs_node_start_requested(const fs_node *n)
{
    return n && atomic_load_explicit(&n->start_requested, memory_order_relaxed);
}

FS_API void fs_node_close(fs_node *n)
{
    if (!n)
        return;
    atomic_store_explicit(&n->state, FS_NODE_STOPPED, memory_order_relaxed);
    fsn_control_wait_to_tell_the_end(n);
    if (n->endpoints_file && unlink(n->endpoints_file) != 0 && errno != ENOENT)
        fprintf(stderr, "flowstat-node %s: cannot remove the endpoints file %s: %s\n", n->node_id, n->endpoints_file,
                strerror(errno));
    fsn_control_stop(n);
    close_socket(n);
    node_free(n);
}
