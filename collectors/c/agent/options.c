/* The agent's command line: its options, their defaults and checks, and the --help text. */
#include "options.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
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
            "  --endpoints FILE       a harness run's endpoints.json: its nodes and control sockets\n"
            "  --endpoints-dir DIR    the endpoints files nodes write in DIR (NODE.PID.json): each *.json\n"
            "                         not starting with '.' read as an --endpoints FILE whenever DIR\n"
            "                         changes and at each rescan;\n"
            "                         nodes of a process not running are left out (a stale file). A node\n"
            "                         gone whose file is gone too is reported STOPPED, else DOWN\n"
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
            "  --interval S           seconds between samples (default 1, min 0.01)\n"
            "  --rescan S             seconds between target searches (default 5)\n"
            "  --self-interval S      seconds between the agent's self-samples (measurement flowstat_agent:\n"
            "                         rounds, samples, sink errors, spool depth...; the agent schema), after\n"
            "                         a round, and one at exit (default 5; 0: none)\n"
            "  --control-timeout S    control reply time-out (default 0.25)\n"
            "  --sink-timeout S       time-out of a request to an HTTP sink (http, influxdb, elasticsearch;\n"
            "                         each node's, for a list of nodes) (default 5)\n"
            "  --node-backoff S       how long a node of an elasticsearch:// list that failed is left alone\n"
            "                         before it is asked again (default 30)\n"
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
            "                         gets S (at least 5) seconds, then is spooled\n"
            "  --stats FILE           write delivery statistics (JSON) here at exit\n"
            "  --quiet                log warnings and errors only\n"
            "  --encode line|json     read JSON samples (one a line) on stdin, write them encoded on stdout\n"
            "                         (a run file's self-sample lines, {\"flowstat_agent\": {...}}, too)\n"
            "  --help                 this text\n"
            "signals: SIGTERM, SIGINT stop (one last round, then delivery); SIGUSR1 is the run-ending notice:\n"
            "  a node that exits after it is reported once as STOPPED (it ended with its run) instead of DOWN.\n");
}

