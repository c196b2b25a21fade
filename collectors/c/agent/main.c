/* flowstat-agent: samples pipeline nodes (/proc and their control channels) and ships samples.
 * The same targets, schema, sinks and spool as `flowstat agent`, for a fraction of the CPU; the
 * same self-samples (agent.schema.json) and run-ending notice (SIGUSR1). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "control.h"
#include "delivery.h"
#include "options.h"
#include "sample_json.h"
#include "targets.h"
#include "watch.h"

#ifndef FLOWSTAT_VERSION /* the Makefile's: the package's version */
#define FLOWSTAT_VERSION "unknown"
#endif

#define AGENT_NAME "flowstat-agent-c"
/* The open files kept from the targets (files_for_targets): an eighth of the limit, within these. */
#define FILES_RESERVE_MIN 16
#define FILES_RESERVE_MAX 256
#define STATE_DOWN "DOWN" /* node_state once the process is gone (one of the schema's states) */
#define STATE_STOPPED "STOPPED" /* instead, after the run-ending notice, or once its endpoints file is gone */
#define STATE_LEFT_TOP "LEFT_TOP" /* once, when it leaves the N heaviest (--top) while it still runs */

static volatile sig_atomic_t stop_flag = 0;
static volatile sig_atomic_t ending_flag = 0; /* the run-ending notice came: nodes gone now ended with their run */
static volatile sig_atomic_t reload_flag = 0; /* SIGHUP came: the loop reads the config files again */

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void on_notice(int sig)
{
    (void)sig;
    ending_flag = 1;
}

static void on_reload(int sig)
{
    (void)sig;
    reload_flag = 1;
}

struct agent {
    int argc; /* the command line, parsed again by a reload */
    char **argv;
    struct options opt;
    char host[256], agent_name[192];
    struct watch watch; /* the targets, the nodes gone, each node's seq */
    struct target_notes notes; /* what was said of the endpoints directories' files, users, cgroups */
    struct target_ranker ranker; /* --top's CPU figures between rankings */
    unsigned long long search; /* searches for targets so far: the one that found a target last (seen) */
    size_t left_out; /* processes not watched by this search: no open file left for them */
    struct control_pool control;
    struct sink_runner **sinks; /* one delivery thread each */
    size_t nsinks;
    struct sink_runner **retired; /* sinks a reload removed: stopped, joined at exit, counted still */
    size_t nretired;
    struct fs_credentials creds; /* the stores' (docs/security.md): read by the sink threads */
    long long samples_taken, proc_errors;
    long long rounds, skipped_rounds; /* a round overran its interval: the rounds it ran into are skipped */
    long long self_seq; /* self-samples emitted */
    int64_t last_self_ms; /* the time of the last one: each is given a later one */
    int64_t last_round_ms; /* the same for rounds of samples */
    /* The run its self-samples belong to, without --run-id: the one its targets' run ids (from
     * endpoints files) all name; none once two differ (targets_runs_differ). */
    char targets_run_id[128];
    int targets_runs_differ;
};

/* -- targets ----------------------------------------------------------------------------------- */

static void note_run(struct agent *a, const char *run_id)
{
    if (!run_id[0] || a->targets_runs_differ)
        return;
    if (!a->targets_run_id[0])
        fs_strlcpy(a->targets_run_id, run_id, sizeof a->targets_run_id);
    else if (strcmp(a->targets_run_id, run_id) != 0)
        a->targets_runs_differ = 1;
}

/* A node whose channel takes CURVE clients only is asked with the client pair of its run; without
 * one it is sampled from /proc only, as a node without a channel (said once: as it is taken). */
static void take_client_key(struct target *t)
{
    char why[PATH_MAX + 200];
    if (!t->control[0] || !t->curve_server_key[0] ||
        control_client_keys(t->curve_client_key, &t->curve_client, why, sizeof why) == 0)
        return;
    LOG_WARN("%s (pid %d): its control channel takes CURVE clients only and no client key could be read (%s): "
             "sampled from /proc only (give --curve-client-key)",
             t->node_id, (int)t->pid, why);
    t->control[0] = '\0';
}

/* The open files the agent may give its targets: its limit (RLIMIT_NOFILE) but a reserve for the
 * rest of it (sinks' connections, spool files, the files a search reads). */
static long long files_for_targets(long long *limit)
{
    struct rlimit rl;
    *limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (long long)rl.rlim_cur : 1LL << 30;
    long long reserve = *limit / 8;
    if (reserve < FILES_RESERVE_MIN)
        reserve = FILES_RESERVE_MIN;
    if (reserve > FILES_RESERVE_MAX)
        reserve = FILES_RESERVE_MAX;
    return *limit - reserve;
}

static int found_again(void *ctx, pid_t pid)
{
    struct agent *a = ctx;
    return watch_found_again(&a->watch, pid, a->search);
}

