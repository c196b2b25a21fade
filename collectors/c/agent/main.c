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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "control.h"
#include "delivery.h"
#include "options.h"
#include "sample_json.h"
#include "targets.h"

#define AGENT_NAME "flowstat-agent-c"
#define STATE_DOWN "DOWN" /* node_state once the process is gone (one of the schema's states) */
#define STATE_STOPPED "STOPPED" /* instead, after the run-ending notice, or once its endpoints file is gone */

static volatile sig_atomic_t stop_flag = 0;
static volatile sig_atomic_t ending_flag = 0; /* the run-ending notice came: nodes gone now ended with their run */

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

struct retired { /* nodes that were dropped: their seq continues if they are found again */
    char node_id[128];
    pid_t pid;
    long long seq;
};

struct agent {
    struct options opt;
    char host[256], agent_name[192];
    struct target *targets;
    size_t ntargets, cap;
    struct target_notes notes; /* what was said of the endpoints directories' files */
    struct retired *gone;
    size_t ngone, gone_cap;
    struct control_pool control;
    struct sink_runner *sinks; /* one delivery thread each */
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

static struct target *find_target(struct agent *a, pid_t pid, const char *node_id)
{
    for (size_t i = 0; i < a->ntargets; i++)
        if (a->targets[i].pid == pid && strcmp(a->targets[i].node_id, node_id) == 0)
            return &a->targets[i];
    return NULL;
}

static struct retired *find_gone(struct agent *a, const char *node_id, pid_t pid, int any_pid)
{
    for (size_t i = 0; i < a->ngone; i++)
        if (strcmp(a->gone[i].node_id, node_id) == 0 && (any_pid || a->gone[i].pid == pid))
            return &a->gone[i];
    return NULL;
}

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

static void on_found(void *ctx, const struct target *cand)
{
    struct agent *a = ctx;
    if (find_target(a, cand->pid, cand->node_id) || find_gone(a, cand->node_id, cand->pid, 0))
        return;
    struct target t = *cand;
    if (proc_reader_open(&t.reader, t.pid) != PROC_OK)
        return;
    if (proc_reader_read(&t.reader, &t.prev) != PROC_OK) {
        proc_reader_close(&t.reader);
        return;
    }
    t.prev_t = fs_monotonic();
    struct retired *before = find_gone(a, t.node_id, 0, 1);
    t.seq = before ? before->seq : 0;
    if (a->ntargets == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        struct target *grown = realloc(a->targets, cap * sizeof *grown);
        if (!grown) {
            proc_reader_close(&t.reader);
            return;
        }
        a->targets = grown;
        a->cap = cap;
    }
    take_client_key(&t);
    a->targets[a->ntargets++] = t;
    fsn_curve_wipe(&t.curve_client); /* this copy: the target in the list keeps its own */
    note_run(a, t.run_id);
    LOG_INFO("watching %s (pid %d)", t.node_id, (int)t.pid);
}

static void retire(struct agent *a, size_t i)
{
    struct target *t = &a->targets[i];
    if (a->ngone == a->gone_cap) {
        size_t cap = a->gone_cap ? a->gone_cap * 2 : 64;
        struct retired *grown = realloc(a->gone, cap * sizeof *grown);
        if (grown) {
            a->gone = grown;
            a->gone_cap = cap;
        }
    }
    if (a->ngone < a->gone_cap) {
        struct retired *r = &a->gone[a->ngone++];
        fs_strlcpy(r->node_id, t->node_id, sizeof r->node_id);
        r->pid = t->pid;
        r->seq = t->seq;
    }
    proc_reader_close(&t->reader);
    if (t->control[0])
        control_forget(&a->control, t->control, t->curve_server_key);
    fsn_curve_wipe(&t->curve_client);
    a->targets[i] = a->targets[--a->ntargets];
}

/* -- sampling ---------------------------------------------------------------------------------- */

static const char *role_of(const char *role)
{
    return sample_value_allowed(FS_F_ROLE, role) ? role : FS_DEFAULT_ROLE;
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
    sample_set_str(s, FS_F_ROLE, role_of(role));
    sample_set_str(s, FS_F_AGENT, a->agent_name);
    sample_set_int(s, FS_F_SEQ, t->seq++);
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
    size_t n = a->ntargets, nctl = 0;
    struct control_peer *peers = calloc(n ? n : 1, sizeof *peers);
    size_t *owner = calloc(n ? n : 1, sizeof *owner);
    cJSON **replies = calloc(n ? n : 1, sizeof *replies);
    int ok = peers && owner && replies;
    for (size_t i = 0; ok && i < n; i++) {
        const struct target *t = &a->targets[i];
        if (!t->control[0])
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
 * dropped. */
static void sample_gone(struct agent *a, struct target *t, enum proc_status st, const struct round_time *when,
                        struct fs_sample *s)
{
    if (st != PROC_GONE) {
        a->proc_errors++;
        LOG_ERR("%s (pid %d): cannot read /proc (%s)", t->node_id, (int)t->pid,
                st == PROC_BAD_FORMAT ? "unexpected format" : strerror(errno));
    }
    /* Both are looked at after the read that found the node gone: a notice sent before the node was
     * stopped has been handled by then, and a node removes its file before it exits. */
    int with_run = ending_flag, closed = !with_run && announcement_removed(t);
    base_sample(a, t, when->stamp, when->ms, t->role, with_run || closed ? STATE_STOPPED : STATE_DOWN, s);
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
    sample_set_int(s, FS_F_THREADS, cur->threads);
    if (reply)
        control_fill_sample(reply, s);
    t->prev = *cur;
    t->prev_t = when->now;
}

/* One sample of the target: 1 if it is gone (its last one), else 0. */
static int sample_target(struct agent *a, struct target *t, const cJSON *reply, const struct round_time *when,
                         struct fs_sample *s)
{
    struct proc_reading cur;
    enum proc_status st = proc_reader_read(&t->reader, &cur);
    if (st != PROC_OK) {
        sample_gone(a, t, st, when, s);
        return 1;
    }
    sample_live(a, t, &cur, reply, when, s);
    return 0;
}

static int grow_samples(struct fs_sample **samples, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    struct fs_sample *grown = realloc(*samples, n * sizeof *grown);
    if (!grown)
        return -1;
    *samples = grown;
    *cap = n;
    return 0;
}

/* A sample of every target, in (*out)[0..n): n, or 0 if out of memory. */
static size_t sample_all(struct agent *a, struct fs_sample **out, size_t *out_cap)
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
    size_t n = a->ntargets;
    if (grow_samples(out, out_cap, n) != 0)
        return 0;
    cJSON **by_target = calloc(n ? n : 1, sizeof *by_target);
    char *gone = calloc(n ? n : 1, 1); /* the targets reported gone, dropped after the loop */
    if (!by_target || !gone || ask_controls(a, by_target) != 0) {
        free(by_target), free(gone);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        gone[i] = (char)sample_target(a, &a->targets[i], by_target[i], &when, &(*out)[i]);
        cJSON_Delete(by_target[i]);
    }
    /* drop the targets reported gone: after the loop, and from the end (retire() moves the last
     * target into the place it frees, one already looked at) */
    for (size_t i = n; i-- > 0;)
        if (gone[i])
            retire(a, i);
    free(by_target), free(gone);
    a->samples_taken += (long long)n;
    return n;
}

/* After the sink threads are joined: their counters are theirs until then. */
static void write_stats(struct agent *a)
{
    FILE *f = fopen(a->opt.stats_path, "w");
    if (!f) {
        LOG_ERR("--stats %s: %s", a->opt.stats_path, strerror(errno));
        return;
    }
    fprintf(f,
            "{\"samples\": %lld, \"self_samples\": %lld, \"rounds\": %lld, \"skipped_rounds\": %lld, "
            "\"targets\": %zu, \"gone\": %zu, \"control_errors\": %llu, \"proc_errors\": %lld, \"sinks\": {",
            a->samples_taken, a->self_seq, a->rounds, a->skipped_rounds, a->ntargets, a->ngone, a->control.errors,
            a->proc_errors);
    for (size_t i = 0; i < a->opt.nsinks; i++) {
        struct sink_runner *r = &a->sinks[i];
        struct fs_buf url = {0};
        long long batches = 0, spooled = 0, dropped = 0;
        if (r->has_spool)
            spool_figures(&r->spool, &batches, &spooled, &dropped);
        fs_buf_json_string(&url, r->sink.url);
        fprintf(f,
                "%s%s: {\"delivered\": %lld, \"refused\": %lld, \"lost\": %lld, \"spooled\": %lld, "
                "\"spooled_samples\": %lld, \"spool_dropped\": %lld, \"failovers\": %lld}",
                i ? ", " : "", url.data ? url.data : "\"\"", r->delivered, r->refused, runner_lost(r), batches, spooled,
                dropped, r->sink.failovers);
        fs_buf_free(&url);
    }
    fprintf(f, "}}\n");
    fclose(f);
}

/* Each sink's batch is encoded here and queued for its thread: a slow sink cannot hold sampling. */
static void submit_all(struct agent *a, const struct fs_sample *samples, size_t n)
{
    for (size_t i = 0; i < a->opt.nsinks; i++)
        runner_submit(&a->sinks[i], samples, n);
}

/* Two statements: sample_all may move the array, and the order in which a call's arguments are
 * evaluated is unspecified (clang read the old pointer first). */
static void sample_and_submit(struct agent *a, struct fs_sample **samples, size_t *cap)
{
    size_t n = sample_all(a, samples, cap);
    submit_all(a, *samples, n);
}

/* -- self-samples ----------------------------------------------------------------------------- */

/* Delivery summed over the sinks, as each sink thread published its figures last. */
static struct runner_figures sinks_figures(struct agent *a)
{
    struct runner_figures sum = {0}, one;
    for (size_t i = 0; i < a->opt.nsinks; i++) {
        runner_figures(&a->sinks[i], &one);
        sum.delivered += one.delivered;
        sum.refused += one.refused;
        sum.lost += one.lost;
        sum.send_failures += one.send_failures;
        sum.spool_dropped += one.spool_dropped;
        sum.failovers += one.failovers;
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
    sample_set_int(s, FS_A_TARGETS, (long long)a->ntargets);
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
    while (!stop_flag && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
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

static int open_sinks(struct agent *a)
{
    a->sinks = calloc(a->opt.nsinks, sizeof *a->sinks);
    if (!a->sinks)
        return -1;
    for (size_t i = 0; i < a->opt.nsinks; i++) {
        char err[900];
        struct sink_waits waits = {a->opt.sink_timeout, a->opt.node_backoff};
        if (runner_open(&a->sinks[i], a->opt.sinks[i], &a->creds, a->opt.spool_dir, a->opt.spool_max,
                        a->opt.drain_timeout, &waits, err, sizeof err) != 0) {
            fprintf(stderr, "flowstat-agent: %s\n", err[0] ? err : a->opt.sinks[i]);
            a->opt.nsinks = i + 1; /* what close_sinks has to close */
            return -1;
        }
        a->sinks[i].send_max = a->sinks[i].send_limit = a->opt.send_max;
    }
    return 0;
}

/* The sink threads leave SIGINT, SIGTERM and SIGUSR1 to the sampling thread, whose sleep they
 * interrupt. */
static int start_sinks(struct agent *a)
{
    sigset_t stop_signals, before;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &stop_signals, &before);
    int rc = 0;
    for (size_t i = 0; i < a->opt.nsinks && rc == 0; i++)
        if (runner_start(&a->sinks[i]) != 0) {
            LOG_ERR("sink %s: cannot start its thread", a->opt.sinks[i]);
            rc = -1;
        }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    return rc;
}

/* All threads are told at once, so that their drain timeouts run side by side; then joined. */
static void stop_sinks(struct agent *a)
{
    for (size_t i = 0; i < a->opt.nsinks; i++)
        runner_stop(&a->sinks[i]);
    for (size_t i = 0; i < a->opt.nsinks; i++)
        runner_join(&a->sinks[i]);
}

/* Lost for good: never delivered, refused or still spooled. After stop_sinks. */
static long long lost_samples(struct agent *a)
{
    long long lost = 0;
    for (size_t i = 0; i < a->opt.nsinks; i++) {
        long long batches = 0, spooled = 0, dropped = 0;
        if (a->sinks[i].has_spool)
            spool_figures(&a->sinks[i].spool, &batches, &spooled, &dropped);
        lost += runner_lost(&a->sinks[i]) + dropped;
    }
    return lost;
}

static void close_sinks(struct agent *a)
{
    for (size_t i = 0; a->sinks && i < a->opt.nsinks; i++)
        runner_close(&a->sinks[i]);
    free(a->sinks);
    a->sinks = NULL;
}

static void sample_until_done(struct agent *a)
{
    struct fs_sample *samples = NULL;
    size_t samples_cap = 0;
    double start = fs_monotonic(), next_rescan = start, every = a->opt.self_interval;
    double next_self = every > 0 ? start + every : INFINITY;
    long long tick = 0;
    int noticed = 0;
    while (!stop_flag) {
        double now = fs_monotonic();
        if (now >= next_rescan || targets_dirs_changed(&a->opt.spec)) {
            targets_discover(&a->opt.spec, &a->notes, tick == 0, on_found, a);
            next_rescan = now + a->opt.rescan;
        }
        if (tick > 0) {
            sample_and_submit(a, &samples, &samples_cap);
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
            (a->opt.exit_when_all_down && tick > 0 && a->ntargets == 0 && a->ngone > 0))
            break;
        /* tick k is due at start + k x interval: no drift; an overrun skips to the next one due */
        long long due = (long long)floor((fs_monotonic() - start) / a->opt.interval) + 1;
        if (due > tick + 1)
            a->skipped_rounds += due - tick - 1;
        tick = due > tick + 1 ? due : tick + 1;
        sleep_until(start + (double)tick * a->opt.interval);
    }
    if (stop_flag && a->ntargets) /* stopped from outside: one last pass reports nodes that ended */
        sample_and_submit(a, &samples, &samples_cap);
    if (every > 0)
        submit_self_sample(a); /* the last one, behind every sample */
    free(samples);
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

/* Before any sampling: the agent's name, the stores' credentials, its sinks and control sockets.
 * 0, or the exit status once a message said why not. */
static int agent_open(struct agent *a)
{
    fs_host_identity(a->opt.host_name, a->host, sizeof a->host);
    targets_set_host(a->host);
    snprintf(a->agent_name, sizeof a->agent_name, "%s%s%s", AGENT_NAME, a->opt.name[0] ? "/" : "", a->opt.name);
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
    while (a->ntargets)
        retire(a, a->ntargets - 1);
    control_pool_close(&a->control);
    free(a->targets);
    free(a->gone);
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
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &notice, NULL);
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

int main(int argc, char **argv)
{
    enum encode_format encode = options_encode_format(argc, argv);
    if (encode != ENCODE_NONE)
        return encode_stdin(encode == ENCODE_JSON);
    fs_malloc_setup(); /* before the first large block: see util.h */
    struct agent a;
    memset(&a, 0, sizeof a);
    int rc = options_parse(argc, argv, &a.opt);
    if (rc == 0 && a.opt.help)
        options_usage(stdout);
    if (rc == 0 && !a.opt.help) {
        fs_quiet = a.opt.quiet;
        rc = agent_open(&a);
        if (rc == 0)
            rc = agent_run(&a);
        agent_close(&a);
    }
    options_free(&a.opt);
    return rc;
}
