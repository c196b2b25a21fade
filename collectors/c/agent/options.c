/* The agent's command line: its options, their defaults and checks, and the --help text; the
 * config files' values taken as the options they stand for. */
#include "options.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sinks.h"
#include "spool.h"

void options_usage(FILE *out)
{
    fprintf(out,
            "usage: flowstat-agent TARGETS [options]\n"
            "Samples processes (VmRSS, CPU clock, threads from /proc) and, for nodes with a control channel,\n"
            "their own metrics; sends the samples (the sample schema, docs/schema.md) to sinks.\n\n"
            "targets (at least one, each may repeat):\n"
            "  --pid PID              a process id\n"
            "  --pidfile FILE         a file holding a process id (re-read at each rescan)\n"
            "  --pattern REGEX        processes whose command line matches (POSIX extended regex)\n"
            "  --user USER            every process of this user (a name or a uid; kernel threads left out)\n"
            "  --cgroup PATH          every process of this cgroup and of its descendants (cgroup v2: a path\n"
            "                         under its mount, /sys/fs/cgroup or /sys/fs/cgroup/unified, or an\n"
            "                         absolute one under /sys/)\n"
            "  --unit NAME            every process of this systemd unit: its cgroup, the first folder so\n"
            "                         named under the v2 mount, breadth first, at most 4 levels down\n"
            "  --top N                only the N heaviest of the processes chosen by --pattern, --user,\n"
            "                         --cgroup and --unit (without them, of every process; 0: all of them),\n"
            "                         ranked again at each rescan; one that leaves them while it runs is\n"
            "                         reported once as LEFT_TOP, then no longer watched (kernel threads are\n"
            "                         never ranked; at most 100000)\n"
            "  --top-by cpu|rss       what --top ranks by: the CPU used since the last ranking (a process\n"
            "                         seen first: since it started), or VmRSS (default cpu; ties: lower pid)\n"
            "  --endpoints FILE       a harness run's endpoints.json: its nodes and control sockets\n"
            "  --endpoints-dir DIR    the endpoints files nodes write in DIR (NODE.PID.json): each *.json\n"
            "                         not starting with '.' read as an --endpoints FILE whenever DIR\n"
            "                         changes and at each rescan;\n"
            "                         nodes of a process not running are left out (a stale file). A node\n"
            "                         gone whose file is gone too is reported STOPPED, else DOWN. The\n"
            "                         directory is shared by the host's users: a file is believed only of\n"
            "                         processes its owner owns, and only of a control endpoint on this host\n"
            "                         (ipc://, or tcp:// on 127.x.x.x, localhost or [::1]); any other node\n"
            "                         is refused, said once per version of the file\n"
            "  --allow-remote-control believe --endpoints-dir files whose control endpoint is elsewhere\n"
            "options:\n"
            "  --sink URL             where samples go (default stdout://; repeat for several, each has\n"
            "                         its own delivery thread, so a slow sink never delays sampling):\n"
            "                         stdout://[?format=json]  file:///PATH[?format=json]  udp://HOST:PORT\n"
            "                         tcp://HOST:PORT[?format=json]  http(s)://HOST:PORT/write\n"
            "                         influxdb[+https]://HOST:PORT/DB  elasticsearch[+https]://HOST:PORT/INDEX\n"
            "                         (Elasticsearch: daily indices INDEX-YYYY.MM.DD, self-samples in\n"
            "                         flowstat-agents-YYYY.MM.DD, by each document's UTC day). A URL holding a\n"
            "                         user or a password is refused: see --credentials.\n"
            "                         elasticsearch[+https]://HOST:PORT,HOST:PORT,.../INDEX: every node of a\n"
            "                         cluster; a batch a node cannot take now (no answer, 502, 503, 504)\n"
            "                         goes to the next, and that node rests --node-backoff seconds\n"
            "                         prometheus://127.0.0.1[:PORT]: /metrics served for a Prometheus to\n"
            "                         scrape (port 9464 by default): the latest sample of each node,\n"
            "                         OpenMetrics 1.0 or the text format 0.0.4; ?web_config=PATH: TLS and\n"
            "                         basic auth from an exporter-toolkit web-config.yml (tls_server_config,\n"
            "                         basic_auth_users); loopback only without both; ?families=A,B,...:\n"
            "                         only these node families, each a sample field (vmrss_kb) or its\n"
            "                         family's name (flowstat_node_resident_memory_bytes);\n"
            "                         ?drop_labels=run_id,...: node labels left out (run_id, host, role,\n"
            "                         agent; never node_id); options joined by &. At exit it keeps serving\n"
            "                         until a scrape took the final samples, at most --drain-timeout (none\n"
            "                         if it was never scraped)\n"
            "  --credentials FILE     the stores' credentials (default: $FLOWSTAT_CREDENTIALS), NAME=VALUE\n"
            "                         lines (# comments); FILE must be readable by its owner only (chmod 600).\n"
            "                         Names, also read from the environment, which wins over the file:\n"
            "                         FLOWSTAT_INFLUX_USER, FLOWSTAT_INFLUX_PASSWORD or FLOWSTAT_INFLUX_TOKEN\n"
            "                         (influxdb:// and http(s)://), FLOWSTAT_ES_USER, FLOWSTAT_ES_PASSWORD or\n"
            "                         FLOWSTAT_ES_API_KEY (elasticsearch://); for https, the CA that signed the\n"
            "                         store's certificate: FLOWSTAT_INFLUX_CA_FILE, FLOWSTAT_ES_CA_FILE, or\n"
            "                         FLOWSTAT_CA_FILE for both (default: the system's CAs). A store that\n"
            "                         answers 401 or 403, or whose certificate is not trusted, keeps the\n"
            "                         samples as one that is down: spooled, resent once it works\n"
            "                         (docs/security.md)\n"
            "  --curve-client-key FILE\n"
            "                         the key pair (a ZeroMQ certificate: public-key and secret-key) to ask\n"
            "                         the nodes whose control channel takes CURVE clients only with (their\n"
            "                         endpoints entry gives curve_server_key; docs/control-protocol.md).\n"
            "                         Default: keys/client.key_secret in the folder of the --endpoints FILE\n"
            "                         (a run's RUN_DIR/keys), or inside the --endpoints-dir DIR. Such a node\n"
            "                         without a readable key is sampled from /proc only (said once)\n"
            "  --interval S           seconds between samples (default 1, min 0.01, max 3600)\n"
            "  --rescan S             seconds between target searches (default 5)\n"
            "  --self-interval S      seconds between the agent's self-samples (measurement flowstat_agent:\n"
            "                         rounds, samples, sink errors, spool depth...; the agent schema), after\n"
            "                         a round, and one at exit (default 5; 0: none; max 86400)\n"
            "  --control-timeout S    control reply time-out (default 0.25)\n"
            "  --sink-timeout S       time-out of a request to an HTTP sink (http, influxdb, elasticsearch;\n"
            "                         each node's, for a list of nodes) (default 5, max 3600)\n"
            "  --node-backoff S       how long a node of an elasticsearch:// list that failed is left alone\n"
            "                         before it is asked again (default 30, max 86400)\n"
            "  --spool-dir DIR        keep batches here while a sink is down (default: none); each sink's\n"
            "                         folder in it has a file sink-url naming the sink\n"
            "  --spool-max-mb MB      spool bound per sink, and bound of its queue in memory (default 64):\n"
            "                         past it the oldest batch is dropped and counted\n"
            "  --send-max-kb KB       batches waiting in the spool (a sink that fell behind) go together,\n"
            "                         up to KB kibibytes a request; a larger batch goes alone (default\n"
            "                         1024; 1 to 1048576)\n"
            "  --run-id ID            run id to put in samples (default: from --endpoints; at most 127\n"
            "                         characters)\n"
            "  --name NAME            instance name, appended to the agent tag (at most 160 characters)\n"
            "  --host-name NAME       this host's name in samples, and the host whose nodes an endpoints\n"
            "                         file gives this agent (default: $SLURMD_NODENAME in a Slurm job\n"
            "                         step, hosts of a cluster often sharing one hostname; else the\n"
            "                         hostname)\n"
            "  --duration S           stop after S seconds\n"
            "  --count N              stop after N sampling rounds (rounds skipped by an overrun do not count)\n"
            "  --exit-when-all-down   stop once every target has exited\n"
            "  --drain-timeout S      at exit, keep resending what is spooled for a sink that is down,\n"
            "                         up to S seconds (default 5); what is still queued for a slow sink\n"
            "                         gets S (at least 5) seconds, then is spooled; a prometheus:// sink\n"
            "                         that was scraped is served until a scrape took the final samples,\n"
            "                         up to S seconds\n"
            "  --stats FILE           write delivery statistics (JSON) here at exit\n"
            "  --quiet                log warnings and errors only\n"
            "  --encode line|json     read JSON samples (one a line) on stdin, write them encoded on stdout\n"
            "                         (a run file's self-sample lines, {\"flowstat_agent\": {...}}, too)\n"
            "config files (the settings of both agents: src/flowstat/schema/agent-config.schema.json):\n"
            "  --config FILE          read settings from FILE, then from every *.toml of --config-dir in\n"
            "                         name order: TOML key = value lines, each key an option above (its\n"
            "                         long name with _ for -), a repeatable option's value an array\n"
            "                         (sink = [\"stdout://\", \"udp://127.0.0.1:8094\"]); ${NAME} in a string\n"
            "                         is the environment variable NAME ($${ a literal ${). A later file's\n"
            "                         value replaces an earlier one, lists add up; an option given here\n"
            "                         wins (a repeatable one replaces the files' whole list). Without it\n"
            "                         no file is read\n"
            "  --config-dir DIR       the drop-in files' folder (default: agent.d beside FILE, if any)\n"
            "  --print-config         print the settings in force (the files', the options', the\n"
            "                         defaults) as one JSON object, and exit\n"
            "  --test                 print them so, sample the targets once and print those samples\n"
            "                         (line protocol) on stdout, and exit: no sink is used\n"
            "  --version              print the agent's version, and exit\n"
            "  --help                 this text\n"
            "signals: SIGTERM, SIGINT stop (one last round, then delivery); SIGUSR1 is the run-ending notice:\n"
            "  a node that exits after it is reported once as STOPPED (it ended with its run) instead of DOWN.\n"
            "  SIGHUP reloads the config files (the command line's options still win): targets no longer\n"
            "  named are dropped, new ones taken, sinks removed are stopped (what they hold delivered or\n"
            "  spooled), new ones opened, the timings changed; each node's seq goes on. A configuration\n"
            "  that is wrong is said and changes nothing.\n"
            "  Each watched process takes 2 open files (/proc/PID/stat, statm; a node's control channel 2\n"
            "  more): past the open files limit (RLIMIT_NOFILE, LimitNOFILE=) the processes left out are said\n"
            "  at each rescan, and those watched still sampled.\n");
}

