/* node-bench: what libflowstat-node costs a node (benchmarks/bench_node_c.py).
 *
 *   node-bench send ENDPOINT RATE SECONDS SIZE
 *       connects a PUSH socket and sends RATE messages of SIZE bytes a second, paced every
 *       millisecond, each stamped with its send time (a double, first 8 bytes), then an empty one.
 *   node-bench receive ENDPOINT plain|monitored
 *       binds a PULL socket and takes messages until the empty one; monitored, it opens a node
 *       (its control endpoint on the first line of stdout) and tells it of each message
 *       (fs_node_received, fs_node_latency); plain, it makes no library call. Last line: the count.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "flowstat/node.h"

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void next_tick(struct timespec *t, long ns)
{
    t->tv_nsec += ns;
    while (t->tv_nsec >= 1000000000L) {
        t->tv_nsec -= 1000000000L;
        t->tv_sec++;
    }
}

static int send_paced(void *sock, long rate, double seconds, size_t size)
{
    char *msg = calloc(1, size);
    if (!msg)
        return 1;
    struct timespec tick;
    clock_gettime(CLOCK_MONOTONIC, &tick);
    long ticks = (long)(seconds * 1000), sent = 0;
    for (long t = 1; t <= ticks; t++) {
        long due = rate * t / 1000;
        for (; sent < due; sent++) {
            double stamp = wall_now();
            memcpy(msg, &stamp, sizeof stamp);
            if (zmq_send(sock, msg, size, 0) < 0) {
                fprintf(stderr, "send: %s\n", zmq_strerror(errno));
                free(msg);
                return 1;
            }
        }
        next_tick(&tick, 1000000L);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &tick, NULL) == EINTR)
            ;
    }
    zmq_send(sock, "", 0, 0);
    free(msg);
    printf("%ld\n", sent);
    return 0;
}

static int receive_all(void *sock, fs_node *node)
{
    char buf[4096];
    unsigned long long count = 0;
    for (;;) {
        int len = zmq_recv(sock, buf, sizeof buf, 0);
        if (len < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "receive: %s\n", zmq_strerror(errno));
            return 1;
        }
        if (len == 0)
            break;
        count++;
        if (node) {
            double stamp;
            memcpy(&stamp, buf, sizeof stamp);
            fs_node_received(node, 1, (uint64_t)len);
            fs_node_latency(node, stamp);
        }
    }
    printf("%llu\n", count);
    return 0;
}

static int receive(void *ctx, const char *endpoint, int monitored)
{
    void *sock = zmq_socket(ctx, ZMQ_PULL);
    int hwm = 100000;
    if (!sock || zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 || zmq_bind(sock, endpoint) != 0) {
        fprintf(stderr, "bind %s: %s\n", endpoint, zmq_strerror(errno));
        return 1;
    }
    fs_node *node = NULL;
    if (monitored) {
        struct fs_node_options o = FS_NODE_OPTIONS_INIT;
        char why[256];
        o.node_id = "bench-receiver";
        o.role = "viewer";
        o.receive_buffer_size = hwm;
        node = fs_node_open(&o, why, sizeof why);
        if (!node) {
            fprintf(stderr, "fs_node_open: %s\n", why);
            return 1;
        }
    }
    printf("%s\n", fs_node_endpoint(node) ? fs_node_endpoint(node) : "plain");
    fflush(stdout);
    int rc = receive_all(sock, node);
    fs_node_close(node);
    zmq_close(sock);
    return rc;
}

int main(int argc, char **argv)
{
    void *ctx = zmq_ctx_new();
    int rc = 2;
    if (argc == 6 && strcmp(argv[1], "send") == 0) {
        void *sock = zmq_socket(ctx, ZMQ_PUSH);
        int hwm = 100000;
        zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
        rc =
            zmq_connect(sock, argv[2]) == 0 ? send_paced(sock, atol(argv[3]), atof(argv[4]), (size_t)atol(argv[5])) : 1;
        zmq_close(sock);
    } else if (argc == 4 && strcmp(argv[1], "receive") == 0) {
        rc = receive(ctx, argv[2], strcmp(argv[3], "monitored") == 0);
    } else {
        fprintf(stderr, "usage: node-bench send ENDPOINT RATE SECONDS SIZE | receive ENDPOINT plain|monitored\n");
    }
    zmq_ctx_term(ctx);
    return rc;
}
