/* libflowstat-node: flowstat's control channel (docs/control-protocol.md) for any ZeroMQ process.
 *
 *     struct fs_node_options o = FS_NODE_OPTIONS_INIT;
 *     o.node_id = "merger-0";
 *     o.role = "merger";
 *     fs_node *node = fs_node_open(&o, why, sizeof why);
 *     ... fs_node_received(node, 1, len); fs_node_latency(node, t_sent); fs_node_merged(node, n, s); ...
 *     fs_node_close(node);
 *
 * A thread of the library's own answers check-state, get-metrics, start and stop on a ZeroMQ ROUTER
 * socket (its own context). The calls that count (received, sent, merged, ...) are relaxed atomic
 * updates: they never take a lock, never wait for that thread and may be made from any thread (the
 * first few threads that count each get counters of their own, updated without locked
 * instructions: a few nanoseconds a call). Calls on a NULL node do nothing. The
 * node announces its control endpoint in an endpoints file (endpoints_dir, or the environment
 * variable FLOWSTAT_ENDPOINTS_DIR) that a flowstat agent finds with --endpoints-dir.
 *
 * Secured channels (ZeroMQ CURVE, docs/control-protocol.md): given a run's keys folder (curve_keys,
 * or FLOWSTAT_CURVE_KEYS; flowstat.node.curve.create_run_keys makes one, RUN_DIR/keys), the control
 * socket is a CURVE server with the run's node key (node.key_secret) that answers only clients
 * holding the run's client key (client.key): a ZAP handler and a handshake monitor on the library's
 * thread. Any other client gets no answer; the first refusal is said on stderr (why, never a key),
 * the others counted and their number said at close. The endpoints file then carries the node's
 * public key (curve_server_key), which a client needs to connect. Keys that cannot be read (or a
 * libzmq without CURVE) leave the node unmonitored, said naming the file: never in the clear. A
 * node without keys that binds anything but loopback says its channel is in the clear.
 *
 * C and C++ alike: link with -lflowstat-node -lzmq -pthread -lm (pkg-config flowstat-node). */
#ifndef FLOWSTAT_NODE_H
#define FLOWSTAT_NODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One node: opaque, made by fs_node_open and freed by fs_node_close. */
typedef struct fs_node fs_node;

/* The states of the sample schema (node_state). A node is RUNNING once opened unless it says otherwise. */
enum fs_node_state {
    FS_NODE_STARTING = 0,
    FS_NODE_READY = 1, /* bound, waiting for `start` (fs_node_start_requested) */
    FS_NODE_RUNNING = 2,
    FS_NODE_DRAINING = 3, /* stopping, sending what it holds */
    FS_NODE_STOPPED = 4
};

struct fs_node_options {
    const char *node_id; /* required: the node's id in its samples */
    const char *role; /* ^[a-z][a-z0-9_-]{0,31}$; NULL: "other" */
    const char *run_id; /* NULL: none (reported as null, left out of the endpoints file) */
    const char *bind; /* the control socket's address; NULL: "tcp://127.0.0.1:*" (loopback, any free port) */
    const char *endpoints_dir; /* where to announce the node; NULL: $FLOWSTAT_ENDPOINTS_DIR, else nowhere */
    long receive_buffer_size; /* the input's ZeroMQ high-water mark in messages; < 0: none (null) */
    long send_buffer_size; /* the output's; < 0: none (null) */
    const char *curve_keys; /* the run's keys folder; NULL: $FLOWSTAT_CURVE_KEYS, else none (in the clear) */
};

/* Every option unset; C++ can write `fs_node_options o = FS_NODE_OPTIONS_INIT;` too. */
#define FS_NODE_OPTIONS_INIT                       \
    {                                              \
        NULL, NULL, NULL, NULL, NULL, -1, -1, NULL \
    }

/* A node, RUNNING. NULL only for invalid options (why says which, when why_len > 0) or no memory.
 * A control socket that cannot be bound or secured (keys given that cannot be read), or an
 * endpoints file that cannot be written, is said on stderr (naming the address or the file) and the
 * node runs on: unmonitored without a socket (counting still works; no thread, no file). */
fs_node *fs_node_open(const struct fs_node_options *options, char *why, size_t why_len);

/* The bound control endpoint ("tcp://127.0.0.1:40123"); NULL when the node runs unmonitored. */
const char *fs_node_endpoint(const fs_node *node);

/* What the node did: objects (and their bytes) taken from its input, sent downstream. A sent()
 * ends a send overload episode. */
void fs_node_received(fs_node *node, uint64_t objects, uint64_t bytes);
void fs_node_sent(fs_node *node, uint64_t objects, uint64_t bytes);
/* A merge of `objects` objects that took `seconds`. */
void fs_node_merged(fs_node *node, uint64_t objects, double seconds);
/* A send found the output buffer full: the first refusal since the last sent() begins an episode
 * (send_overload_events counts episodes). */
void fs_node_send_refused(fs_node *node);
/* Whether the last read cycle left input waiting; an episode begins at each change to true. */
void fs_node_input_backlog(fs_node *node, int backlogged);
/* An object stamped by its sender at sent_unix_s (Unix seconds, CLOCK_REALTIME) was taken now. */
void fs_node_latency(fs_node *node, double sent_unix_s);
/* count objects taken now (after a read cycle: the clock is read once for all of them; cheaper). */
void fs_node_latencies(fs_node *node, const double *sent_unix_s, size_t count);

void fs_node_set_state(fs_node *node, enum fs_node_state state);
enum fs_node_state fs_node_get_state(const fs_node *node);
/* Whether a `stop` request came (the node then stops as on SIGTERM). */
int fs_node_stop_requested(const fs_node *node);
/* Whether a `start` request came (it also moves a READY node to RUNNING). */
int fs_node_start_requested(const fs_node *node);

/* STOPPED, the endpoints file removed, the control thread joined, its socket closed, memory freed.
 * A node an agent has been asking first waits for its next get-metrics (two of the intervals it was
 * asked at, 5 s at most), so that the agent's STOPPED sample carries the final counts. NULL is allowed. */
void fs_node_close(fs_node *node);

#ifdef __cplusplus
}
#endif

#endif