static void on_found(void *ctx, const struct target *cand)
{
    struct agent *a = ctx;
    struct target *known = watch_find(&a->watch, cand->pid, cand->node_id);
    if (known) {
        known->seen = a->search;
        if (known->leaving) { /* ranked back before it was reported leaving */
            known->leaving = 0;
            a->watch.leaving--;
        }
        return;
    }
    if (watch_is_gone(&a->watch, cand->node_id, cand->pid))
        return;
    long long limit;
    if (a->watch.fds + watch_fds(cand) > files_for_targets(&limit)) {
        a->left_out++;
        return;
    }
    struct target t = *cand;
    enum proc_status st = proc_reader_open(&t.reader, t.pid);
    if (st == PROC_IO_ERROR && (errno == EMFILE || errno == ENFILE))
        a->left_out++;
    if (st != PROC_OK)
        return;
    if (proc_reader_read(&t.reader, &t.prev) != PROC_OK) {
        proc_reader_close(&t.reader);
        return;
    }
    t.prev_t = fs_monotonic();
    t.seen = a->search;
    take_client_key(&t);
    struct target *added = watch_add(&a->watch, &t);
    fsn_curve_wipe(&t.curve_client); /* this copy: the target in the list keeps its own */
    if (!added) {
        proc_reader_close(&t.reader);
        LOG_ERR("%s (pid %d): out of memory: not watched", t.node_id, (int)t.pid);
        return;
    }
    note_run(a, added->run_id);
    LOG_INFO("watching %s (pid %d)", added->node_id, (int)added->pid);
}

/* Target i no longer watched: gone (reported so: not taken again), or not (it may be found again,
 * its seq going on). */
static void drop_target(struct agent *a, size_t i, int gone)
{
    struct target *t = &a->watch.targets[i];
    if (t->control[0])
        control_forget(&a->control, t->control, t->curve_server_key);
    watch_drop(&a->watch, i, gone);
}

/* The targets the configuration describes now: new ones taken. Then, with --top, one that the
 * ranking left out is marked leaving (reported LEFT_TOP at the next round, then dropped); after a
 * reload (first), one that the new configuration does not name is dropped. The processes left out
 * for want of open files are said, once a search. */
static void rescan(struct agent *a, int first, int reloading)
{
    a->search++;
    a->left_out = 0;
    targets_discover(&a->opt.spec, &a->notes, &a->ranker, first, reloading ? NULL : found_again, on_found, a);
    for (size_t i = a->watch.n; i-- > 0;) { /* from the end: a target dropped takes the last one's place */
        struct target *t = &a->watch.targets[i];
        if (t->seen == a->search || t->leaving) {
            continue;
        } else if (reloading) {
            LOG_INFO("reload: %s (pid %d) no longer watched", t->node_id, (int)t->pid);
            drop_target(a, i, 0);
        } else if (t->top && a->opt.spec.top) {
            t->leaving = 1;
            a->watch.leaving++;
        }
    }
    if (a->left_out) {
        long long limit;
        files_for_targets(&limit);
        LOG_ERR("cannot watch more processes: the open files limit (%lld, RLIMIT_NOFILE) is reached: %zu watched, "
                "%zu left out; raise LimitNOFILE (or ulimit -n): each process takes %d files, a node's control "
                "channel %d more",
                limit, a->watch.n, a->left_out, WATCH_FDS_PER_PROCESS, WATCH_FDS_PER_CONTROL);
    }
}

/* -- sampling ---------------------------------------------------------------------------------- */

/* The role a sample records: the node's, if the schema allows it, else the default. Checked once
 * per target and role, not per sample: a regular expression per sample was a twentieth of the
 * agent's CPU at 1,000 processes. */
static const char *role_of(struct target *t, const char *role)
{
    if (t->role_checked[0] && strcmp(role, t->role_checked) == 0)
        return t->role_allowed ? role : FS_DEFAULT_ROLE;
    int allowed = sample_value_allowed(FS_F_ROLE, role);
    if (strlen(role) < sizeof t->role_checked) { /* a longer one is checked each time, never mistaken */
        fs_strlcpy(t->role_checked, role, sizeof t->role_checked);
        t->role_allowed = allowed;
    }
    return allowed ? role : FS_DEFAULT_ROLE;
}

static void base_sample(struct agent *a, struct target *t, const char *stamp, int64_t ms, const char *role,
                        const char *state, struct fs_sample *s)
{
    sample_clear(s);
    s->time_ms = ms;
    sample_set_str(s, FS_F_TIME, stamp);
    sample_set_str(s, FS_F_RUN_ID, t->run_id);
    sample_set_str(s, FS_F_HOST, a->host);
    sample_set_str(s, FS_F_NODE_ID, t->node_id);
    sample_set_str(s, FS_F_ROLE, role_of(t, role));
    sample_set_str(s, FS_F_AGENT, a->agent_name);
    sample_set_int(s, FS_F_SEQ, watch_next_seq(&a->watch, t));
    sample_set_int(s, FS_F_PID, t->pid);
    sample_set_str(s, FS_F_NODE_STATE, state);
}

/* When a round's samples are taken: the wall time they carry, the monotonic time rates are taken over. */
struct round_time {
    char stamp[32];
    int64_t ms;
    double now;
};

/* Each target's control reply, asked of all the control channels at once: by_target[i] is target i's
 * (NULL: none, or no channel), to be deleted by the caller. -1 if out of memory. */
static int ask_controls(struct agent *a, cJSON **by_target)
{
    size_t n = a->watch.n, nctl = 0;
    struct control_peer *peers = calloc(n ? n : 1, sizeof *peers);
    size_t *owner = calloc(n ? n : 1, sizeof *owner);
    cJSON **replies = calloc(n ? n : 1, sizeof *replies);
    int ok = peers && owner && replies;
    for (size_t i = 0; ok && i < n; i++) {
        const struct target *t = &a->watch.targets[i];
        if (!t->control[0] || t->leaving)
            continue;
        peers[nctl] = (struct control_peer){t->control, t->curve_server_key, &t->curve_client};
        owner[nctl++] = i;
    }
    if (ok && nctl)
        control_query(&a->control, peers, nctl, replies);
    for (size_t k = 0; ok && k < nctl; k++)
        by_target[owner[k]] = replies[k];
    free(peers), free(owner), free(replies);
    return ok ? 0 : -1;
}

