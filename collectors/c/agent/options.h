/* The agent's command line (flowstat-agent --help): read into a struct options, each value checked
 * as it is read, and refused with a message naming the option. */
#ifndef FLOWSTAT_OPTIONS_H
#define FLOWSTAT_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

#include "targets.h"

#define OPTIONS_NAME_MAX_LEN 160 /* --name, in agent_name after "flowstat-agent-c/" */
#define OPTIONS_RUN_ID_MAX_LEN 127 /* --run-id, as a target's run_id holds */
#define OPTIONS_HOST_NAME_MAX_LEN 255 /* --host-name, as a host name may be */
#define OPTIONS_REFUSED 2 /* options_parse's answer to a command line it refuses: the agent's exit status */

struct options {
    struct target_spec spec; /* --pid, --pidfile, --pattern, --endpoints, --endpoints-dir; --run-id ("": none);
                                --curve-client-key (NULL: each run's own) */
    const char **sinks; /* --sink, in the order given; stdout:// if none */
    size_t nsinks;
    double interval, rescan, control_timeout, drain_timeout, self_interval; /* seconds */
    double sink_timeout, node_backoff; /* seconds: an HTTP sink's time-out, an Elasticsearch node's rest */
    double duration; /* seconds; -1: until stopped */
    long long count; /* -1: until stopped */
    const char *spool_dir, *stats_path, *credentials; /* NULL: none given */
    const char *name; /* "": none */
    const char *host_name; /* --host-name; NULL: $SLURMD_NODENAME, else gethostname() (fs_host_identity) */
    long long spool_max; /* bytes */
    long long send_max; /* bytes: spooled batches sent together, at most (--send-max-kb) */
    int exit_when_all_down, quiet;
    int help; /* --help came: the caller shows options_usage and stops */
};

/* --encode FORMAT, the agent's other use: only as its sole option. */
enum encode_format { ENCODE_NONE, ENCODE_LINE, ENCODE_JSON };
enum encode_format options_encode_format(int argc, char **argv);

/* 0, or OPTIONS_REFUSED once a message on stderr said why. Its lists point into argv. Parsing stops
 * at --help. Call options_free after it, whatever it answered. */
int options_parse(int argc, char **argv, struct options *o);
void options_free(struct options *o);
void options_usage(FILE *out);

#endif
