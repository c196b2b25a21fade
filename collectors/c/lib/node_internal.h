/* The node as the library's files share it: what the node's threads count (atomics) and what the
 * control thread owns. */
#ifndef FLOWSTAT_NODE_INTERNAL_H
#define FLOWSTAT_NODE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "flowstat/node.h"
#include "node_latency.h"

#define FSN_MERGE_WINDOW 10 /* average_merge_time covers the last 10 merges (thesis section 4.2.3) */
#define FSN_DEFAULT_BIND "tcp://127.0.0.1:*"

struct fsn_control; /* the control thread's own state (node_control.c) */

struct fs_node {
    /* Fixed at open. */
    char *node_id, *role, *run_id, *bind;
    long receive_buffer_size, send_buffer_size; /* < 0: none */
    pid_t pid;
    double started_wall, started_cpu; /* CLOCK_MONOTONIC and CLOCK_PROCESS_CPUTIME_ID, s */
    char endpoint[256]; /* "" when unmonitored */
    char *endpoints_file; /* the announcement, NULL when none */

    /* Told by the node, from any thread: relaxed atomics. */
    _Atomic uint64_t objects_received, bytes_received, objects_sent, bytes_sent;
    _Atomic uint64_t objects_merged, merges, merge_tickets;
    _Atomic uint64_t merge_ms_bits[FSN_MERGE_WINDOW]; /* the last merges' durations (ms, doubles' bits) */
    _Atomic uint64_t send_overload_events, receive_overload_events;
    atomic_int send_overloaded, receive_overloaded;
    atomic_int state, stop_requested, start_requested;
    struct fsn_latency latency;

    /* The control thread. */
    atomic_int quit;
    int thread_running;
    pthread_t thread;
    void *zmq_context, *router;
    struct fsn_control *control;
};

double fsn_clock(clockid_t clock);
/* ISO-8601 UTC with milliseconds ("2026-11-22T10:51:14.123Z") of the wall time now. */
void fsn_iso_now(char *out, size_t n);
const char *fsn_state_name(int state);

/* Start the control thread on the bound router socket; 0, or -1 (said on stderr). */
int fsn_control_start(fs_node *node);
/* Stop it and free what it held (the socket is closed by the caller). */
void fsn_control_stop(fs_node *node);

#endif
