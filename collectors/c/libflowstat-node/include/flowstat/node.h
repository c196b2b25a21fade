/* libflowstat-node: flowstat's control channel (docs/control-protocol.md) for any ZeroMQ process.
 *
 *     struct fs_node_options o = FS_NODE_OPTIONS_INIT;
 *     o.node_id = "merger-0";
 *     o.role = "merger";
 *     fs_node *node = fs_node_open(&o, why, sizeof why);
 *     ... fs_node_waiting(node); zmq_recv(...);                  (idle until something comes)
 *     fs_node_received(node, 1, len); fs_node_latency(node, t_sent); fs_node_merged(node, n, s);
 *     fs_node_sending(node); zmq_send(...); fs_node_sent(node, 1, len); ...
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
    /* The node ids that feed this node, joined by commas ("worker-0,worker-1"): the pipeline's edges,
     * written in its endpoints file (flowstat top, the verdict and the report draw and judge the
     * graph from them). NULL: not said. Ids holding a comma cannot be named here. */
    const char *upstream;
};

/* Every option unset; C++ can write `fs_node_options o = FS_NODE_OPTIONS_INIT;` too. */
#define FS_NODE_OPTIONS_INIT                             \
    {                                                    \
        NULL, NULL, NULL, NULL, NULL, -1, -1, NULL, NULL \
    }

/* A node, RUNNING. NULL only for invalid options (why says which, when why_len > 0) or no memory.
 * A control socket that cannot be bound or secured (keys given that cannot be read), or an
 * endpoints file that cannot be written, is said on stderr (naming the address or the file) and the
 * node runs on: unmonitored without a socket (counting still works; no thread, no file). */
fs_node *fs_node_open(const struct fs_node_options *options, char *why, size_t why_len);

/* The bound control endpoint ("tcp://127.0.0.1:40123"); NULL when the node runs unmonitored. */
const char *fs_node_endpoint(const fs_node *node);

/* Where the time goes (busy_seconds, backpressured_seconds, idle_seconds since the node opened, and
 * their shares since each client's previous get-metrics: busy_ratio, ...; docs/node-library.md).
 * Each thread that counts is at any moment in one phase, busy, backpressured or idle: busy from its
 * first call (the first such thread: from fs_node_open) until a call sets another; the time between
 * two calls belongs to the phase the earlier one set. received, merged and sent set busy;
 * send_refused and sending set backpressured; waiting sets idle; input_backlog, latency and
 * latencies leave the phase as it is. A call that keeps the phase reads no clock; one that changes
 * it reads CLOCK_MONOTONIC once (the vDSO: some 25 ns). The node's seconds are the sums over its
 * threads; the threads past the first 7 (which share a set of counters) count as one, in the phase
 * the last of them set (a change made while another of them changes the phase gives way to that
 * one). A thread that ends stays in its last phase, its time counting on there: end it with
 * fs_node_waiting. */

/* What the node did: objects (and their bytes) taken from its input (busy: it has work), sent
 * downstream (busy: a send that went through ends backpressure). A sent() ends a send overload
 * episode. */
void fs_node_received(fs_node *node, uint64_t objects, uint64_t bytes);
void fs_node_sent(fs_node *node, uint64_t objects, uint64_t bytes);
/* Where one input takes from several upstream nodes (a PULL fanned in) and each edge's rate matters:
 * a handle for the upstream node `id` (the same id, the same handle), then
 * fs_node_received_from() in place of fs_node_received(). A PUSH cannot tell which peer took a
 * message, so edges are counted where objects arrive (get-metrics' received_from: objects by
 * source). -1 for a NULL node, an id NULL, empty or over FS_NODE_SOURCE_MAX bytes, or past
 * FS_NODE_MAX_SOURCES sources (its objects then count in the totals only). Thread-safe, and takes a
 * lock: ask once per source, not per message. */
#define FS_NODE_MAX_SOURCES 256
#define FS_NODE_SOURCE_MAX 255
int fs_node_source(fs_node *node, const char *id);
/* fs_node_received(), and `objects` counted for `source` (a handle of fs_node_source; any other
 * value: the totals only). One more relaxed atomic add than fs_node_received, no string compared. */
void fs_node_received_from(fs_node *node, int source, uint64_t objects, uint64_t bytes);
/* A merge of `objects` objects that took `seconds` (busy). */
void fs_node_merged(fs_node *node, uint64_t objects, double seconds);
/* A send found the output buffer full: the first refusal since the last sent() begins an episode
 * (send_overload_events counts episodes). Backpressured until the next call that sets another
 * phase: a node that retries a refused send is held by its downstream. */
void fs_node_send_refused(fs_node *node);
/* From now until the next received(), the calling thread waits for input (idle): call it just
 * before a blocking receive or poll. The library sees the end of a receive (received), not its
 * beginning: without this call a node is busy all the time it is not refused a send. */
void fs_node_waiting(fs_node *node);
/* A send begins (backpressured until the next sent(), or another call that sets a phase): call it
 * just before a send that may block. The library sees the end of a send (sent), not its beginning,
 * and a blocking send that waits for room is held by its downstream. Each change of phase reads the
 * clock: a node that makes many small sends in a row may call it once before them and sent() once
 * after them. */
void fs_node_sending(fs_node *node);
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
 * asked at, or one and a second; 5 s at most), so that the agent's STOPPED sample carries the final
 * counts. NULL is allowed. */
void fs_node_close(fs_node *node);

#ifdef __cplusplus
}
#endif

#endif