/* A node found in an endpoints directory removes its file when it closes cleanly, and leaves it
 * when it crashes: whether that file is gone. */
static int announcement_removed(const struct target *t)
{
    struct stat st;
    return t->announced_by[0] && lstat(t->announced_by, &st) != 0 && errno == ENOENT;
}

/* The last sample of a target whose process is gone (or unreadable): DOWN, or STOPPED after the
 * run-ending notice or when the endpoints file that announced it is gone. Reported once, then
 * dropped. A reply taken this round carries its counts: a node that closes answers its final ones
 * and may exit before /proc is read. */
static void sample_gone(struct agent *a, struct target *t, enum proc_status st, const cJSON *reply,
                        const struct round_time *when, struct fs_sample *s)
{
    if (st != PROC_GONE) {
        a->proc_errors++;
        LOG_ERR("%s (pid %d): cannot read /proc (%s)", t->node_id, (int)t->pid,
                st == PROC_BAD_FORMAT ? "unexpected format" : strerror(errno));
    }
    /* Both are looked at after the read that found the node gone: a notice sent before the node was
     * stopped has been handled by then, and a node removes its file before it exits. */
    int with_run = ending_flag, closed = !with_run && announcement_removed(t);
    const char *state = with_run || closed ? STATE_STOPPED : STATE_DOWN;
    base_sample(a, t, when->stamp, when->ms, t->role, state, s);
    if (reply) {
        control_fill_sample(reply, s);
        sample_set_str(s, FS_F_NODE_STATE, state); /* what became of the process, not what it said */
    }
    if (with_run)
        LOG_INFO("%s (pid %d) is gone (stopped with its run)", t->node_id, (int)t->pid);
    else if (closed)
        LOG_INFO("%s (pid %d) is gone (stopped: its endpoints file %s was removed)", t->node_id, (int)t->pid,
                 t->announced_by);
    else
        LOG_WARN("%s (pid %d) is gone", t->node_id, (int)t->pid);
}

/* A live target's sample: /proc's reading, and its control reply's role, state and metrics. */
static void sample_live(struct agent *a, struct target *t, const struct proc_reading *cur, const cJSON *reply,
                        const struct round_time *when, struct fs_sample *s)
{
    const cJSON *reply_role = reply ? cJSON_GetObjectItemCaseSensitive(reply, "role") : NULL;
    const char *role =
        strcmp(t->role, FS_DEFAULT_ROLE) != 0 || !cJSON_IsString(reply_role) ? t->role : reply_role->valuestring;
    const cJSON *state = reply ? cJSON_GetObjectItemCaseSensitive(reply, "node_state") : NULL;
    int state_known = cJSON_IsString(state) && sample_value_allowed(FS_F_NODE_STATE, state->valuestring);
    base_sample(a, t, when->stamp, when->ms, role, state_known ? state->valuestring : FS_DEFAULT_NODE_STATE, s);
    double total, user, sys;
    proc_cpu_rates(&t->prev, cur, when->now - t->prev_t, &total, &user, &sys);
    sample_set_int(s, FS_F_VMRSS_KB, cur->rss_kb);
    sample_set_num(s, FS_F_CPU_CLOCK_HZ, total);
    sample_set_num(s, FS_F_CPU_USER_HZ, user);
    sample_set_num(s, FS_F_CPU_SYSTEM_HZ, sys);
    sample_set_num(s, FS_F_CPU_USER_SECONDS, proc_cpu_seconds(cur->utime));
    sample_set_num(s, FS_F_CPU_SYSTEM_SECONDS, proc_cpu_seconds(cur->stime));
    sample_set_int(s, FS_F_THREADS, cur->threads);
    if (reply)
        control_fill_sample(reply, s);
    t->prev = *cur;
    t->prev_t = when->now;
}

/* One sample of the target: 1 if it is gone (its last one), 2 if it left the top N while it runs
 * (its last one too: LEFT_TOP, the base fields only, as a gone one's), else 0. */
static int sample_target(struct agent *a, struct target *t, const cJSON *reply, const struct round_time *when,
                         struct fs_sample *s)
{
    struct proc_reading cur;
    enum proc_status st = proc_reader_read(&t->reader, &cur);
    if (st != PROC_OK) {
        sample_gone(a, t, st, reply, when, s);
        return 1;
    }
    if (t->leaving) {
        base_sample(a, t, when->stamp, when->ms, t->role, STATE_LEFT_TOP, s);
        LOG_INFO("%s (pid %d) left the top %ld: no longer watched", t->node_id, (int)t->pid, a->opt.spec.top);
        return 2;
    }
    sample_live(a, t, &cur, reply, when, s);
    return 0;
}

/* What becomes of each sample as it is taken: encoded for every sink, or printed (--test). */
typedef void (*sample_taken_fn)(struct agent *a, const struct fs_sample *s, void *ctx);

/* The node's edge counters (its reply's received_from), each handed to taken() as it is made. */
static void take_edge_counts(struct agent *a, const struct fs_sample *node, const cJSON *reply, sample_taken_fn taken,
                             void *ctx)
{
    const cJSON *from = cJSON_GetObjectItemCaseSensitive(reply, "received_from");
    const cJSON *item;
    struct fs_sample edge;
    if (!cJSON_IsObject(from))
        return;
    cJSON_ArrayForEach(item, from) {
        if (control_edge_count(item, node, &edge))
            taken(a, &edge, ctx);
    }
}

