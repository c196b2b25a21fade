#include "control.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

int control_pool_init(struct control_pool *p, double timeout_s)
{
    memset(p, 0, sizeof *p);
    p->timeout_s = timeout_s;
    p->ctx = zmq_ctx_new();
    return p->ctx ? 0 : -1;
}

static int same_key(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

/* A node that restarts under the same endpoint with another run's key is another connection. */
static struct control_conn *find_conn(struct control_pool *p, const char *endpoint, const char *server_key)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->conns[i].endpoint, endpoint) == 0 && same_key(p->conns[i].server_key, server_key))
            return &p->conns[i];
    return NULL;
}

static int grow_conns(struct control_pool *p)
{
    if (p->n < p->cap)
        return 0;
    size_t cap = p->cap ? p->cap * 2 : 16;
    struct control_conn *grown = realloc(p->conns, cap * sizeof *grown);
    if (!grown)
        return -1;
    p->conns = grown;
    p->cap = cap;
    return 0;
}

/* A CURVE client of the node: its public key and the agent's pair, set before connecting. */
static int make_curve_client(void *sock, const struct control_peer *peer)
{
    return zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, peer->server_key, FSN_CURVE_KEY_LEN) == 0 &&
            zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, peer->client->public_key, FSN_CURVE_KEY_LEN) == 0 &&
            zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, peer->client->secret_key, FSN_CURVE_KEY_LEN) == 0
        ? 0
        : -1;
}

static int set_socket_options(void *sock, const struct control_peer *peer)
{
    int zero = 0, hwm = 4;
    int64_t maxsize = CONTROL_MAX_REPLY;
    int ok = zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) == 0 &&
        zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm) == 0 &&
        zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxsize, sizeof maxsize) == 0;
    return ok && (!peer->server_key || !peer->server_key[0] || make_curve_client(sock, peer) == 0) ? 0 : -1;
}

static struct control_conn *get_conn(struct control_pool *p, const struct control_peer *peer)
{
    struct control_conn *c = find_conn(p, peer->endpoint, peer->server_key);
    if (c)
        return c;
    if (grow_conns(p) != 0)
        return NULL;
    void *sock = zmq_socket(p->ctx, ZMQ_DEALER);
    if (!sock)
        return NULL;
    if (set_socket_options(sock, peer) != 0 || zmq_connect(sock, peer->endpoint) != 0) {
        LOG_ERR("control endpoint %s: %s", peer->endpoint, zmq_strerror(errno));
        zmq_close(sock);
        return NULL;
    }
    c = &p->conns[p->n++];
    fs_strlcpy(c->endpoint, peer->endpoint, sizeof c->endpoint);
    fs_strlcpy(c->server_key, peer->server_key ? peer->server_key : "", sizeof c->server_key);
    c->sock = sock;
    return c;
}

int control_client_keys(const char *path, struct fsn_curve_keys *keys, char *why, size_t why_len)
{
    if (!zmq_has("curve")) {
        snprintf(why, why_len, "this libzmq has no CURVE");
        return -1;
    }
    return fsn_curve_read(path, 1, keys, why, why_len);
}

cJSON *control_parse_reply(const char *data, size_t len, unsigned long long rid)
{
    cJSON *reply = cJSON_ParseWithLength(data, len);
    if (!reply)
        return NULL;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(reply, "id");
    if (!cJSON_IsObject(reply) || cJSON_GetObjectItemCaseSensitive(reply, "error") || !cJSON_IsNumber(id) ||
        id->valuedouble != (double)rid) {
        cJSON_Delete(reply);
        return NULL;
    }
    return reply;
}

/* Read what is queued on one socket; keep the reply to rid (older, late replies may come first). */
static cJSON *receive_reply(void *sock, unsigned long long rid, unsigned long long *errors)
{
    for (int tries = 0; tries < 16; tries++) {
        zmq_msg_t part;
        cJSON *reply = NULL;
        int more = 1, got = 0;
        while (more) {
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&part);
                return NULL;
            }
            got = 1;
            more = zmq_msg_more(&part);
            if (!more) /* the last frame is the JSON (after the envelope of a REQ-style node, if any) */
                reply = control_parse_reply(zmq_msg_data(&part), zmq_msg_size(&part), rid);
            zmq_msg_close(&part);
        }
        if (reply)
            return reply;
        if (got)
            (*errors)++;
    }
    return NULL;
}

