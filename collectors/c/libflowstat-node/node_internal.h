/* The node as the library's files share it: what the node's threads count (atomics) and what the
 * control thread owns. */
#ifndef FLOWSTAT_NODE_INTERNAL_H
#define FLOWSTAT_NODE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <zmq.h>

#include "flowstat/node.h"
#include "node_curve.h"
#include "node_latency.h"

#define FSN_MERGE_WINDOW 10 /* average_merge_time covers the last 10 merges (thesis section 4.2.3) */
#define FSN_SHARDS 8 /* threads that count with plain stores; the ones after them share the last shard */
#define FSN_DEFAULT_BIND "tcp://127.0.0.1:*"

struct fsn_control; /* the control thread's own state (node_control.c) */

/* The node's CURVE server (node_guard.c), when it was given keys: it lets in the run's client key
 * only, and says its first refusal. */
struct fsn_guard {
    struct fsn_curve_keys node; /* its key pair (the secret wiped once the socket holds it) */
    unsigned char client[32]; /* the one client public key let in */
    void *zap, *monitor; /* the ZAP handler (a REP socket) and the router's monitor (a PAIR) */
    uint64_t refused; /* clients refused: the control thread's, until it is joined */
};

/* What the node tells most often (for each object), counted by one thread into a shard of its own
 * with plain loads and stores: no locked instruction, no cache line shared with another writer. The
 * last shard is shared by the threads past the first FSN_SHARDS - 1 (atomic read-modify-writes).
 * The control thread sums the shards. */
struct fsn_shard {
    _Alignas(64) _Atomic uint64_t objects_received;
    _Atomic uint64_t bytes_received, objects_sent, bytes_sent;
    int shared;
    struct fsn_latency latency;
};

struct fs_node {
    /* Fixed at open. */
    char *node_id, *role, *run_id, *bind;
    long receive_buffer_size, send_buffer_size; /* < 0: none */
    pid_t pid;
    double started_wall, started_cpu; /* CLOCK_MONOTONIC and CLOCK_PROCESS_CPUTIME_ID, s */
    char endpoint[256]; /* "" when unmonitored */
    char curve_server_key[FSN_CURVE_KEY_LEN + 1]; /* its CURVE public key, announced; "": in the clear */
    char *endpoints_file; /* the announcement, NULL when none */

    /* Told by the node, from any thread: relaxed atomics. */
    struct fsn_shard shards[FSN_SHARDS];
    uint64_t serial; /* this node among all the process opened: which shard a thread has, it remembers by it */
    atomic_uint shards_claimed;
    _Atomic uint64_t objects_merged, merges, merge_tickets;
    _Atomic uint64_t merge_ms_bits[FSN_MERGE_WINDOW]; /* the last merges' durations (ms, doubles' bits) */
    _Atomic uint64_t send_overload_events, receive_overload_events;
    atomic_int send_overloaded, receive_overloaded;
    atomic_int state, stop_requested, start_requested;

    /* The control thread. */
    atomic_int quit;
    int thread_running;
    pthread_t thread;
    int wake_fd; /* an eventfd: close() wakes the control thread with it (-1: it polls every 50 ms) */
    void *zmq_context, *router;
    struct fsn_guard *guard; /* NULL: the channel is in the clear */
    struct fsn_control *control;
};

/* One multi-part message of a socket: its first FSN_MAX_FRAMES frames (too_long: there were more). */
#define FSN_MAX_FRAMES 32
struct fsn_message {
    zmq_msg_t frames[FSN_MAX_FRAMES];
    int count, too_long;
};
/* All frames of the next message waiting on sock; 0, or -1 when none is waiting. */
int fsn_message_receive(void *sock, struct fsn_message *m);
void fsn_message_close(struct fsn_message *m);

double fsn_clock(clockid_t clock);
/* ISO-8601 UTC with milliseconds ("2026-11-22T10:51:14.123Z") of the wall time now. */
void fsn_iso_now(char *out, size_t n);
const char *fsn_state_name(int state);
/* The sum of one counter over the shards. */
uint64_t fsn_total(const fs_node *node, size_t offset);
#define FSN_TOTAL(node, field) fsn_total((node), offsetof(struct fsn_shard, field))

/* Start the control thread on the bound router socket; 0, or -1 (said on stderr). */
int fsn_control_start(fs_node *node);
/* Stop it and free what it held (the socket is closed by the caller). */
void fsn_control_stop(fs_node *node);
/* Once the node is STOPPED: a node an agent has been asking waits for one more get-metrics, so that
 * the agent's STOPPED sample carries its final counts (at most two of the intervals it was asked at,
 * FSN_FINAL_REPORT_MAX_S at most; a node not asked twice does not wait). */
#define FSN_FINAL_REPORT_MAX_S 5.0
void fsn_control_wait_to_tell_the_end(fs_node *node);

/* CURVE (node_guard.c). The keys folder a node was given, else $FLOWSTAT_CURVE_KEYS; NULL: none. */
const char *fsn_guard_keys_dir(const struct fs_node_options *options);
/* Whether a ZeroMQ address stays on this host (127.0.0.0/8, ::1, localhost, ipc, inproc). */
int fsn_is_loopback(const char *address);
/* The run's keys of dir into node->guard: 0, or -1 once said on stderr (naming the file). */
int fsn_guard_load(fs_node *node, const char *dir);
/* On the node's context, before its router binds: the ZAP handler bound, the router a CURVE
 * server watched by a monitor. 0, or -1 (errno says why). */
int fsn_guard_arm(fs_node *node);
/* Answer the ZAP requests and read the handshake failures waiting (the control thread). */
void fsn_guard_serve(fs_node *node);
/* Its sockets closed (before the context is terminated), the refusals counted said, its keys
 * wiped. NULL guard: nothing. */
void fsn_guard_close(fs_node *node);

#endif
