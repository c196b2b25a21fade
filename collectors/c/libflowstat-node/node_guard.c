/* A node's CURVE server (issue 30; flowstat.node.curve.Guard is the Python one): the control
 * router takes CURVE clients only, the ZAP handler of the node's own context (RFC 27) lets in the
 * run's client key only, and a monitor of the router sees the handshakes that fail before ZAP is
 * asked (a client without CURVE, or with another run's node key). The first refusal is said on
 * stderr with its reason, the others counted and their number said at close: a refused client
 * retries every 100 ms, and a line each time would drown the node's log. No key is ever said. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "node_internal.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01" /* fixed by RFC 27 */
#define ZAP_DOMAIN "flowstat"
#define MONITOR_ENDPOINT "inproc://flowstat-node-monitor" /* the node's own context: one name will do */
/* A failed handshake that ZAP never saw; ZMQ_EVENT_HANDSHAKE_FAILED_AUTH is a ZAP refusal, said there. */
#define HANDSHAKE_FAILED (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
#define KEYS_ENV "FLOWSTAT_CURVE_KEYS"
#define NODE_SECRET_FILE "node.key_secret"
#define CLIENT_PUBLIC_FILE "client.key"
#define MESSAGES_PER_TURN 64

/* -- where the keys are, whether they are needed ---------------------------------------------- */

const char *fsn_guard_keys_dir(const struct fs_node_options *o)
{
    const char *dir = o->curve_keys ? o->curve_keys : getenv(KEYS_ENV);
    return dir && dir[0] ? dir : NULL;
}

/* The host of a tcp:// (or other) address, brackets of an IPv6 one removed: 0, or -1 if too long. */
static int address_host(const char *rest, char *host, size_t size)
{
    const char *colon = strrchr(rest, ':');
    size_t len = colon ? (size_t)(colon - rest) : strlen(rest);
    if (len >= 2 && rest[0] == '[' && rest[len - 1] == ']') {
        rest++;
        len -= 2;
    }
    if (len >= size)
        return -1;
    memcpy(host, rest, len);
    host[len] = '\0';
    return 0;
}

