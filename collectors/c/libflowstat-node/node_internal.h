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

/* Where a counting thread's time goes (fs_node_waiting in flowstat/node.h): at any moment in one phase. */
enum fsn_phase { FSN_BUSY = 0, FSN_BACKPRESSURED = 1, FSN_IDLE = 2, FSN_PHASES = 3 };
/* A thread's phase and since when (CLOCK_MONOTONIC ns) in one word, read by the control thread in
 * one load; 0: no thread has counted into the shard yet. FSN_PHASE_CHANGING: the phase is being
 * changed, the clock read (or about to be) for the time it ends. */
#define FSN_PHASE_WORD(since_ns, phase) ((uint64_t)(since_ns) << 3 | (uint64_t)(phase))
#define FSN_PHASE_OF(word) ((int)((word)&3))
#define FSN_PHASE_CHANGING 4u
#define FSN_PHASE_SINCE(word) ((word) >> 3)

/* What the node tells most often (for each object), counted by one thread into a shard of its own
 * with plain loads and stores: no locked instruction, no cache line shared with another writer. The
 * last shard is shared by the threads past the first FSN_SHARDS - 1 (atomic read-modify-writes).
 * The control thread sums the shards.
 *
 * Time: a shard is one timeline, its thread's: the phase word, then the time of each phase's
 * ended slices (phase_ns). A change marks the word changing, reads the clock, adds the slice that
 * ended to its phase (release), then stores the new word (release). The control thread reads its
 * clock, loads the times (acquire), then the word, and counts the running slice of a word not
 * marked (a marked one's ending time is not known yet): a reading may miss a slice that is ending
 * (the next has it), and never gives a slice to the old phase past the moment its end was read
 * (which, read later, would count time twice: once there, once in the new phase), but for the
 * moment the mark takes to reach the control thread's core (nanoseconds). The shared shard is one
 * timeline for all its threads, in the phase the last change set: the thread that marks the word
 * changes it, alone; one that finds it marked leaves the change to that one. */
struct fsn_shard {
    _Alignas(64) _Atomic uint64_t objects_received;
    _Atomic uint64_t bytes_received, objects_sent, bytes_sent;
    _Atomic uint64_t phase; /* FSN_PHASE_WORD */
    int shared;
    _Atomic uint64_t phase_ns[FSN_PHASES];
    struct fsn_latency latency;
};

struct fs_node {
    /* Fixed at open. */
    char *node_id, *role, *run_id, *bind;
    char *upstream; /* the options' upstream: node ids joined by commas; NULL: not said */
    long receive_buffer_size, send_buffer_size; /* < 0: none */
    pid_t pid;
    uint64_t started_ns; /* CLOCK_MONOTONIC */
    double started_wall, started_cpu; /* CLOCK_MONOTONIC (started_ns) and CLOCK_PROCESS_CPUTIME_ID, s */
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
    /* fs_node_source's: an id is written before nsources counts it (release), never changed after. */
    pthread_mutex_t sources_lock;
    char *source_id[FS_NODE_MAX_SOURCES];
    _Atomic uint64_t source_objects[FS_NODE_MAX_SOURCES];
    atomic_int nsources;

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
uint64_t fsn_monotonic_ns(void);
/* ISO-8601 UTC with milliseconds ("2026-11-22T10:51:14.123Z") of the wall time now. */
void fsn_iso_now(char *out, size_t n);
const char *fsn_state_name(int state);
/* The sum of one counter over the shards. */
uint64_t fsn_total(const fs_node *node, size_t offset);
#define FSN_TOTAL(node, field) fsn_total((node), offsetof(struct fsn_shard, field))
/* The time of each phase (ns) over the shards, their running slices counted to now_ns. A slice that
 * ended while they were read may be missed (not counted twice): the control thread keeps the
 * totals it reported from going back. */
void fsn_phase_totals(const fs_node *node, uint64_t now_ns, uint64_t totals[FSN_PHASES]);

/* Start the control thread on the bound router socket; 0, or -1 (said on stderr). */
int fsn_control_start(fs_node *node);
/* Stop it and free what it held (the socket is closed by the caller). */
void fsn_control_stop(fs_node *node);
/* Once the node is STOPPED: a node an agent has been asking waits for one more get-metrics, so that
 * the agent's STOPPED sample carries its final counts (one interval after the last request and one
 * more, or FSN_FINAL_REPORT_SLACK_S if longer, for an agent a loaded host makes late;
 * FSN_FINAL_REPORT_MAX_S at most; a node not asked twice does not wait). */
#define FSN_FINAL_REPORT_MAX_S 5.0
#define FSN_FINAL_REPORT_SLACK_S 1.0
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
