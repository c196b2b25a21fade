/* node-probe: a node made of libflowstat-node calls only, for tests/test_node_c.py. Options make the
 * node (--curve-keys DIR: a run's keys, a secured channel); each line on stdin is one call (or a
 * few), answered by one line on stdout:
 *
 *   received N BYTES | sent N BYTES | merged N SECONDS | refused | backlog 0|1 | waiting | sending
 *   latency COUNT AGE_S      COUNT objects stamped AGE_S seconds ago, taken now
 *   state NAME | stop? | start? | endpoint
 *   busy MS                  burn MS ms of CPU
 *   sleep MS                 sleep MS ms (the node's phase stays what the last call set)
 *   phases T MS              T threads each go round the phases for MS ms (waiting, received,
 *                            merged, sending, sent, refused, sent: one change a call), then call
 *                            waiting and end: "ok ROUNDS" (all threads')
 *   flood MS                 count as fast as it can for MS ms: "ok CALLS"
 *   threads T N              T threads each tell N times: received 1 object of 2 bytes, sent 1 of
 *                            3, one latency; then they end
 *   source ID                fs_node_source: "ok HANDLE" (-1: refused)
 *   from H N BYTES           fs_node_received_from handle H
 *   fanin T N                T threads each take N objects of 1 byte from source "up-T" (its own,
 *                            asked for by the thread) and N from the shared "up-all"
 *   close                    fs_node_close (the process goes on until stdin ends)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flowstat/node.h"

static double now(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int parse_options(int argc, char **argv, struct fs_node_options *o)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *name = argv[i], *value = argv[i + 1];
        if (strcmp(name, "--node-id") == 0)
            o->node_id = value;
        else if (strcmp(name, "--role") == 0)
            o->role = value;
        else if (strcmp(name, "--run-id") == 0)
            o->run_id = value;
        else if (strcmp(name, "--bind") == 0)
            o->bind = value;
        else if (strcmp(name, "--endpoints-dir") == 0)
            o->endpoints_dir = value;
        else if (strcmp(name, "--receive-buffer-size") == 0)
            o->receive_buffer_size = atol(value);
        else if (strcmp(name, "--send-buffer-size") == 0)
            o->send_buffer_size = atol(value);
        else if (strcmp(name, "--curve-keys") == 0)
            o->curve_keys = value;
        else if (strcmp(name, "--upstream") == 0)
            o->upstream = value;
        else
            return -1;
    }
    return argc % 2 == 1 ? 0 : -1;
}

static int state_named(const char *name)
{
    static const char *const names[] = {"STARTING", "READY", "RUNNING", "DRAINING", "STOPPED"};
    for (int s = 0; s < 5; s++)
        if (strcmp(names[s], name) == 0)
            return s;
    return -1;
}

static volatile unsigned long burnt; /* what burn() computes, kept so that it is computed */

static void burn(double ms)
{
    double end = now(CLOCK_PROCESS_CPUTIME_ID) + ms / 1e3;
    while (now(CLOCK_PROCESS_CPUTIME_ID) < end)
        for (int i = 0; i < 10000; i++)
            burnt += (unsigned long)i;
}

static unsigned long long flood(fs_node *node, double ms)
{
    double end = now(CLOCK_MONOTONIC) + ms / 1e3;
    unsigned long long calls = 0;
    while (now(CLOCK_MONOTONIC) < end) {
        for (int i = 0; i < 1000; i++) {
            fs_node_received(node, 1, 10);
            fs_node_latency(node, now(CLOCK_REALTIME));
        }
        calls += 1000;
    }
    return calls;
}

struct counting {
    fs_node *node;
    unsigned long long times;
};

static void *count_in_a_thread(void *arg)
{
    const struct counting *c = arg;
    for (unsigned long long i = 0; i < c->times; i++) {
        fs_node_received(c->node, 1, 2);
        fs_node_sent(c->node, 1, 3);
        fs_node_latency(c->node, now(CLOCK_REALTIME) - 1e-3);
    }
    return NULL;
}

