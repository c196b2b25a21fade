/* What the agent watches: PIDs, pid files, command-line patterns, a harness run's endpoints.json. */
#ifndef FLOWSTAT_TARGETS_H
#define FLOWSTAT_TARGETS_H

#include <regex.h>
#include <stddef.h>
#include <sys/types.h>

#include "procread.h"

/* Longer than the sample schema's role pattern allows (32): a longer role, cut to this, is still
 * refused (recorded as the default role), never taken as a shorter one. */
#define TARGET_ROLE_MAX 63

struct target {
    pid_t pid;
    char node_id[128];
    char role[TARGET_ROLE_MAX + 1];
    char run_id[128];
    char control[256]; /* control endpoint, or "" */
    struct proc_reader reader;
    struct proc_reading prev;
    double prev_t;
    long long seq;
};

struct target_spec {
    pid_t *pids;
    size_t npids;
    const char **pidfiles;
    size_t npidfiles;
    regex_t *patterns;
    size_t npatterns;
    const char **endpoints;
    size_t nendpoints;
    const char *run_id;
};

typedef void (*target_found_fn)(void *ctx, const struct target *candidate);

/* Call fn for every target the spec describes now. Problems are logged, never fatal. Explicit
 * PIDs are looked at only when first is set: a PID cannot become another process we were asked for. */
void targets_discover(const struct target_spec *spec, int first, target_found_fn fn, void *ctx);
/* Parse an endpoints.json document; returns the number of nodes found, -1 if malformed. */
int targets_parse_endpoints(const char *text, size_t len, const char *run_id, target_found_fn fn, void *ctx);

#endif