static int refuse(const struct options *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A value refused: -1, once fs_refuse said, for a config file's value, its place ("FILE:LINE: KEY: "),
 * then why. */
static int refuse(const struct options *o, const char *fmt, ...)
{
    char why[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    fs_refuse("%s%s%s", o->place, o->place[0] ? ": " : "", why);
    return -1;
}

/* A number of `unit` (seconds, megabytes) >= lo, finite, and <= hi. */
static int parse_number(const struct options *o, const char *arg, const char *name, const char *unit, double lo,
                        double hi, double *out)
{
    char *end = NULL;
    double v = strtod(arg, &end);
    if (!*arg || *end || !isfinite(v) || v < lo)
        return refuse(o, "%s: expected %s >= %g, got '%s'", name, unit, lo, arg);
    if (v > hi)
        return refuse(o, "%s: expected %s <= %g, got '%s'", name, unit, hi, arg);
    *out = v;
    return 0;
}

static int parse_seconds(const struct options *o, const char *arg, const char *name, double lo, double hi, double *out)
{
    return parse_number(o, arg, name, "seconds", lo, hi, out);
}

static int take_text(const struct options *o, const char *arg, const char *name, size_t max, const char **out)
{
    if (strlen(arg) > max)
        return refuse(o, "%s: longer than the limit of %zu characters", name, max);
    *out = arg;
    return 0;
}

/* Every list gets `entries` entries, the arguments of the command line and the config files'
 * values: each of its options takes at least one of them, so no list can overflow, and none has a
 * limit of its own. */
static int allocate_lists(size_t entries, struct options *o)
{
    size_t n = entries + 1; /* + the default sink */
    o->spec.pids = calloc(n, sizeof *o->spec.pids);
    o->spec.pidfiles = calloc(n, sizeof *o->spec.pidfiles);
    o->spec.patterns = calloc(n, sizeof *o->spec.patterns);
    o->spec.endpoints = calloc(n, sizeof *o->spec.endpoints);
    o->spec.endpoint_dirs = calloc(n, sizeof *o->spec.endpoint_dirs);
    o->spec.endpoint_dirs_mtime_ns = calloc(n, sizeof *o->spec.endpoint_dirs_mtime_ns);
    o->spec.users = calloc(n, sizeof *o->spec.users);
    o->spec.cgroups = calloc(n, sizeof *o->spec.cgroups);
    o->spec.units = calloc(n, sizeof *o->spec.units);
    o->sinks = calloc(n, sizeof *o->sinks);
    if (o->spec.pids && o->spec.pidfiles && o->spec.patterns && o->spec.endpoints && o->spec.endpoint_dirs &&
        o->spec.endpoint_dirs_mtime_ns && o->spec.users && o->spec.cgroups && o->spec.units && o->sinks)
        return 0;
    fs_refuse("out of memory");
    return -1;
}

void options_free(struct options *o)
{
    for (size_t i = 0; i < o->spec.npatterns; i++)
        regfree(&o->spec.patterns[i]);
    free(o->spec.pids);
    free(o->spec.pidfiles);
    free(o->spec.patterns);
    free(o->spec.endpoints);
    free(o->spec.endpoint_dirs);
    free(o->spec.endpoint_dirs_mtime_ns);
    free(o->spec.users);
    free(o->spec.cgroups);
    free(o->spec.units);
    free(o->sinks);
    config_files_free(&o->config);
    config_settings_free(&o->settings);
}

static int add_pattern(struct options *o, const char *arg)
{
    regex_t *re = &o->spec.patterns[o->spec.npatterns];
    int rc = regcomp(re, arg, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char msg[128];
        regerror(rc, re, msg, sizeof msg);
        regfree(re);
        return refuse(o, "--pattern '%s': %s", arg, msg);
    }
    o->spec.npatterns++;
    return 0;
}

/* The same URL twice would be one spool folder (and one file) for two delivery threads. A URL
 * holding a password is refused before any message could repeat it (sink_parse_url); one that is
 * no sink's, as it is read, so that a config file's is refused naming its place. */
static int add_sink(struct options *o, const char *url)
{
    char err[900];
    struct sink parsed;
    if (sink_parse_url(url, &parsed, err, sizeof err) != 0)
        return refuse(o, "%s", err);
    for (size_t i = 0; i < o->nsinks; i++)
        if (strcmp(o->sinks[i], url) == 0)
            return refuse(o, "--sink %s: given twice", url);
    o->sinks[o->nsinks++] = url;
    return 0;
}

static int add_pid(struct options *o, const char *arg)
{
    char *end;
    long pid = strtol(arg, &end, 10);
    if (*end || pid < 1 || pid > INT_MAX)
        return refuse(o, "--pid: bad process id '%s'", arg);
    o->spec.pids[o->spec.npids++] = (pid_t)pid;
    return 0;
}

/* --top N: an integer 0 (all) to OPTIONS_TOP_MAX. */
static int parse_top(const struct options *o, const char *arg, long *out)
{
    char *end;
    long long v = strtoll(arg, &end, 10);
    if (!*arg || *end || v < 0 || v > OPTIONS_TOP_MAX)
        return refuse(o, "--top: expected an integer between 0 and %d, got '%s'", OPTIONS_TOP_MAX, arg);
    *out = (long)v;
    return 0;
}

static int parse_count(const struct options *o, const char *arg, long long *out)
{
    char *end;
    *out = strtoll(arg, &end, 10);
    if (!*arg || *end || *out < 0)
        return refuse(o, "--count: expected a number, got '%s'", arg);
    return 0;
}

/* A bound past what a long long holds is no bound. */
static int parse_megabytes(const struct options *o, const char *arg, long long *bytes)
{
    double v;
    if (parse_number(o, arg, "--spool-max-mb", "megabytes", 0.001, INFINITY, &v) != 0)
        return -1;
    v *= 1024 * 1024;
    *bytes = v < (double)LLONG_MAX ? (long long)v : LLONG_MAX;
    return 0;
}

/* KB kibibytes, lo <= KB <= hi, in bytes. */
static int parse_kibibytes(const struct options *o, const char *arg, const char *name, double lo, double hi,
                           long long *bytes)
{
    char *end = NULL;
    double v = strtod(arg, &end);
    if (!*arg || *end || !(v >= lo && v <= hi))
        return refuse(o, "%s: expected kibibytes between %.0f and %.0f, got '%s'", name, lo, hi, arg);
    *bytes = (long long)(v * 1024);
    return 0;
}

/* The defaults the config schema has are taken from it too, after these (take_schema_defaults). */
static void set_defaults(struct options *o)
{
    o->spec.run_id = "";
    o->interval = 1.0;
    o->rescan = 5.0;
    o->control_timeout = 0.25;
    o->duration = -1;
    o->count = -1;
    o->drain_timeout = 5.0;
    o->self_interval = 5.0;
    o->sink_timeout = SINK_TIMEOUT_S;
    o->node_backoff = SINK_NODE_BACKOFF_S;
    o->spool_max = 64LL << 20;
    o->send_max = SPOOL_SEND_MAX_BYTES;
    o->name = "";
}

enum option_code {
    O_PID = 1,
    O_PIDFILE,
    O_PATTERN,
    O_ENDPOINTS,
    O_ENDPOINTS_DIR,
    O_SINK,
    O_INTERVAL,
    O_RESCAN,
    O_CTIMEOUT,
    O_SPOOL,
    O_SPOOLMAX,
    O_SENDMAX,
    O_RUNID,
    O_NAME,
    O_DURATION,
    O_COUNT,
    O_EXITDOWN,
    O_DRAIN,
    O_STATS,
    O_QUIET,
    O_HELP,
    O_SELF,
    O_CREDENTIALS,
    O_HOST_NAME,
    O_CURVE_CLIENT_KEY,
    O_SINK_TIMEOUT,
    O_NODE_BACKOFF,
    O_CONFIG,
    O_CONFIG_DIR,
    O_PRINT_CONFIG,
    O_TEST,
    O_VERSION,
    O_USER,
    O_CGROUP,
    O_UNIT,
    O_TOP,
    O_TOP_BY,
    O_ALLOW_REMOTE
};

static const struct option long_options[] = {{"pid", 1, 0, O_PID},
                                             {"pidfile", 1, 0, O_PIDFILE},
                                             {"pattern", 1, 0, O_PATTERN},
                                             {"endpoints", 1, 0, O_ENDPOINTS},
                                             {"endpoints-dir", 1, 0, O_ENDPOINTS_DIR},
                                             {"sink", 1, 0, O_SINK},
                                             {"interval", 1, 0, O_INTERVAL},
                                             {"rescan", 1, 0, O_RESCAN},
                                             {"control-timeout", 1, 0, O_CTIMEOUT},
                                             {"spool-dir", 1, 0, O_SPOOL},
                                             {"spool-max-mb", 1, 0, O_SPOOLMAX},
                                             {"send-max-kb", 1, 0, O_SENDMAX},
                                             {"run-id", 1, 0, O_RUNID},
                                             {"name", 1, 0, O_NAME},
                                             {"duration", 1, 0, O_DURATION},
                                             {"count", 1, 0, O_COUNT},
                                             {"exit-when-all-down", 0, 0, O_EXITDOWN},
                                             {"drain-timeout", 1, 0, O_DRAIN},
                                             {"stats", 1, 0, O_STATS},
                                             {"quiet", 0, 0, O_QUIET},
                                             {"help", 0, 0, O_HELP},
                                             {"self-interval", 1, 0, O_SELF},
                                             {"credentials", 1, 0, O_CREDENTIALS},
                                             {"host-name", 1, 0, O_HOST_NAME},
                                             {"curve-client-key", 1, 0, O_CURVE_CLIENT_KEY},
                                             {"sink-timeout", 1, 0, O_SINK_TIMEOUT},
                                             {"node-backoff", 1, 0, O_NODE_BACKOFF},
                                             {"config", 1, 0, O_CONFIG},
                                             {"config-dir", 1, 0, O_CONFIG_DIR},
                                             {"print-config", 0, 0, O_PRINT_CONFIG},
                                             {"test", 0, 0, O_TEST},
                                             {"version", 0, 0, O_VERSION},
                                             {"user", 1, 0, O_USER},
                                             {"cgroup", 1, 0, O_CGROUP},
                                             {"unit", 1, 0, O_UNIT},
                                             {"top", 1, 0, O_TOP},
                                             {"top-by", 1, 0, O_TOP_BY},
                                             {"allow-remote-control", 0, 0, O_ALLOW_REMOTE},
                                             {0, 0, 0, 0}};

/* One option of the command line, with its argument (NULL if it takes none): 0, or -1 once a
 * message said why it is refused. */
static int take_option(struct options *o, int code, const char *arg)
{
    switch (code) {
    case O_PID:
        return add_pid(o, arg);
    case O_PIDFILE:
        o->spec.pidfiles[o->spec.npidfiles++] = arg;
        return 0;
    case O_PATTERN:
        return add_pattern(o, arg);
    case O_ENDPOINTS:
        o->spec.endpoints[o->spec.nendpoints++] = arg;
        return 0;
    case O_ENDPOINTS_DIR:
        o->spec.endpoint_dirs[o->spec.nendpoint_dirs++] = arg;
        return 0;
    case O_USER:
        o->spec.users[o->spec.nusers++] = arg;
        return 0;
    case O_CGROUP:
        o->spec.cgroups[o->spec.ncgroups++] = arg;
        return 0;
    case O_UNIT:
        o->spec.units[o->spec.nunits++] = arg;
        return 0;
    case O_TOP:
        return parse_top(o, arg, &o->spec.top);
    case O_TOP_BY: /* one of the schema's values (take_value checked it) */
        o->spec.top_by_rss = strcmp(arg, "rss") == 0;
        return 0;
    case O_ALLOW_REMOTE:
        o->spec.allow_remote_control = 1;
        return 0;
    case O_SINK:
        return add_sink(o, arg);
    case O_INTERVAL:
        return parse_seconds(o, arg, "--interval", 0.01, OPTIONS_INTERVAL_MAX_S, &o->interval);
    case O_RESCAN:
        return parse_seconds(o, arg, "--rescan", 0.01, INFINITY, &o->rescan);
    case O_CTIMEOUT:
        return parse_seconds(o, arg, "--control-timeout", 0.001, INFINITY, &o->control_timeout);
    case O_SPOOL:
        o->spool_dir = arg;
        return 0;
    case O_SPOOLMAX:
        return parse_megabytes(o, arg, &o->spool_max);
    case O_SENDMAX:
        return parse_kibibytes(o, arg, "--send-max-kb", 1, 1024 * 1024, &o->send_max);
    case O_RUNID:
        return take_text(o, arg, "--run-id", OPTIONS_RUN_ID_MAX_LEN, &o->spec.run_id);
    case O_NAME:
        return take_text(o, arg, "--name", OPTIONS_NAME_MAX_LEN, &o->name);
    case O_DURATION:
        return parse_seconds(o, arg, "--duration", 0, INFINITY, &o->duration);
    case O_COUNT:
        return parse_count(o, arg, &o->count);
    case O_EXITDOWN:
        o->exit_when_all_down = 1;
        return 0;
    case O_DRAIN:
        return parse_seconds(o, arg, "--drain-timeout", 0, INFINITY, &o->drain_timeout);
    case O_SELF:
        return parse_seconds(o, arg, "--self-interval", 0, OPTIONS_SELF_INTERVAL_MAX_S, &o->self_interval);
    case O_STATS:
        o->stats_path = arg;
        return 0;
    case O_CREDENTIALS:
        o->credentials = arg;
        return 0;
    case O_HOST_NAME:
        return take_text(o, arg, "--host-name", OPTIONS_HOST_NAME_MAX_LEN, &o->host_name);
    case O_CURVE_CLIENT_KEY:
        return take_text(o, arg, "--curve-client-key", PATH_MAX - 1, &o->spec.curve_client_key);
    case O_SINK_TIMEOUT:
        return parse_seconds(o, arg, "--sink-timeout", 0.001, OPTIONS_SINK_TIMEOUT_MAX_S, &o->sink_timeout);
    case O_NODE_BACKOFF:
        return parse_seconds(o, arg, "--node-backoff", 0, OPTIONS_NODE_BACKOFF_MAX_S, &o->node_backoff);
    case O_QUIET:
        o->quiet = 1;
        return 0;
    case O_HELP:
        o->help = 1;
        return 0;
    case O_VERSION:
        o->version = 1;
        return 0;
    case O_CONFIG:
        o->config_file = arg;
        return 0;
    case O_CONFIG_DIR:
        o->config_dir = arg;
        return 0;
    case O_PRINT_CONFIG:
        o->print_config = 1;
        return 0;
    case O_TEST:
        o->test = 1;
        return 0;
    default: /* getopt_long said what it did not know, or what lacks its argument */
        options_usage(stderr);
        return -1;
    }
}

static int check_targets(const struct options *o)
{
    const struct target_spec *t = &o->spec;
    if (t->npids || t->npidfiles || t->npatterns || t->nendpoints || t->nendpoint_dirs || t->nusers || t->ncgroups ||
        t->nunits || t->top)
        return 0;
    fs_refuse("give at least one target: --pid, --pidfile, --pattern, --user, --cgroup, --unit, --top, --endpoints "
              "or --endpoints-dir");
    return -1;
}

/* -- the config files' values ------------------------------------------------------------------ */

/* Undoes what an option did: empties a list that the command line gives again (the config files'
 * own), unsets a flag that a later file sets false. */
static void clear_option(struct options *o, int code)
{
    switch (code) {
    case O_PID:
        o->spec.npids = 0;
        break;
    case O_PIDFILE:
        o->spec.npidfiles = 0;
        break;
    case O_PATTERN:
        while (o->spec.npatterns)
            regfree(&o->spec.patterns[--o->spec.npatterns]);
        break;
    case O_ENDPOINTS:
        o->spec.nendpoints = 0;
        break;
    case O_ENDPOINTS_DIR:
        memset(o->spec.endpoint_dirs_mtime_ns, 0, o->spec.nendpoint_dirs * sizeof *o->spec.endpoint_dirs_mtime_ns);
        o->spec.nendpoint_dirs = 0;
        break;
    case O_USER:
        o->spec.nusers = 0;
        break;
    case O_CGROUP:
        o->spec.ncgroups = 0;
        break;
    case O_UNIT:
        o->spec.nunits = 0;
        break;
    case O_ALLOW_REMOTE:
        o->spec.allow_remote_control = 0;
        break;
    case O_SINK:
        o->nsinks = 0;
        break;
    case O_QUIET:
        o->quiet = 0;
        break;
    case O_EXITDOWN:
        o->exit_when_all_down = 0;
        break;
    default:
        break;
    }
}

/* The long option a config key stands for ("--interval"), or NULL if the agent has none. */
static const struct option *key_option(int key)
{
    const char *flag = fs_config_keys[key].flag;
    for (const struct option *lo = long_options; lo->name && strncmp(flag, "--", 2) == 0; lo++)
        if (strcmp(lo->name, flag + 2) == 0)
            return lo;
    return NULL;
}

/* The config key an option stands for, or -1. */
static int option_key(int code)
{
    for (int k = 0; k < FS_NCONFIG_KEYS; k++) {
        const struct option *lo = key_option(k);
        if (lo && lo->val == code)
            return k;
    }
    return -1;
}

/* A value of a key whose values the schema lists (its enum): one of them. */
static int check_value(const struct options *o, int key, const char *value)
{
    const struct fs_config_key *k = &fs_config_keys[key];
    for (const char *const *v = k->values; v && *v; v++)
        if (strcmp(*v, value) == 0)
            return 0;
    return k->values ? refuse(o, "%s: expected one of %s, got '%s'", k->flag, k->values_text, value) : 0;
}

/* A config key's value, as its option would be given it: checked and taken by take_option, and
 * noted in the settings in force. A boolean's option takes no value: true gives it, false undoes it. */
static int take_setting(struct options *o, int key, const char *value)
{
    const struct fs_config_key *k = &fs_config_keys[key];
    const struct option *lo = key_option(key);
    int flag = k->type == FS_CT_BOOLEAN && !k->list;
    if (!lo || (lo->has_arg == no_argument) != flag)
        return refuse(o, "%s is not an option of this agent that takes %s", k->flag, flag ? "no value" : "a value");
    int rc = check_value(o, key, value);
    if (rc == 0 && !flag)
        rc = take_option(o, lo->val, value);
    else if (rc == 0 && strcmp(value, "true") == 0)
        rc = take_option(o, lo->val, NULL);
    else if (rc == 0)
        clear_option(o, lo->val);
    if (rc == 0 && config_settings_put(&o->settings, key, value) != 0)
        return refuse(o, "out of memory");
    return rc;
}

/* The schema's defaults, as their options would be given them: what --print-config shows is what
 * the agent uses. */
static int take_schema_defaults(struct options *o)
{
    int rc = 0;
    for (int k = 0; k < FS_NCONFIG_KEYS && rc == 0; k++) {
        if (!fs_config_keys[k].default_value)
            continue;
        snprintf(o->place, sizeof o->place, "agent-config.schema.json: the default of %s", fs_config_keys[k].name);
        rc = take_setting(o, k, fs_config_keys[k].default_value);
    }
    o->place[0] = '\0';
    return rc;
}

/* The files' values in their order: a later scalar replaces an earlier one, lists add up. */
static int take_config(struct options *o)
{
    int rc = 0;
    for (size_t i = 0; i < o->config.n && rc == 0; i++) {
        const struct config_item *it = &o->config.items[i];
        snprintf(o->place, sizeof o->place, "%s:%d: %s", it->path, it->line, fs_config_keys[it->key].name);
        rc = take_setting(o, it->key, it->value);
    }
    o->place[0] = '\0';
    return rc;
}

/* The command line's options, after the files': a scalar replaces their value, a list given here
 * replaces their list (emptied as its option first comes). */
static int take_command_line(struct options *o, const int *codes, char *const *args, size_t n)
{
    unsigned char replaced[FS_NCONFIG_KEYS] = {0};
    for (size_t i = 0; i < n; i++) {
        int key = option_key(codes[i]);
        if (key >= 0 && fs_config_keys[key].list && !replaced[key]) {
            replaced[key] = 1;
            clear_option(o, codes[i]);
            config_settings_clear(&o->settings, key);
        }
        if ((key >= 0 && args[i] && check_value(o, key, args[i]) != 0) || take_option(o, codes[i], args[i]) != 0)
            return -1;
        if (key >= 0 && config_settings_put(&o->settings, key, args[i] ? args[i] : "true") != 0)
            return refuse(o, "out of memory");
    }
    return 0;
}

/* What to do (--help, --version, --config...) is taken as it comes; the settings are kept in
 * codes[]/args[] (*n of them), to be taken after the files'. */
static int read_command_line(int argc, char **argv, struct options *o, int *codes, char **args, size_t *n)
{
    int code;
    while ((code = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
        int now = code == O_HELP || code == O_VERSION || code == O_CONFIG || code == O_CONFIG_DIR ||
            code == O_PRINT_CONFIG || code == O_TEST || code == '?' || code == ':';
        if (!now) {
            codes[*n] = code;
            args[(*n)++] = optarg;
        } else if (take_option(o, code, optarg) != 0) {
            return -1;
        }
        if (o->help || o->version)
            return 0;
    }
    if (optind < argc) {
        fs_refuse("unexpected argument '%s'", argv[optind]);
        return -1;
    }
    return 0;
}

/* The schema's defaults, the files', the command line's settings, in that order. */
static int take_settings(int argc, struct options *o, const int *codes, char *const *args, size_t n)
{
    if ((o->config_file || o->config_dir) && config_read(o->config_file, o->config_dir, &o->config) != 0)
        return -1;
    if (allocate_lists((size_t)argc + o->config.n, o) != 0)
        return -1;
    if (take_schema_defaults(o) != 0 || take_config(o) != 0 || take_command_line(o, codes, args, n) != 0)
        return -1;
    if ((!o->print_config || o->test) && check_targets(o) != 0)
        return -1;
    if (!o->nsinks)
        o->sinks[o->nsinks++] = "stdout://";
    return 0;
}

int options_parse(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    optind = 0; /* glibc's getopt starts over: a reload parses the command line again */
    set_defaults(o);
    int *codes = calloc((size_t)argc + 1, sizeof *codes);
    char **args = calloc((size_t)argc + 1, sizeof *args);
    size_t n = 0;
    int rc = codes && args ? 0 : -1;
    if (rc != 0)
        fs_refuse("out of memory");
    if (rc == 0)
        rc = read_command_line(argc, argv, o, codes, args, &n);
    if (rc == 0 && !o->help && !o->version)
        rc = take_settings(argc, o, codes, args, n);
    free(codes);
    free(args);
    return rc == 0 ? 0 : OPTIONS_REFUSED;
}

int options_print_config(const struct options *o, FILE *out)
{
    struct fs_buf json = {0};
    config_settings_json(&o->settings, &json);
    int ok = !json.failed && fwrite(json.data, 1, json.len, out) == json.len && fflush(out) == 0;
    fs_buf_free(&json);
    return ok ? 0 : -1;
}

enum encode_format options_encode_format(int argc, char **argv)
{
    if (argc != 3 || strcmp(argv[1], "--encode") != 0)
        return ENCODE_NONE;
    if (strcmp(argv[2], "line") == 0)
        return ENCODE_LINE;
    return strcmp(argv[2], "json") == 0 ? ENCODE_JSON : ENCODE_NONE;
}