/* A sample of every target, each handed to taken() as it is taken (one sample's slots, reused: a
 * round's samples kept until the end of it were 5 MB at 1,000 processes, read again to encode
 * them): how many, 0 if out of memory. */
static size_t sample_all(struct agent *a, sample_taken_fn taken, void *ctx)
{
    struct round_time when;
    fs_iso_now(when.stamp, sizeof when.stamp, &when.ms);
    /* each round a later millisecond than the last: a round woken late and the next one due right
     * after it could share one, and InfluxDB keeps one point per series and time */
    if (when.ms <= a->last_round_ms) {
        when.ms = a->last_round_ms + 1;
        fs_iso_from_ms(when.stamp, sizeof when.stamp, when.ms);
    }
    a->last_round_ms = when.ms;
    when.now = fs_monotonic();
    size_t n = a->watch.n;
    cJSON **by_target = calloc(n ? n : 1, sizeof *by_target);
    char *gone = calloc(n ? n : 1, 1); /* the targets reported gone or leaving, dropped after the loop */
    if (!by_target || !gone || ask_controls(a, by_target) != 0) {
        free(by_target), free(gone);
        return 0;
    }
    struct fs_sample s;
    for (size_t i = 0; i < n; i++) {
        gone[i] = (char)sample_target(a, &a->watch.targets[i], by_target[i], &when, &s);
        taken(a, &s, ctx);
        if (by_target[i] && gone[i] != 2) /* one that left the top N: its base fields only */
            take_edge_counts(a, &s, by_target[i], taken, ctx);
        cJSON_Delete(by_target[i]);
    }
    /* drop the targets reported gone or leaving: after the loop, and from the end (a target dropped
     * takes the last one's place, one already looked at) */
    for (size_t i = n; i-- > 0;)
        if (gone[i])
            drop_target(a, i, gone[i] == 1);
    free(by_target), free(gone);
    a->samples_taken += (long long)n;
    return n;
}

/* Every sink that ran: those in force, then those a reload removed, the latest first (a URL a reload
 * removed and another added again is one sink in the statistics: the first of it here holds its
 * spool as it is now). A malloc'd array of *n, NULL if out of memory. */
static struct sink_runner **every_sink(struct agent *a, size_t *n)
{
    struct sink_runner **all = malloc((a->nsinks + a->nretired + 1) * sizeof *all);
    *n = 0;
    for (size_t i = 0; all && i < a->nsinks; i++)
        all[(*n)++] = a->sinks[i];
    for (size_t i = a->nretired; all && i-- > 0;)
        all[(*n)++] = a->retired[i];
    return all;
}

/* After the sink threads are joined: their counters are theirs until then. */
static void write_stats(struct agent *a)
{
    FILE *f = fopen(a->opt.stats_path, "w");
    size_t n = 0, written = 0;
    struct sink_runner **all = every_sink(a, &n);
    if (!f || !all) {
        LOG_ERR("--stats %s: %s", a->opt.stats_path, f ? strerror(ENOMEM) : strerror(errno));
        if (f)
            fclose(f);
        free(all);
        return;
    }
    fprintf(f,
            "{\"samples\": %lld, \"self_samples\": %lld, \"rounds\": %lld, \"skipped_rounds\": %lld, "
            "\"targets\": %zu, \"gone\": %zu, \"control_errors\": %llu, \"proc_errors\": %lld, \"sinks\": {",
            a->samples_taken, a->self_seq, a->rounds, a->skipped_rounds, a->watch.n - a->watch.leaving, a->watch.ngone,
            a->control.errors, a->proc_errors);
    for (size_t i = 0; i < n; i++) {
        struct sink_runner *r = all[i];
        int first = 1;
        for (size_t k = 0; k < i && first; k++)
            first = strcmp(all[k]->sink.url, r->sink.url) != 0;
        if (!first)
            continue;
        long long batches = 0, spooled = 0, dropped = 0, delivered = 0, refused = 0, lost = 0, failovers = 0;
        if (r->has_spool)
            spool_figures(&r->spool, &batches, &spooled, &dropped);
        dropped = 0;
        for (size_t k = i; k < n; k++) { /* the counts of every runner the URL had */
            long long b, sp, d = 0;
            if (strcmp(all[k]->sink.url, r->sink.url) != 0)
                continue;
            if (all[k]->has_spool)
                spool_figures(&all[k]->spool, &b, &sp, &d);
            delivered += all[k]->delivered;
            refused += all[k]->refused;
            lost += runner_lost(all[k]);
            failovers += all[k]->sink.failovers;
            dropped += d;
        }
        struct fs_buf url = {0};
        fs_buf_json_string(&url, r->sink.url);
        fprintf(f,
                "%s%s: {\"delivered\": %lld, \"refused\": %lld, \"lost\": %lld, \"spooled\": %lld, "
                "\"spooled_samples\": %lld, \"spool_dropped\": %lld, \"failovers\": %lld}",
                written++ ? ", " : "", url.data ? url.data : "\"\"", delivered, refused, lost, batches, spooled,
                dropped, failovers);
        fs_buf_free(&url);
    }
    fprintf(f, "}}\n");
    fclose(f);
    free(all);
}

/* Each sink's batch is encoded here and queued for its thread: a slow sink cannot hold sampling. */
static void submit_all(struct agent *a, const struct fs_sample *samples, size_t n)
{
    for (size_t i = 0; i < a->nsinks; i++)
        runner_submit(a->sinks[i], samples, n);
}

