/* The agent's command line (flowstat-agent --help) and its config files (--config, config.h): read
 * into a struct options, each value checked as it is read by its option's checks, and refused with
 * a message naming the option, or the file, line and key it was given at. */
#ifndef FLOWSTAT_OPTIONS_H
#define FLOWSTAT_OPTIONS_H

#include <limits.h>
#include <stddef.h>
#include <stdio.h>

#include "config.h"
#include "targets.h"

#define OPTIONS_NAME_MAX_LEN 160 /* --name, in agent_name after "flowstat-agent-c/" */
#define OPTIONS_RUN_ID_MAX_LEN 127 /* --run-id, as a target's run_id holds */
#define OPTIONS_HOST_NAME_MAX_LEN 255 /* --host-name, as a host name may be */
/* The bounds of some durations (seconds), as the Python agent's and the config schema's. */
#define OPTIONS_INTERVAL_MAX_S 3600.0 /* --interval */
#define OPTIONS_SELF_INTERVAL_MAX_S 86400.0 /* --self-interval */
#define OPTIONS_SINK_TIMEOUT_MAX_S 3600.0 /* --sink-timeout */
#define OPTIONS_NODE_BACKOFF_MAX_S 86400.0 /* --node-backoff */
#define OPTIONS_TOP_MAX 100000 /* --top, as the config schema's bound */
#define OPTIONS_REFUSED 2 /* options_parse's answer to a command line it refuses: the agent's exit status */

struct options {
    struct target_spec spec; /* --pid, --pidfile, --pattern, --user, --cgroup, --unit, --top, --top-by,
                                --endpoints, --endpoints-dir, --allow-remote-control; --run-id ("": none);
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
    int version; /* --version came: the caller says the version and stops */
    int print_config; /* --print-config: the caller prints the settings (options_print_config) and stops */
    int test; /* --test: the caller prints the settings, samples the targets once, and stops */
    const char *config_file, *config_dir; /* --config FILE, --config-dir DIR; NULL: none */
    struct config_files config; /* what those files said: options point into it */
    struct config_settings settings; /* each config key's values in force, as --print-config shows them */
    char place[PATH_MAX + 160]; /* "FILE:LINE: KEY" while a file's value is taken: its messages start so */
};

/* --encode FORMAT, the agent's other use: only as its sole option. */
enum encode_format { ENCODE_NONE, ENCODE_LINE, ENCODE_JSON };
enum encode_format options_encode_format(int argc, char **argv);

/* 0, or OPTIONS_REFUSED once a message on stderr said why. The schema's defaults are taken first,
 * then the config files' values (--config, --config-dir: a scalar replaces an earlier file's, a
 * list adds up), then the command line's (a scalar replaces the files' value, a list given there
 * replaces the files' list). Its lists point into argv and o->config. Parsing stops at --help and
 * --version. Call options_free after it, whatever it answered. */
int options_parse(int argc, char **argv, struct options *o);
/* The settings in force as one JSON object on a line (--print-config): 0, or -1 if out failed. */
int options_print_config(const struct options *o, FILE *out);
void options_free(struct options *o);
void options_usage(FILE *out);

#endif
