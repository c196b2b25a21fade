/* Asking nodes for get-metrics over their control sockets: one DEALER per node, all requests
 * sent before any reply is awaited, one deadline for all. */
#ifndef FLOWSTAT_CONTROL_H
#define FLOWSTAT_CONTROL_H

#include <stddef.h>

#include <cJSON.h>

#include "sample.h"

#define CONTROL_MAX_REPLY (256 * 1024)

struct control_conn {
    char endpoint[256];
    void *sock;
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
/* replies[i] gets the parsed reply of endpoints[i], or NULL; the caller frees them with cJSON_Delete. */
void control_query(struct control_pool *p, const char *const *endpoints, size_t n, cJSON **replies);
void control_forget(struct control_pool *p, const char *endpoint);
void control_pool_close(struct control_pool *p);

/* A reply text as a JSON object answering request rid, or NULL (malformed, error, stale). */
cJSON *control_parse_reply(const char *data, size_t len, unsigned long long rid);
/* Copy the fields the schema maps from the reply (x-control) into the sample; wrong types are skipped. */
void control_fill_sample(const cJSON *reply, struct fs_sample *s);

#endif