static void encode_for_sinks(struct agent *a, const struct fs_sample *s, void *ctx)
{
    (void)ctx;
    for (size_t i = 0; i < a->nsinks; i++)
        runner_add(a->sinks[i], s);
}

/* A round: every target sampled, each sample encoded for every sink as it is taken, one batch per sink. */
static void sample_and_submit(struct agent *a)
{
    for (size_t i = 0; i < a->nsinks; i++)
        runner_begin(a->sinks[i], a->watch.n);
    sample_all(a, encode_for_sinks, NULL);
    for (size_t i = 0; i < a->nsinks; i++)
        runner_submit_built(a->sinks[i]);
}

/* -- self-samples ----------------------------------------------------------------------------- */

/* Delivery summed over the sinks, as each sink thread published its figures last: those a reload
 * removed count in what was delivered, refused, lost so far, not in what is spooled or down now. */
static struct runner_figures sinks_figures(struct agent *a)
{
    struct runner_figures sum = {0}, one;
    for (size_t i = 0; i < a->nsinks + a->nretired; i++) {
        int removed = i >= a->nsinks;
        runner_figures(removed ? a->retired[i - a->nsinks] : a->sinks[i], &one);
        sum.delivered += one.delivered;
        sum.refused += one.refused;
        sum.lost += one.lost;
        sum.send_failures += one.send_failures;
        sum.spool_dropped += one.spool_dropped;
        sum.failovers += one.failovers;
        if (removed)
            continue;
        sum.spooled_batches += one.spooled_batches;
        sum.spooled_samples += one.spooled_samples;
        sum.down += one.down;
    }
    return sum;
}

/* The agent's figures now (the agent schema): delivery summed over its sinks, as each sink thread
 * published them last. */
static void self_sample(struct agent *a, struct fs_sample *s)
{
    char stamp[32];
    int64_t ms;
    fs_iso_now(stamp, sizeof stamp, &ms);
    /* InfluxDB keeps one point per series and time: the last self-sample, taken at exit, may fall in
     * the millisecond of the one before, and would replace it. */
    if (ms <= a->last_self_ms) {
        ms = a->last_self_ms + 1;
        fs_iso_from_ms(stamp, sizeof stamp, ms);
    }
    a->last_self_ms = ms;
    struct runner_figures sum = sinks_figures(a);
    sample_clear_as(s, &FS_AGENT_SCHEMA);
    s->time_ms = ms;
    sample_set_str(s, FS_A_TIME, stamp);
    if (a->opt.spec.run_id[0])
        sample_set_str(s, FS_A_RUN_ID, a->opt.spec.run_id);
    else if (a->targets_run_id[0] && !a->targets_runs_differ)
        sample_set_str(s, FS_A_RUN_ID, a->targets_run_id);
    sample_set_str(s, FS_A_HOST, a->host);
    sample_set_str(s, FS_A_AGENT, a->agent_name);
    sample_set_int(s, FS_A_SEQ, a->self_seq++);
    sample_set_num(s, FS_A_INTERVAL_S, a->opt.interval);
    sample_set_int(s, FS_A_ROUNDS, a->rounds);
    sample_set_int(s, FS_A_SKIPPED_ROUNDS, a->skipped_rounds);
    sample_set_int(s, FS_A_SAMPLES, a->samples_taken);
    sample_set_int(s, FS_A_CONTROL_ERRORS, (long long)a->control.errors);
    sample_set_int(s, FS_A_PROC_ERRORS, a->proc_errors);
    sample_set_int(s, FS_A_DELIVERED, sum.delivered);
    sample_set_int(s, FS_A_REFUSED, sum.refused);
    sample_set_int(s, FS_A_LOST, sum.lost);
    sample_set_int(s, FS_A_SEND_FAILURES, sum.send_failures);
    sample_set_int(s, FS_A_SPOOL_DROPPED, sum.spool_dropped);
    sample_set_int(s, FS_A_TARGETS, (long long)(a->watch.n - a->watch.leaving));
    sample_set_int(s, FS_A_SPOOLED_BATCHES, sum.spooled_batches);
    sample_set_int(s, FS_A_SPOOLED_SAMPLES, sum.spooled_samples);
    sample_set_int(s, FS_A_SINKS_DOWN, sum.down);
    sample_set_int(s, FS_A_FAILOVERS, sum.failovers);
}

/* Through the same queues as the samples, behind them: spooled and resent like them. */
static void submit_self_sample(struct agent *a)
{
    struct fs_sample s;
    self_sample(a, &s);
    submit_all(a, &s, 1);
}