void control_query(struct control_pool *p, const struct control_peer *peers, size_t n, cJSON **replies)
{
    unsigned long long rid = ++p->request_id;
    char body[96];
    int body_len = snprintf(body, sizeof body, "{\"command\": \"get-metrics\", \"id\": %llu}", rid);
    zmq_pollitem_t *items = calloc(n ? n : 1, sizeof *items);
    size_t *index = calloc(n ? n : 1, sizeof *index);
    size_t waiting = 0;
    for (size_t i = 0; i < n; i++) {
        replies[i] = NULL;
        struct control_conn *c = items ? get_conn(p, &peers[i]) : NULL;
        /* One frame, no REQ-style empty delimiter: a node echoes whatever envelope came, and with
         * CURVE every frame is a message encrypted on its own, so the delimiter doubled the work. */
        if (!c || zmq_send(c->sock, body, (size_t)body_len, ZMQ_DONTWAIT) < 0) {
            p->errors++;
            continue;
        }
        items[waiting] = (zmq_pollitem_t){.socket = c->sock, .events = ZMQ_POLLIN};
        index[waiting++] = i;
    }
    double deadline = fs_monotonic() + p->timeout_s;
    size_t answered = 0;
    while (answered < waiting) {
        double left = deadline - fs_monotonic();
        if (left <= 0)
            break;
        if (zmq_poll(items, (int)waiting, (long)ceil(left * 1000)) < 0 && errno != EINTR)
            break;
        for (size_t w = 0; w < waiting; w++) {
            if (!(items[w].revents & ZMQ_POLLIN) || replies[index[w]])
                continue;
            replies[index[w]] = receive_reply(items[w].socket, rid, &p->errors);
            if (replies[index[w]]) {
                answered++;
                items[w].events = 0;
            }
        }
    }
    p->errors += waiting - answered;
    free(items);
    free(index);
}

/* A JSON number that is a whole count: 0 to 2^53 (what a double holds exactly). */
static int whole_count(const cJSON *item)
{
    return cJSON_IsNumber(item) && item->valuedouble >= 0 && item->valuedouble <= 9.007199254740992e15 &&
        item->valuedouble == floor(item->valuedouble);
}

void control_fill_sample(const cJSON *reply, struct fs_sample *s)
{
    for (int f = 0; f < FS_NFIELDS; f++) {
        const struct fs_field_def *def = &FS_FIELDS[f];
        if (!def->control)
            continue;
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(reply, def->control);
        if (!item)
            continue;
        switch (def->type) {
        case FS_T_NUMBER:
            if (cJSON_IsNumber(item) && isfinite(item->valuedouble))
                sample_set_num(s, (enum fs_field)f, item->valuedouble);
            break;
        case FS_T_INTEGER:
            if (whole_count(item))
                sample_set_int(s, (enum fs_field)f, (long long)item->valuedouble);
            break;
        case FS_T_BOOLEAN:
            if (cJSON_IsBool(item))
                sample_set_bool(s, (enum fs_field)f, cJSON_IsTrue(item));
            break;
        case FS_T_STRING:
            if (cJSON_IsString(item) && item->valuestring && sample_value_allowed((enum fs_field)f, item->valuestring))
                sample_set_str(s, (enum fs_field)f, item->valuestring);
            break;
        }
    }
}

int control_edge_count(const cJSON *item, const struct fs_sample *node, struct fs_sample *edge)
{
    const char *source = item->string;
    if (!source || !*source || strlen(source) >= FS_STR_MAX || !whole_count(item) || !node->v[FS_F_RUN_ID].s[0])
        return 0;
    sample_clear_as(edge, &FS_EDGE_SCHEMA);
    edge->time_ms = node->time_ms;
    sample_set_str(edge, FS_E_TIME, node->v[FS_F_TIME].s);
    sample_set_str(edge, FS_E_RUN_ID, node->v[FS_F_RUN_ID].s);
    sample_set_str(edge, FS_E_FROM, source);
    sample_set_str(edge, FS_E_TO, node->v[FS_F_NODE_ID].s);
    sample_set_str(edge, FS_E_AGENT, node->v[FS_F_AGENT].s);
    sample_set_int(edge, FS_E_OBJECTS_RECEIVED, (long long)item->valuedouble);
    return 1;
}

void control_forget(struct control_pool *p, const char *endpoint, const char *server_key)
{
    struct control_conn *c = find_conn(p, endpoint, server_key);
    if (!c)
        return;
    zmq_close(c->sock);
    *c = p->conns[--p->n];
}

void control_pool_close(struct control_pool *p)
{
    for (size_t i = 0; i < p->n; i++)
        zmq_close(p->conns[i].sock);
    free(p->conns);
    if (p->ctx)
        zmq_ctx_term(p->ctx);
    memset(p, 0, sizeof *p);
}