static void *take_from_sources(void *arg)
{
    const struct counting *c = arg;
    char id[32];
    snprintf(id, sizeof id, "up-%llu", c->times >> 40); /* the thread's number, in the high bits */
    int own = fs_node_source(c->node, id), all = fs_node_source(c->node, "up-all");
    for (unsigned long long i = 0; i < (c->times & ((1ULL << 40) - 1)); i++) {
        fs_node_received_from(c->node, own, 1, 1);
        fs_node_received_from(c->node, all, 1, 1);
    }
    return NULL;
}

static int fan_in(fs_node *node, unsigned long long threads, unsigned long long times)
{
    pthread_t ids[64];
    struct counting each[64];
    if (threads > 64 || times >= (1ULL << 40))
        return -1;
    for (unsigned long long t = 0; t < threads; t++) {
        each[t] = (struct counting){node, (t << 40) | times};
        if (pthread_create(&ids[t], NULL, take_from_sources, &each[t]) != 0)
            return -1;
    }
    for (unsigned long long t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    return 0;
}

struct phasing {
    fs_node *node;
    double ms;
    unsigned long long rounds;
};

static void *go_round_the_phases(void *arg)
{
    struct phasing *p = arg;
    double end = now(CLOCK_MONOTONIC) + p->ms / 1e3;
    unsigned long long rounds = 0;
    while (now(CLOCK_MONOTONIC) < end) {
        for (int i = 0; i < 100; i++, rounds++) {
            fs_node_waiting(p->node);
            fs_node_received(p->node, 1, 1);
            fs_node_merged(p->node, 1, 0);
            fs_node_sending(p->node);
            fs_node_sent(p->node, 1, 1);
            fs_node_send_refused(p->node);
            fs_node_sent(p->node, 0, 0);
        }
    }
    fs_node_waiting(p->node);
    p->rounds = rounds;
    return NULL;
}

static long long phases_in_threads(fs_node *node, unsigned long long threads, double ms)
{
    pthread_t ids[64];
    struct phasing each[64];
    long long rounds = 0;
    if (threads > 64)
        return -1;
    for (unsigned long long t = 0; t < threads; t++) {
        each[t] = (struct phasing){node, ms, 0};
        if (pthread_create(&ids[t], NULL, go_round_the_phases, &each[t]) != 0)
            return -1;
    }
    for (unsigned long long t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        rounds += (long long)each[t].rounds;
    }
    return rounds;
}

static void sleep_ms(double ms)
{
    struct timespec ts = {.tv_sec = (time_t)(ms / 1e3),
                          .tv_nsec = (long)((ms - 1e3 * (double)(time_t)(ms / 1e3)) * 1e6)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static int count_in_threads(fs_node *node, unsigned long long threads, unsigned long long times)
{
    pthread_t ids[64];
    struct counting c = {node, times};
    if (threads > 64)
        return -1;
    for (unsigned long long t = 0; t < threads; t++)
        if (pthread_create(&ids[t], NULL, count_in_a_thread, &c) != 0)
            return -1;
    for (unsigned long long t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    return 0;
}

/* One command; 0, or -1 for one it does not know. */
static int run(fs_node **node, const char *line)
{
    char word[32], text[64], id[512];
    unsigned long long a = 0, b = 0;
    double x = 0;
    if (sscanf(line, "%31s", word) != 1)
        return -1;
    if (strcmp(word, "received") == 0 && sscanf(line, "%*s %llu %llu", &a, &b) == 2)
        fs_node_received(*node, a, b);
    else if (strcmp(word, "sent") == 0 && sscanf(line, "%*s %llu %llu", &a, &b) == 2)
        fs_node_sent(*node, a, b);
    else if (strcmp(word, "merged") == 0 && sscanf(line, "%*s %llu %lf", &a, &x) == 2)
        fs_node_merged(*node, a, x);
    else if (strcmp(word, "refused") == 0)
        fs_node_send_refused(*node);
    else if (strcmp(word, "waiting") == 0)
        fs_node_waiting(*node);
    else if (strcmp(word, "sending") == 0)
        fs_node_sending(*node);
    else if (strcmp(word, "sleep") == 0 && sscanf(line, "%*s %lf", &x) == 1 && x >= 0)
        sleep_ms(x);
    else if (strcmp(word, "backlog") == 0 && sscanf(line, "%*s %llu", &a) == 1)
        fs_node_input_backlog(*node, (int)a);
    else if (strcmp(word, "latency") == 0 && sscanf(line, "%*s %llu %lf", &a, &x) == 2)
        for (unsigned long long i = 0; i < a; i++)
            fs_node_latency(*node, now(CLOCK_REALTIME) - x);
    else if (strcmp(word, "state") == 0 && sscanf(line, "%*s %63s", text) == 1 && state_named(text) >= 0)
        fs_node_set_state(*node, (enum fs_node_state)state_named(text));
    else if (strcmp(word, "stop?") == 0)
        return printf("ok %d\n", fs_node_stop_requested(*node)) < 0 ? -1 : 1;
    else if (strcmp(word, "start?") == 0)
        return printf("ok %d\n", fs_node_start_requested(*node)) < 0 ? -1 : 1;
    else if (strcmp(word, "endpoint") == 0)
        return printf("ok %s\n", fs_node_endpoint(*node) ? fs_node_endpoint(*node) : "none") < 0 ? -1 : 1;
    else if (strcmp(word, "busy") == 0 && sscanf(line, "%*s %lf", &x) == 1)
        burn(x);
    else if (strcmp(word, "flood") == 0 && sscanf(line, "%*s %lf", &x) == 1)
        return printf("ok %llu\n", flood(*node, x)) < 0 ? -1 : 1;
    else if (strcmp(word, "threads") == 0 && sscanf(line, "%*s %llu %llu", &a, &b) == 2)
        return count_in_threads(*node, a, b);
    else if (strcmp(word, "source") == 0 && sscanf(line, "%*s %511s", id) == 1)
        return printf("ok %d\n", fs_node_source(*node, id)) < 0 ? -1 : 1;
    else if (strcmp(word, "from") == 0 && sscanf(line, "%*s %lf %llu %llu", &x, &a, &b) == 3)
        fs_node_received_from(*node, (int)x, a, b);
    else if (strcmp(word, "fanin") == 0 && sscanf(line, "%*s %llu %llu", &a, &b) == 2)
        return fan_in(*node, a, b);
    else if (strcmp(word, "phases") == 0 && sscanf(line, "%*s %llu %lf", &a, &x) == 2) {
        long long rounds = phases_in_threads(*node, a, x);
        return rounds < 0 ? -1 : printf("ok %lld\n", rounds) < 0 ? -1 : 1;
    } else if (strcmp(word, "close") == 0) {
        fs_node_close(*node);
        *node = NULL;
    } else
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    struct fs_node_options options = FS_NODE_OPTIONS_INIT;
    char why[256] = "", line[1024];
    if (parse_options(argc, argv, &options) != 0) {
        fprintf(stderr,
                "usage: node-probe --node-id ID [--role R] [--run-id R] [--bind A] [--endpoints-dir D] "
                "[--receive-buffer-size N] [--send-buffer-size N] [--curve-keys DIR] [--upstream IDS]\n");
        return 2;
    }
    fs_node *node = fs_node_open(&options, why, sizeof why);
    if (!node) {
        printf("invalid %s\n", why);
        return 2;
    }
    printf("endpoint %s\n", fs_node_endpoint(node) ? fs_node_endpoint(node) : "none");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        int rc = run(&node, line);
        if (rc == 0)
            printf("ok\n");
        else if (rc < 0)
            printf("unknown %s", line);
        fflush(stdout);
    }
    fs_node_close(node);
    return 0;
}