static void sleep_until(double deadline)
{
    double left = deadline - fs_monotonic();
    if (left <= 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double target = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + left;
    ts.tv_sec = (time_t)target;
    ts.tv_nsec = (long)((target - (double)ts.tv_sec) * 1e9);
    while (!stop_flag && !reload_flag && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* --encode: JSON samples in, encoded samples out; a bad line is reported by number and skipped. */
static int encode_stdin(int json)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int bad = 0;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        struct fs_sample s;
        char err[256];
        if (sample_from_json(line, (size_t)len, &s, err, sizeof err) != 0) {
            fprintf(stderr, "flowstat-agent: stdin line %ld: %s\n", lineno, err);
            bad = 1;
            continue;
        }
        struct fs_buf out = {0};
        if (json)
            sample_json(&s, &out);
        else
            sample_line_protocol(&s, &out);
        fwrite(out.data, 1, out.len, stdout);
        fs_buf_free(&out);
    }
    free(line);
    return bad;
}

/* One sink's delivery, opened with the settings o: NULL once err said why. */
static struct sink_runner *open_runner(struct agent *a, const struct options *o, const char *url, char *err,
                                       size_t errlen)
{
    struct sink_runner *r = calloc(1, sizeof *r);
    struct sink_waits waits = {o->sink_timeout, o->node_backoff};
    if (!r) {
        snprintf(err, errlen, "%s: out of memory", url);
        return NULL;
    }
    if (runner_open(r, url, &a->creds, o->spool_dir, o->spool_max, o->drain_timeout, &waits, err, errlen) != 0) {
        if (!err[0])
            snprintf(err, errlen, "%s", url);
        runner_close(r);
        free(r);
        return NULL;
    }
    r->send_max = r->send_limit = o->send_max;
    return r;
}

static int open_sinks(struct agent *a)
{
    a->sinks = calloc(a->opt.nsinks ? a->opt.nsinks : 1, sizeof *a->sinks);
    if (!a->sinks)
        return -1;
    for (size_t i = 0; i < a->opt.nsinks; i++) {
        char err[900];
        if (!(a->sinks[i] = open_runner(a, &a->opt, a->opt.sinks[i], err, sizeof err))) {
            fprintf(stderr, "flowstat-agent: %s\n", err);
            return -1;
        }
        a->nsinks++;
    }
    return 0;
}

/* The sink threads leave SIGINT, SIGTERM, SIGUSR1 and SIGHUP to the sampling thread, whose sleep
 * they interrupt (and so do the threads a sink's client starts). */
static int start_runner(struct sink_runner *r)
{
    sigset_t signals, before;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGUSR1);
    sigaddset(&signals, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &signals, &before);
    int rc = runner_start(r);
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    if (rc != 0)
        LOG_ERR("sink %s: cannot start its thread", r->sink.url);
    return rc;
}

static int start_sinks(struct agent *a)
{
    int rc = 0;
    for (size_t i = 0; i < a->nsinks && rc == 0; i++)
        rc = start_runner(a->sinks[i]);
    return rc;
}

/* All threads are told at once, so that their drain timeouts run side by side; then joined, with
 * those of the sinks a reload removed (told then). */
static void stop_sinks(struct agent *a)
{
    for (size_t i = 0; i < a->nsinks; i++)
        runner_stop(a->sinks[i]);
    for (size_t i = 0; i < a->nsinks; i++)
        runner_join(a->sinks[i]);
    for (size_t i = 0; i < a->nretired; i++)
        runner_join(a->retired[i]);
}

/* Lost for good: never delivered, refused or still spooled. After stop_sinks. */
static long long lost_samples(struct agent *a)
{
    long long lost = 0;
    for (size_t i = 0; i < a->nsinks + a->nretired; i++) {
        struct sink_runner *r = i < a->nsinks ? a->sinks[i] : a->retired[i - a->nsinks];
        long long batches = 0, spooled = 0, dropped = 0;
        if (r->has_spool)
            spool_figures(&r->spool, &batches, &spooled, &dropped);
        lost += runner_lost(r) + dropped;
    }
    return lost;
}

static void close_sinks(struct agent *a)
{
    for (size_t i = 0; i < a->nsinks + a->nretired; i++) {
        struct sink_runner *r = i < a->nsinks ? a->sinks[i] : a->retired[i - a->nsinks];
        runner_close(r);
        free(r);
    }
    free(a->sinks);
    free(a->retired);
    a->sinks = a->retired = NULL;
    a->nsinks = a->nretired = 0;
}

/* -- reload (SIGHUP) --------------------------------------------------------------------------- */

static struct sink_runner *sink_of(struct sink_runner **list, size_t n, const char *url)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i]->sink.url, url) == 0)
            return list[i];
    return NULL;
}

/* A sink a reload adds again after an earlier one removed it: that one has finished with its file
 * and spool folder (it was told to stop then) before the new one opens them. */
static void finish_removed(struct agent *a, const char *url)
{
    for (size_t i = 0; i < a->nretired; i++)
        if (strcmp(a->retired[i]->sink.url, url) == 0)
            runner_join(a->retired[i]);
}

/* The sinks of the new configuration o, in its order: those kept as they run (thread, queue,
 * spool, counts), new ones opened (not started). 0, or -1 once why says what is wrong, nothing
 * changed. */
static int reload_sinks(struct agent *a, const struct options *o, struct sink_runner **sinks, char *why, size_t whylen)
{
    for (size_t i = 0; i < o->nsinks; i++) {
        if ((sinks[i] = sink_of(a->sinks, a->nsinks, o->sinks[i])))
            continue;
        finish_removed(a, o->sinks[i]);
        if ((sinks[i] = open_runner(a, o, o->sinks[i], why, whylen)))
            continue;
        while (i-- > 0)
            if (!sink_of(a->sinks, a->nsinks, o->sinks[i])) {
                runner_close(sinks[i]);
                free(sinks[i]);
            }
        return -1;
    }
    return 0;
}

/* The sinks of the old configuration that the new one (sinks, n) does not name stopped (what they
 * queued is delivered, or spooled for --flush-spool), kept for the statistics; new ones started. */
