/* node-bench: what libflowstat-node costs a node (benchmarks/bench_node_c.py).
 *
 *   node-bench send ENDPOINT RATE SECONDS SIZE
 *       connects a PUSH socket and sends RATE messages of SIZE bytes a second, paced every
 *       millisecond, each stamped with its send time (a double, first 8 bytes), then an empty one.
 *   node-bench receive ENDPOINT plain|monitored|accounted
 *       binds a PULL socket and takes messages until the empty one; monitored, it opens a node
 *       (its control endpoint on the first line of stdout) and tells it of each message
 *       (fs_node_received, fs_node_latencies, once per read cycle); accounted, it also tells it
 *       when it waits (fs_node_waiting before each cycle's blocking receive: the time accounting's
 *       two phase changes a cycle, idle then busy); plain, it makes no library call.
 *       Last line: the count of messages and of read cycles.
 *   node-bench calls BATCHES [accounted]
 *       the library's calls alone, as the monitored (accounted) receiver makes them for BATCHES
 *       cycles of 256 objects: the CPU nanoseconds they take per object.
 *   node-bench calls BATCHES each|each-source
 *       fs_node_received once per object (each), or fs_node_received_from with a source's handle
 *       (each-source: a PULL fed by several nodes counting each edge): CPU ns per call.
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

/* Read cycles: wait for a message, then take what else is queued, up to 256; the node (monitored)
 * is told once per cycle, as a node that cares for its CPU would tell it. */
static int receive_all(void *sock, fs_node *node, int accounted)
{
    static char buf[256][128];
    double stamps[256];
    unsigned long long count = 0, cycles = 0;
    for (int ended = 0; !ended; cycles++) {
        size_t taken = 0, bytes = 0;
        if (accounted)
            fs_node_waiting(node); /* idle until the next message: the blocking receive below */
        for (int flags = 0; taken < 256; flags = ZMQ_DONTWAIT) {
            int len = zmq_recv(sock, buf[taken], sizeof buf[taken], flags);
            if (len < 0 && errno == EINTR)
                continue;
            if (len < 0 && errno == EAGAIN)
                break;
            if (len < 0) {
                fprintf(stderr, "receive: %s\n", zmq_strerror(errno));
                return 1;
            }
            if (len == 0) {
                ended = 1;
                break;
            }
            memcpy(&stamps[taken], buf[taken], sizeof stamps[taken]);
            bytes += (size_t)len;
            taken++;
        }
        count += taken;
        if (node && taken) {
            fs_node_received(node, taken, bytes);
            fs_node_latencies(node, stamps, taken);
        }
    }
    printf("%llu %llu\n", count, cycles);
    return 0;
}

static int receive(void *ctx, const char *endpoint, int monitored, int accounted)
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
    int rc = receive_all(sock, node, accounted);
    fs_node_close(node);
    zmq_close(sock);
    return rc;
}

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One call per object, with a source's handle or without: CPU ns per call. */
static int time_each_call(fs_node *node, long batches, int by_source)
{
    int source = by_source ? fs_node_source(node, "sender-0") : -1;
    double start = thread_cpu();
    for (long b = 0; b < batches; b++)
        for (int i = 0; i < 256; i++) {
            if (by_source)
                fs_node_received_from(node, source, 1, 64);
            else
                fs_node_received(node, 1, 64);
        }
    printf("%.3f\n", (thread_cpu() - start) / ((double)batches * 256) * 1e9);
    fs_node_close(node);
    return 0;
}

static int time_calls(long batches, const char *how)
{
    int accounted = strcmp(how, "accounted") == 0;
    struct fs_node_options o = FS_NODE_OPTIONS_INIT;
    char why[256];
    o.node_id = "bench-calls";
    fs_node *node = fs_node_open(&o, why, sizeof why);
    if (!node) {
        fprintf(stderr, "fs_node_open: %s\n", why);
        return 1;
    }
    if (strncmp(how, "each", 4) == 0)
        return time_each_call(node, batches, strcmp(how, "each-source") == 0);
    double stamps[256], start = thread_cpu();
    for (long b = 0; b < batches; b++) {
        double sent = wall_now() - 1e-4; /* waits of 100 us and up, 10 us apart: as at 100,000/s */
        for (int i = 0; i < 256; i++)
            stamps[i] = sent - i * 1e-5;
        if (accounted)
            fs_node_waiting(node);
        fs_node_received(node, 256, 256 * 64);
        fs_node_latencies(node, stamps, 256);
    }
    double fill = thread_cpu();
    for (long b = 0; b < batches; b++) { /* the same stamps made without the calls, to take them out */
        double sent = wall_now() - 1e-4;
        for (int i = 0; i < 256; i++)
            stamps[i] = sent - i * 1e-5;
        __asm__ volatile("" : : "r"(stamps) : "memory");
    }
    double end = thread_cpu();
    printf("%.3f\n", ((fill - start) - (end - fill)) / ((double)batches * 256) * 1e9);
    fs_node_close(node);
    return 0;
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
    } else if ((argc == 3 || argc == 4) && strcmp(argv[1], "calls") == 0) {
        rc = time_calls(atol(argv[2]), argc == 4 ? argv[3] : "");
    } else if (argc == 4 && strcmp(argv[1], "receive") == 0) {
        int accounted = strcmp(argv[3], "accounted") == 0;
        rc = receive(ctx, argv[2], accounted || strcmp(argv[3], "monitored") == 0, accounted);
    } else {
        fprintf(stderr,
                "usage: node-bench send ENDPOINT RATE SECONDS SIZE | receive ENDPOINT plain|monitored|accounted "
                "| calls N [accounted|each|each-source]\n");
    }
    zmq_ctx_term(ctx);
    return rc;
}
