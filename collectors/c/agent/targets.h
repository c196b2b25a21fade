/* What the agent watches: PIDs, pid files, command-line patterns, a harness run's endpoints.json,
 * the endpoints files nodes write in a directory; and processes as a farm chooses them (as the
 * Python agent's flowstat.agent.selection): every process of a user, of a cgroup (v2, with its
 * descendants) or of a systemd unit (its cgroup), and the N heaviest of those chosen (--top). */
#ifndef FLOWSTAT_TARGETS_H
#define FLOWSTAT_TARGETS_H

#include <limits.h>
#include <regex.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "node_curve.h"
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
    char curve_server_key[FSN_CURVE_KEY_LEN + 1]; /* the node's CURVE public key (Z85): its channel takes
                                                     CURVE clients only; "": in the clear */
    char curve_client_key[PATH_MAX]; /* the key file to ask it with (when curve_server_key) */
    struct fsn_curve_keys curve_client; /* that file's pair, once read (the agent's; wiped when dropped) */
    char announced_by[PATH_MAX]; /* the file of an --endpoints-dir it was found in, or "" */
    struct proc_reader reader;
    struct proc_reading prev;
    double prev_t;
    size_t seq_slot; /* the agent's: where its node's seq is counted (it goes on when the node is found again) */
    int top; /* chosen by --top: no longer watched (reported LEFT_TOP) once a ranking leaves it out */
    int chosen; /* found by --pattern, --user, --cgroup or --unit: found again by its pid alone */
    int leaving; /* the agent's: left the top N at the last rescan, reported LEFT_TOP at the next round */
    unsigned long long seen; /* the agent's: the search that last found it */
    char role_checked[TARGET_ROLE_MAX + 1]; /* the agent's: the role last checked against the schema, */
    int role_allowed; /* and whether it may be recorded */
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
    const char **endpoint_dirs; /* --endpoints-dir: every DIR/NAME.json, at each search */
    size_t nendpoint_dirs;
    long long *endpoint_dirs_mtime_ns; /* each directory's last modification seen (targets_dirs_changed) */
    const char *run_id;
    const char *curve_client_key; /* --curve-client-key; NULL: keys/client.key_secret of each file's folder */
    const char **users; /* --user: names or uids */
    size_t nusers;
    const char **cgroups; /* --cgroup: paths under the v2 mount, or absolute (/sys/...) */
    size_t ncgroups;
    const char **units; /* --unit: systemd units' names */
    size_t nunits;
    long top; /* --top N: only the N heaviest of the processes chosen; 0: all of them */
    int top_by_rss; /* --top-by rss; else cpu */
    int allow_remote_control; /* --allow-remote-control: an --endpoints-dir file's control endpoint may be elsewhere */
};

/* How deep under the cgroup v2 mount a unit's cgroup is looked for (selection.UNIT_DEPTH). */
#define TARGET_UNIT_DEPTH 4

/* --top's memory between two rankings: each process ranked the last time (by pid), with the CPU it
 * had used then, so that the next one ranks by the CPU used since. */
struct rank_entry {
    pid_t pid;
    unsigned long long start, ticks; /* /proc/PID/stat's starttime, utime + stime */
    double at; /* fs_monotonic() */
};
struct target_ranker {
    int by_rss; /* what `last` was ranked by */
    struct rank_entry *last; /* sorted by pid */
    size_t nlast;
    /* An open /proc/PID/stat of pid to read again (the agent's reader of a target), or -1: a
     * ranking opens only the files of the processes not watched. NULL: none. */
    int (*stat_fd)(void *ctx, pid_t pid);
    void *ctx;
};
void targets_ranker_free(struct target_ranker *r);

/* What was said about the files of the endpoints directories, so that each problem of a file is
 * said once per (path, size, modification time), not at every search: a small table, its oldest
 * entry forgotten first once it is full. All zeros: nothing said yet. */
#define TARGET_NOTES_MAX 128
struct file_note {
    uint64_t path_hash;
    long long size, mtime_s, mtime_ns;
    unsigned said; /* the problems said (enum file_problem in targets.c) */
};
struct target_notes {
    struct file_note notes[TARGET_NOTES_MAX];
    size_t n, next; /* entries in use; the one to reuse when full */
};

typedef void (*target_found_fn)(void *ctx, const struct target *candidate);
/* Whether a process the choosers found is watched already, as a target they found: the caller
 * marks it found again, and its command line and name are not read again (at every search, they
 * were a twentieth of the agent's CPU at 1,000 processes watched by --pattern). */
typedef int (*target_known_fn)(void *ctx, pid_t pid);

/* Call fn for every target the spec describes now. Problems are logged, never fatal (those of the
 * endpoints directories' files, of users, cgroups and units once each, as `notes` remembers).
 * Explicit PIDs are looked at only when first is set: a PID cannot become another process we were
 * asked for. With spec->top, the processes chosen (by pattern, user, cgroup, unit; without them
 * every process) are ranked with ranker (NULL: a ranking of its own, as a first one), and only the
 * N heaviest are given, marked top. Without spec->top, a chosen process known() says is watched is
 * not given (known may be NULL: each one given, as after a reload). */
void targets_discover(const struct target_spec *spec, struct target_notes *notes, struct target_ranker *ranker,
                      int first, target_known_fn known, target_found_fn fn, void *ctx);
/* Parse an endpoints.json document: the number of nodes found, -1 if malformed. The nodes that do
 * not conform to endpoints.schema.json are left out, and counted in *left_out (if not NULL). Nodes
 * with a curve_server_key are to be asked with the key file client_key. */
int targets_parse_endpoints(const char *text, size_t len, const char *run_id, const char *client_key, int *left_out,
                            target_found_fn fn, void *ctx);

/* Whether an endpoints directory changed (a file written, renamed or removed) since the last call:
 * one stat(2) each, so a node that announces itself is taken within a round, not at the next
 * --rescan. */
int targets_dirs_changed(struct target_spec *spec);

/* The host whose nodes endpoints files give this agent (the agent's --host-name; NULL or "": the
 * default of fs_host_identity). */
void targets_set_host(const char *host);

#endif