/* A host name or an interface ("eth0", "*") may be reached from elsewhere: only addresses count. */
int fsn_is_loopback(const char *address)
{
    const char *sep = strstr(address, "://");
    if (!sep)
        return 0;
    size_t scheme = (size_t)(sep - address);
    if ((scheme == 3 && memcmp(address, "ipc", 3) == 0) || (scheme == 6 && memcmp(address, "inproc", 6) == 0))
        return 1;
    char host[256];
    struct in_addr v4;
    struct in6_addr v6;
    if (address_host(sep + 3, host, sizeof host) != 0)
        return 0;
    if (strcmp(host, "localhost") == 0)
        return 1;
    if (inet_pton(AF_INET, host, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

/* -- the keys ---------------------------------------------------------------------------------- */

static int key_path(const char *dir, const char *name, char *out, size_t size)
{
    return snprintf(out, size, "%s/%s", dir, name) < (int)size ? 0 : -1;
}

/* The node's pair and the client key it lets in, from the run's keys folder: 0, or -1 with why. */
static int read_run_keys(const char *dir, struct fsn_guard *g, char *why, size_t why_len)
{
    char node_path[PATH_MAX], client_path[PATH_MAX];
    struct fsn_curve_keys client;
    if (key_path(dir, NODE_SECRET_FILE, node_path, sizeof node_path) != 0 ||
        key_path(dir, CLIENT_PUBLIC_FILE, client_path, sizeof client_path) != 0) {
        snprintf(why, why_len, "%.200s...: path too long", dir);
        return -1;
    }
    if (fsn_curve_read(node_path, 1, &g->node, why, why_len) != 0 ||
        fsn_curve_read(client_path, 0, &client, why, why_len) != 0)
        return -1;
    int decoded = zmq_z85_decode(g->client, client.public_key) != NULL; /* checked as it was read */
    fsn_curve_wipe(&client);
    if (!decoded)
        snprintf(why, why_len, "%s: its public-key does not decode", client_path);
    return decoded ? 0 : -1;
}

int fsn_guard_load(fs_node *n, const char *dir)
{
    char why[PATH_MAX + 200];
    if (!zmq_has("curve")) {
        fprintf(stderr,
                "flowstat-node %s: CURVE keys given (%s) but this libzmq has no CURVE: running unmonitored, never in "
                "the clear\n",
                n->node_id, dir);
        return -1;
    }
    struct fsn_guard *g = calloc(1, sizeof *g);
    if (!g || read_run_keys(dir, g, why, sizeof why) != 0) {
        fprintf(stderr, "flowstat-node %s: cannot secure the control channel (%s): running unmonitored\n", n->node_id,
                g ? why : "out of memory");
        if (g)
            explicit_bzero(g, sizeof *g);
        free(g);
        return -1;
    }
    memcpy(n->curve_server_key, g->node.public_key, sizeof n->curve_server_key);
    n->guard = g;
    return 0;
}

/* -- the sockets ------------------------------------------------------------------------------- */

static int set_option(void *sock, int option, const void *value, size_t len)
{
    return zmq_setsockopt(sock, option, value, len);
}

/* The ZAP handler of the node's context: bound before the router, whose first client it answers. */
static int bind_zap(fs_node *n)
{
    int zero = 0;
    n->guard->zap = zmq_socket(n->zmq_context, ZMQ_REP);
    return n->guard->zap && set_option(n->guard->zap, ZMQ_LINGER, &zero, sizeof zero) == 0 &&
            zmq_bind(n->guard->zap, ZAP_ENDPOINT) == 0
        ? 0
        : -1;
}

static int make_curve_server(fs_node *n)
{
    struct fsn_guard *g = n->guard;
    int one = 1;
    int rc = set_option(n->router, ZMQ_CURVE_SERVER, &one, sizeof one) == 0 &&
            set_option(n->router, ZMQ_CURVE_PUBLICKEY, g->node.public_key, FSN_CURVE_KEY_LEN) == 0 &&
            set_option(n->router, ZMQ_CURVE_SECRETKEY, g->node.secret_key, FSN_CURVE_KEY_LEN) == 0 &&
            set_option(n->router, ZMQ_ZAP_DOMAIN, ZAP_DOMAIN, strlen(ZAP_DOMAIN)) == 0
        ? 0
        : -1;
    explicit_bzero(g->node.secret_key, sizeof g->node.secret_key); /* the socket holds its own copy */
    return rc;
}

static int watch_handshakes(fs_node *n)
{
    int zero = 0;
    if (zmq_socket_monitor(n->router, MONITOR_ENDPOINT, HANDSHAKE_FAILED) != 0)
        return -1;
    n->guard->monitor = zmq_socket(n->zmq_context, ZMQ_PAIR);
    return n->guard->monitor && set_option(n->guard->monitor, ZMQ_LINGER, &zero, sizeof zero) == 0 &&
            zmq_connect(n->guard->monitor, MONITOR_ENDPOINT) == 0
        ? 0
        : -1;
}

int fsn_guard_arm(fs_node *n)
{
    return bind_zap(n) == 0 && make_curve_server(n) == 0 && watch_handshakes(n) == 0 ? 0 : -1;
}

/* -- refusals ---------------------------------------------------------------------------------- */

static void refuse(fs_node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(fs_node *n, const char *fmt, ...)
{
    if (++n->guard->refused > 1)
        return;
    char who[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(who, sizeof who, fmt, ap);
    va_end(ap);
    fprintf(stderr, "flowstat-node %s: refused a control client %s; further refusals are counted, not logged\n",
            n->node_id, who);
}

/* A frame as text for a message: at most size - 1 bytes, anything unprintable as '?'. */
static const char *frame_text(zmq_msg_t *frame, char *out, size_t size)
{
    size_t len = zmq_msg_size(frame) < size - 1 ? zmq_msg_size(frame) : size - 1;
    const unsigned char *data = zmq_msg_data(frame);
    for (size_t i = 0; i < len; i++)
        out[i] = data[i] >= 0x20 && data[i] < 0x7f ? (char)data[i] : '?';
    out[len] = '\0';
    return len ? out : "?";
}

static int frame_is(zmq_msg_t *frame, const char *text)
{
    size_t len = strlen(text);
    return zmq_msg_size(frame) == len && memcmp(zmq_msg_data(frame), text, len) == 0;
}

/* RFC 27's request: version, request id, domain, address, identity, mechanism, then the
 * mechanism's credentials (CURVE: the client's 32-byte public key). */
static int zap_allows(const struct fsn_guard *g, struct fsn_message *m)
{
    return !m->too_long && m->count >= 7 && frame_is(&m->frames[2], ZAP_DOMAIN) && frame_is(&m->frames[5], "CURVE") &&
        zmq_msg_size(&m->frames[6]) == sizeof g->client &&
        memcmp(zmq_msg_data(&m->frames[6]), g->client, sizeof g->client) == 0;
}

static int send_frame(void *zap, const void *data, size_t len, int more)
{
    return zmq_send(zap, data, len, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) < 0 ? -1 : 0;
}

static int send_text(void *zap, const char *text, int more)
{
    return send_frame(zap, text, strlen(text), more);
}

/* RFC 27's reply: version, request id, status code and text, user id, metadata. One that cannot
 * go leaves that client's handshake unanswered: it is refused by its own time-out. */
static void send_zap_reply(void *zap, struct fsn_message *m, int ok)
{
    zmq_msg_t *id = m->count > 1 ? &m->frames[1] : NULL;
    int sent = send_text(zap, "1.0", 1) == 0 &&
        send_frame(zap, id ? zmq_msg_data(id) : "", id ? zmq_msg_size(id) : 0, 1) == 0 &&
        send_text(zap, ok ? "200" : "400", 1) == 0 && send_text(zap, ok ? "OK" : "not the run's client key", 1) == 0 &&
        send_text(zap, ok ? "monitor" : "", 1) == 0 && send_text(zap, "", 0) == 0;
    (void)sent;
}

static void answer_zap(fs_node *n, struct fsn_message *m)
{
    char address[64];
    int ok = zap_allows(n->guard, m);
    send_zap_reply(n->guard->zap, m, ok);
    if (!ok)
        refuse(n, "from %s without the run's client key",
               m->count > 3 ? frame_text(&m->frames[3], address, sizeof address) : "?");
}

/* A monitor event: a 6-byte frame (the event, 16 bits, then a 32-bit value), then the endpoint. */
static void tell_handshake(fs_node *n, struct fsn_message *m)
{
    char endpoint[128];
    uint16_t event;
    if (m->count < 2 || zmq_msg_size(&m->frames[0]) < sizeof event)
        return;
    memcpy(&event, zmq_msg_data(&m->frames[0]), sizeof event);
    if (event & HANDSHAKE_FAILED)
        refuse(n, "on %s whose handshake failed (no CURVE, or another run's key)",
               frame_text(&m->frames[1], endpoint, sizeof endpoint));
}

void fsn_guard_serve(fs_node *n)
{
    struct fsn_message m;
    for (int k = 0; k < MESSAGES_PER_TURN && fsn_message_receive(n->guard->zap, &m) == 0; k++) {
        answer_zap(n, &m);
        fsn_message_close(&m);
    }
    for (int k = 0; k < MESSAGES_PER_TURN && fsn_message_receive(n->guard->monitor, &m) == 0; k++) {
        tell_handshake(n, &m);
        fsn_message_close(&m);
    }
}

void fsn_guard_close(fs_node *n)
{
    struct fsn_guard *g = n->guard;
    if (!g)
        return;
    if (g->zap)
        zmq_close(g->zap);
    if (g->monitor)
        zmq_close(g->monitor);
    if (g->refused > 1)
        fprintf(stderr, "flowstat-node %s: %llu control clients refused in all (no key of the run)\n", n->node_id,
                (unsigned long long)g->refused);
    explicit_bzero(g, sizeof *g);
    free(g);
    n->guard = NULL;
}