static void swap_sinks(struct agent *a, struct sink_runner **sinks, size_t n)
{
    struct sink_runner **retired = realloc(a->retired, (a->nretired + a->nsinks + n + 1) * sizeof *retired);
    if (!retired) { /* out of memory: the removed sinks are stopped and closed at exit, not counted */
        LOG_ERR("reload: out of memory: the sinks removed are left out of the statistics");
    } else {
        a->retired = retired;
    }
    for (size_t i = 0; i < a->nsinks; i++) {
        struct sink_runner *r = a->sinks[i];
        if (sink_of(sinks, n, r->sink.url))
            continue;
        runner_stop(r);
        if (retired)
            a->retired[a->nretired++] = r;
        LOG_INFO("reload: sink %s removed (what it held is delivered, or stays in its spool for --flush-spool)",
                 r->sink.url);
    }
    for (size_t i = 0; i < n; i++) {
        if (sink_of(a->sinks, a->nsinks, sinks[i]->sink.url))
            continue;
        if (start_runner(sinks[i]) == 0)
            LOG_INFO("reload: sink %s added", sinks[i]->sink.url);
    }
    free(a->sinks);
    a->sinks = sinks;
    a->nsinks = n;
}

/* SIGHUP: the config files read again, the command line's options still winning, and applied in
 * place: targets the new configuration does not name are no longer watched, new ones taken at
 * once; sinks it removes are stopped, new ones opened; the timings change. A kept sink keeps its
 * delivery, spool and counts, a node its seq. A configuration that is wrong (a file, a value, no
 * target, a sink that cannot be opened) changes nothing, and is said. -1: refused; 0: applied; 1:
 * applied, with other timings (interval, rescan, self_interval). As the Python agent's
 * Agent._reload. */
static int agent_reload(struct agent *a)
{
    struct options fresh;
    char why[1400];
    fs_refusal_capture(why, sizeof why);
    int rc = options_parse(a->argc, a->argv, &fresh);
    fs_refusal_capture(NULL, 0);
    struct sink_runner **sinks = rc == 0 ? calloc(fresh.nsinks ? fresh.nsinks : 1, sizeof *sinks) : NULL;
    if (rc == 0 && !sinks)
        snprintf(why, sizeof why, "out of memory");
    if (rc != 0 || !sinks || reload_sinks(a, &fresh, sinks, why, sizeof why) != 0) {
        LOG_ERR("reload refused, the running configuration kept: %s", why[0] ? why : "the configuration is wrong");
        free(sinks);
        options_free(&fresh);
        return -1;
    }
    swap_sinks(a, sinks, fresh.nsinks);
    int timings = fresh.interval != a->opt.interval || fresh.rescan != a->opt.rescan ||
        fresh.self_interval != a->opt.self_interval;
    a->control.timeout_s = fresh.control_timeout;
    struct options old = a->opt;
    a->opt = fresh;
    options_free(&old);
    watch_forget_gone(&a->watch); /* a node the new configuration names again is taken again */
    rescan(a, 1, 1);
    LOG_INFO("reload: %zu targets, %zu sinks", a->watch.n - a->watch.leaving, a->nsinks);
    return timings;
}

static void sample_until_done(struct agent *a)
{
    double start = fs_monotonic(), next_rescan = start, every = a->opt.self_interval;
    double next_self = every > 0 ? start + every : INFINITY;
    long long tick = 0;
    int noticed = 0;
    while (!stop_flag) {
        if (reload_flag) {
            reload_flag = 0;
            int reloaded = agent_reload(a);
            double at = fs_monotonic();
            if (reloaded > 0) { /* new timings: counted from now */
                start = at - a->opt.interval;
                tick = 1;
                every = a->opt.self_interval;
                next_self = every > 0 ? at + every : INFINITY;
            }
            if (reloaded >= 0)
                next_rescan = at + a->opt.rescan;
        }
        double now = fs_monotonic();
        if (now >= next_rescan || targets_dirs_changed(&a->opt.spec)) {
            rescan(a, tick == 0, 0);
            next_rescan = now + a->opt.rescan;
        }
        if (tick > 0) {
            sample_and_submit(a);
            a->rounds++;
            double after = fs_monotonic();
            if (after >= next_self) {
                submit_self_sample(a);
                next_self += every * (1 + floor((after - next_self) / every)); /* the next one due: none to catch up */
            }
        }
        if (ending_flag && !noticed) {
            noticed = 1;
            LOG_INFO("run-ending notice: nodes that exit from now on are reported STOPPED");
        }
        if ((a->opt.count >= 0 && a->rounds >= a->opt.count) ||
            (a->opt.duration >= 0 && now - start >= a->opt.duration) ||
            (a->opt.exit_when_all_down && tick > 0 && a->watch.n == 0 && a->watch.ngone > 0))
            break;
        /* tick k is due at start + k x interval: no drift; an overrun skips to the next one due */
        long long due = (long long)floor((fs_monotonic() - start) / a->opt.interval) + 1;
        if (due > tick + 1)
            a->skipped_rounds += due - tick - 1;
        tick = due > tick + 1 ? due : tick + 1;
        sleep_until(start + (double)tick * a->opt.interval);
    }
    if (stop_flag && a->watch.n) /* stopped from outside: one last pass reports nodes that ended */
        sample_and_submit(a);
    if (every > 0)
        submit_self_sample(a); /* the last one, behind every sample */
}

/* Started by flowstat run (FLOWSTAT_DIE_WITH_PARENT holds its pid): stop when it dies. Whether it
 * died already, before the kernel was asked to tell us: then no signal will ever come. */
static int parent_already_gone(void)
{
    const char *parent = getenv("FLOWSTAT_DIE_WITH_PARENT");
    if (!parent || !*parent)
        return 0;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    return getppid() != (pid_t)atol(parent);
}

