/* Asking nodes for get-metrics over their control sockets: one DEALER per node, all requests
 * sent before any reply is awaited, one deadline for all. A node whose channel takes CURVE clients
 * only (its curve_server_key) is asked as one, with the client pair of its run. */
#ifndef FLOWSTAT_CONTROL_H
#define FLOWSTAT_CONTROL_H

#include <stddef.h>

#include <cJSON.h>

#include "node_curve.h"
#include "sample.h"

#define CONTROL_MAX_REPLY (256 * 1024)

struct control_conn {
    char endpoint[256];
    char server_key[FSN_CURVE_KEY_LEN + 1]; /* "": in the clear */
    void *sock;
};

/* A node to ask: its endpoint and, for a CURVE server, its public key and the pair to ask it with. */
struct control_peer {
    const char *endpoint;
    const char *server_key; /* NULL or "": in the clear */
    const struct fsn_curve_keys *client; /* when server_key */
};

struct control_pool {
    void *ctx;
    struct control_conn *conns;
    size_t n, cap;
    unsigned long long request_id;
    unsigned long long errors; /* unanswered, malformed or error replies */
    double timeout_s;
};

int control_pool_init(struct control_pool *p, double timeout_s);
/* replies[i] gets the parsed reply of peers[i], or NULL; the caller frees them with cJSON_Delete. */
void control_query(struct control_pool *p, const struct control_peer *peers, size_t n, cJSON **replies);
void control_forget(struct control_pool *p, const char *endpoint, const char *server_key);
/* The agent's client pair from a key file (a secret one): 0, or -1 with why naming the file (or
 * saying that this libzmq has no CURVE). */
int control_client_keys(const char *path, struct fsn_curve_keys *keys, char *why, size_t why_len);
void control_pool_close(struct control_pool *p);

/* A reply text as a JSON object answering request rid, or NULL (malformed, error, stale). */
cJSON *control_parse_reply(const char *data, size_t len, unsigned long long rid);
/* Copy the fields the schema maps from the reply (x-control) into the sample; wrong types are skipped. */
void control_fill_sample(const cJSON *reply, struct fs_sample *s);
/* One member of a reply's received_from ({"worker-3": 1200}) as an edge counter of the node's
 * sample (edge.schema.json: its time, run, node as `to` and agent): 1, or 0 for a member that is
 * not a source id (non-empty, under FS_STR_MAX bytes) with a whole count from 0 to 2^53, or a
 * sample without a run. */
int control_edge_count(const cJSON *item, const struct fs_sample *node, struct fs_sample *edge);

#endif