/* A number of `unit` (seconds, megabytes) >= lo, finite. */
static int parse_number(const char *arg, const char *name, const char *unit, double lo, double *out)
{
    char *end = NULL;
    double v = strtod(arg, &end);
    if (!*arg || *end || !isfinite(v) || v < lo) {
        fprintf(stderr, "flowstat-agent: %s: expected %s >= %g, got '%s'\n", name, unit, lo, arg);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_seconds(const char *arg, const char *name, double lo, double *out)
{
    return parse_number(arg, name, "seconds", lo, out);
}

static int take_text(const char *arg, const char *name, size_t max, const char **out)
{
    if (strlen(arg) > max) {
        fprintf(stderr, "flowstat-agent: %s: longer than the limit of %zu characters\n", name, max);
        return -1;
    }
    *out = arg;
    return 0;
}

/* Every list gets argc entries: each of its options takes at least one argument of the command
 * line, so no list can overflow, and none has a limit of its own. */
static int allocate_lists(int argc, struct options *o)
{
    size_t n = (size_t)argc + 1; /* + the default sink */
    o->spec.pids = calloc(n, sizeof *o->spec.pids);
    o->spec.pidfiles = calloc(n, sizeof *o->spec.pidfiles);
    o->spec.patterns = calloc(n, sizeof *o->spec.patterns);
    o->spec.endpoints = calloc(n, sizeof *o->spec.endpoints);
    o->spec.endpoint_dirs = calloc(n, sizeof *o->spec.endpoint_dirs);
    o->spec.endpoint_dirs_mtime_ns = calloc(n, sizeof *o->spec.endpoint_dirs_mtime_ns);
    o->sinks = calloc(n, sizeof *o->sinks);
    if (o->spec.pids && o->spec.pidfiles && o->spec.patterns && o->spec.endpoints && o->spec.endpoint_dirs &&
        o->spec.endpoint_dirs_mtime_ns && o->sinks)
        return 0;
    fprintf(stderr, "flowstat-agent: out of memory\n");
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
    free(o->sinks);
}

static int add_pattern(struct options *o, const char *arg)
{
    regex_t *re = &o->spec.patterns[o->spec.npatterns];
    int rc = regcomp(re, arg, REG_EXTENDED | REG_NOSUB);
    if (rc != 0) {
        char msg[128];
        regerror(rc, re, msg, sizeof msg);
        regfree(re);
        fprintf(stderr, "flowstat-agent: --pattern '%s': %s\n", arg, msg);
        return -1;
    }
    o->spec.npatterns++;
    return 0;
}

/* The same URL twice would be one spool folder (and one file) for two delivery threads. A URL
 * holding a password is refused before any message could repeat it. */
static int add_sink(struct options *o, const char *url)
{
    char err[900];
    if (sink_check_userinfo(url, err, sizeof err) != 0) {
        fprintf(stderr, "flowstat-agent: %s\n", err);
        return -1;
    }
    for (size_t i = 0; i < o->nsinks; i++)
        if (strcmp(o->sinks[i], url) == 0) {
            fprintf(stderr, "flowstat-agent: --sink %s: given twice\n", url);
            return -1;
        }
    o->sinks[o->nsinks++] = url;
    return 0;
}

static int add_pid(struct options *o, const char *arg)
{
    char *end;
    long pid = strtol(arg, &end, 10);
    if (*end || pid < 1 || pid > INT_MAX) {
        fprintf(stderr, "flowstat-agent: --pid: bad process id '%s'\n", arg);
        return -1;
    }
    o->spec.pids[o->spec.npids++] = (pid_t)pid;
    return 0;
}

static int parse_count(const char *arg, long long *out)
{
    char *end;
    *out = strtoll(arg, &end, 10);
    if (!*arg || *end || *out < 0) {
        fprintf(stderr, "flowstat-agent: --count: expected a number, got '%s'\n", arg);
        return -1;
    }
    return 0;
}

/* A bound past what a long long holds is no bound. */
static int parse_megabytes(const char *arg, long long *bytes)
{
    double v;
    if (parse_number(arg, "--spool-max-mb", "megabytes", 0.001, &v) != 0)
        return -1;
    v *= 1024 * 1024;
    *bytes = v < (double)LLONG_MAX ? (long long)v : LLONG_MAX;
    return 0;
}

/* KB kibibytes, lo <= KB <= hi, in bytes. */
static int parse_kibibytes(const char *arg, const char *name, double lo, double hi, long long *bytes)
{
    char *end = NULL;
    double v = strtod(arg, &end);
    if (!*arg || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "flowstat-agent: %s: expected kibibytes between %.0f and %.0f, got '%s'\n", name, lo, hi, arg);
        return -1;
    }
    *bytes = (long long)(v * 1024);
    return 0;
}

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
    O_NODE_BACKOFF
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
    case O_SINK:
        return add_sink(o, arg);
    case O_INTERVAL:
        return parse_seconds(arg, "--interval", 0.01, &o->interval);
    case O_RESCAN:
        return parse_seconds(arg, "--rescan", 0.01, &o->rescan);
    case O_CTIMEOUT:
        return parse_seconds(arg, "--control-timeout", 0.001, &o->control_timeout);
    case O_SPOOL:
        o->spool_dir = arg;
        return 0;
    case O_SPOOLMAX:
        return parse_megabytes(arg, &o->spool_max);
    case O_SENDMAX:
        return parse_kibibytes(arg, "--send-max-kb", 1, 1024 * 1024, &o->send_max);
    case O_RUNID:
        return take_text(arg, "--run-id", OPTIONS_RUN_ID_MAX_LEN, &o->spec.run_id);
    case O_NAME:
        return take_text(arg, "--name", OPTIONS_NAME_MAX_LEN, &o->name);
    case O_DURATION:
        return parse_seconds(arg, "--duration", 0, &o->duration);
    case O_COUNT:
        return parse_count(arg, &o->count);
    case O_EXITDOWN:
        o->exit_when_all_down = 1;
        return 0;
    case O_DRAIN:
        return parse_seconds(arg, "--drain-timeout", 0, &o->drain_timeout);
    case O_SELF:
        return parse_seconds(arg, "--self-interval", 0, &o->self_interval);
    case O_STATS:
        o->stats_path = arg;
        return 0;
    case O_CREDENTIALS:
        o->credentials = arg;
        return 0;
    case O_HOST_NAME:
        return take_text(arg, "--host-name", OPTIONS_HOST_NAME_MAX_LEN, &o->host_name);
    case O_CURVE_CLIENT_KEY:
        return take_text(arg, "--curve-client-key", PATH_MAX - 1, &o->spec.curve_client_key);
    case O_SINK_TIMEOUT:
        return parse_seconds(arg, "--sink-timeout", 0.001, &o->sink_timeout);
    case O_NODE_BACKOFF:
        return parse_seconds(arg, "--node-backoff", 0, &o->node_backoff);
    case O_QUIET:
        o->quiet = 1;
        return 0;
    case O_HELP:
        o->help = 1;
        return 0;
    default: /* getopt_long said what it did not know, or what lacks its argument */
        options_usage(stderr);
        return -1;
    }
}

static int check_targets(const struct options *o)
{
    if (o->spec.npids || o->spec.npidfiles || o->spec.npatterns || o->spec.nendpoints || o->spec.nendpoint_dirs)
        return 0;
    fprintf(stderr,
            "flowstat-agent: give at least one target: --pid, --pidfile, --pattern, --endpoints or --endpoints-dir\n");
    return -1;
}

int options_parse(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    if (allocate_lists(argc, o) != 0)
        return OPTIONS_REFUSED;
    set_defaults(o);
    int code;
    while ((code = getopt_long(argc, argv, "", long_options, NULL)) != -1) {
        if (take_option(o, code, optarg) != 0)
            return OPTIONS_REFUSED;
        if (o->help)
            return 0;
    }
    if (optind < argc) {
        fprintf(stderr, "flowstat-agent: unexpected argument '%s'\n", argv[optind]);
        return OPTIONS_REFUSED;
    }
    if (check_targets(o) != 0)
        return OPTIONS_REFUSED;
    if (!o->nsinks)
        o->sinks[o->nsinks++] = "stdout://";
    return 0;
}

enum encode_format options_encode_format(int argc, char **argv)
{
    if (argc != 3 || strcmp(argv[1], "--encode") != 0)
        return ENCODE_NONE;
    if (strcmp(argv[2], "line") == 0)
        return ENCODE_LINE;
    return strcmp(argv[2], "json") == 0 ? ENCODE_JSON : ENCODE_NONE;
}