/* The host the samples name, and the agent. */
static void agent_identify(struct agent *a)
{
    fs_host_identity(a->opt.host_name, a->host, sizeof a->host);
    targets_set_host(a->host);
    snprintf(a->agent_name, sizeof a->agent_name, "%s%s%s", AGENT_NAME, a->opt.name[0] ? "/" : "", a->opt.name);
}

/* Before any sampling: the agent's name, the stores' credentials, its sinks and control sockets.
 * 0, or the exit status once a message said why not. */
static int agent_open(struct agent *a)
{
    agent_identify(a);
    char err[900];
    if (creds_load(&a->creds, a->opt.credentials, err, sizeof err) != 0) {
        fprintf(stderr, "flowstat-agent: %s\n", err);
        return OPTIONS_REFUSED;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT); /* before any thread: it is not thread-safe */
    if (open_sinks(a) != 0)
        return OPTIONS_REFUSED;
    return control_pool_init(&a->control, a->opt.control_timeout) == 0 ? 0 : 1;
}

/* Whatever agent_open got as far as, and the targets. */
static void agent_close(struct agent *a)
{
    close_sinks(a);
    creds_free(&a->creds);
    while (a->watch.n)
        drop_target(a, a->watch.n - 1, 0);
    watch_free(&a->watch);
    targets_ranker_free(&a->ranker);
    control_pool_close(&a->control);
    curl_global_cleanup(); /* nothing, if curl_global_init was not called */
}

/* $FLOWSTAT_AGENT_READY_FILE, created once the run-ending notice is handled: how flowstat run
 * learns it may send it to an agent on another host, whose signal mask it cannot read. */
static void say_notice_taken(void)
{
    const char *path = getenv("FLOWSTAT_AGENT_READY_FILE");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        LOG_WARN("cannot create the ready file %s: %s", path, strerror(errno));
    else
        close(fd);
}

static void handle_signals(void)
{
    struct sigaction sa = {.sa_handler = on_signal}, notice = {.sa_handler = on_notice};
    struct sigaction reload = {.sa_handler = on_reload};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &notice, NULL);
    sigaction(SIGHUP, &reload, NULL);
    signal(SIGPIPE, SIG_IGN);
    say_notice_taken();
}

/* Samples until told to stop or done, then delivers: 0, or 1 if samples were lost or a sink could
 * not start. */
static int agent_run(struct agent *a)
{
    handle_signals();
    if (parent_already_gone()) {
        LOG_WARN("the run that started this agent (pid %s) is gone: stopping", getenv("FLOWSTAT_DIE_WITH_PARENT"));
        stop_flag = 1;
    }
    int started = start_sinks(a) == 0;
    if (started)
        sample_until_done(a);
    stop_sinks(a);
    long long lost = lost_samples(a);
    if (a->opt.stats_path)
        write_stats(a);
    return !started ? 1 : lost ? 1 : 0;
}

static void print_line_protocol(struct agent *a, const struct fs_sample *s, void *out)
{
    (void)a;
    sample_line_protocol(s, out);
}

/* --test: the settings in force, then one round of samples of the targets, as a run's first one
 * (found, then sampled an interval later), in line protocol on stdout; no sink, no spool. 0, or 1
 * if they could not be written or the control channels not set up. */
static int agent_test(struct agent *a)
{
    agent_identify(a);
    if (options_print_config(&a->opt, stdout) != 0 || control_pool_init(&a->control, a->opt.control_timeout) != 0)
        return 1;
    double start = fs_monotonic();
    rescan(a, 1, 0);
    if (!a->watch.n)
        LOG_WARN("--test: no target found");
    sleep_until(start + a->opt.interval);
    struct fs_buf out = {0};
    sample_all(a, print_line_protocol, &out);
    int ok = !out.failed && fwrite(out.data, 1, out.len, stdout) == out.len && fflush(stdout) == 0;
    fs_buf_free(&out);
    return ok ? 0 : 1;
}

/* What the options ask for besides a run: 1 if they ask for one of those, with its exit status in *rc. */
static int answer_instead(struct agent *a, int *rc)
{
    if (a->opt.help)
        options_usage(stdout);
    else if (a->opt.version)
        *rc = printf("flowstat-agent %s\n", FLOWSTAT_VERSION) < 0 || fflush(stdout) != 0;
    else if (a->opt.print_config && !a->opt.test)
        *rc = options_print_config(&a->opt, stdout) != 0;
    else
        return 0;
    return 1;
}

int main(int argc, char **argv)
{
    enum encode_format encode = options_encode_format(argc, argv);
    if (encode != ENCODE_NONE)
        return encode_stdin(encode == ENCODE_JSON);
    fs_malloc_setup(); /* before the first large block: see util.h */
    struct agent a;
    memset(&a, 0, sizeof a);
    a.argc = argc;
    a.argv = argv;
    a.ranker.stat_fd = watch_stat_fd; /* a ranking reads the files of the targets watched again */
    a.ranker.ctx = &a.watch;
    int rc = options_parse(argc, argv, &a.opt);
    if (rc == 0 && !answer_instead(&a, &rc)) {
        fs_quiet = a.opt.quiet;
        if (a.opt.test) {
            rc = agent_test(&a);
        } else {
            rc = agent_open(&a);
            if (rc == 0)
                rc = agent_run(&a);
        }
        agent_close(&a);
    }
    options_free(&a.opt);
    return rc;
}
