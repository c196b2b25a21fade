#include "targets.h"

#include "schema_fields.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "util.h"

/* Read a whole small file from fd (at most max bytes); NUL-terminated; NULL on error (errno says). */
static char *read_fd(int fd, size_t max, size_t *len)
{
    char *buf = malloc(max + 1);
    size_t n = 0;
    while (buf && n < max) {
        ssize_t r = read(fd, buf + n, max - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int err = errno;
            free(buf);
            errno = err;
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

static char *read_file(const char *path, size_t max, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *text = read_fd(fd, max, len);
    int err = errno;
    close(fd);
    errno = err;
    return text;
}

static void name_from_process(struct target *t)
{
    char path[64], comm[64] = "proc";
    size_t len = 0;
    snprintf(path, sizeof path, "/proc/%d/comm", (int)t->pid);
    char *text = read_file(path, sizeof comm - 1, &len);
    if (text) {
        text[strcspn(text, "\n")] = '\0';
        if (text[0])
            fs_strlcpy(comm, text, sizeof comm);
        free(text);
    }
    snprintf(t->node_id, sizeof t->node_id, "%s-%d", comm, (int)t->pid);
}

static void found_pid(const struct target_spec *spec, pid_t pid, target_found_fn fn, void *ctx)
{
    struct target t;
    memset(&t, 0, sizeof t);
    t.pid = pid;
    fs_strlcpy(t.role, FS_DEFAULT_ROLE, sizeof t.role);
    fs_strlcpy(t.run_id, spec->run_id ? spec->run_id : "", sizeof t.run_id);
    name_from_process(&t);
    fn(ctx, &t);
}

static void scan_patterns(const struct target_spec *spec, target_found_fn fn, void *ctx)
{
    DIR *dir = opendir("/proc");
    if (!dir) {
        LOG_ERR("/proc: %s", strerror(errno));
        return;
    }
    pid_t self = getpid();
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid == self)
            continue;
        char path[64];
        size_t len = 0;
        snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
        char *cmd = read_file(path, 4096, &len);
        if (!cmd)
            continue;
        for (size_t i = 0; i + 1 < len; i++) /* arguments are NUL-separated: match them as one line */
            if (cmd[i] == '\0')
                cmd[i] = ' ';
        for (size_t p = 0; len > 0 && p < spec->npatterns; p++) {
            if (regexec(&spec->patterns[p], cmd, 0, NULL, 0) == 0) {
                found_pid(spec, pid, fn, ctx);
                break;
            }
        }
        free(cmd);
    }
    closedir(dir);
}

static const char *json_string(const cJSON *obj, const char *key, const char *fallback)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(item) && item->valuestring ? item->valuestring : fallback;
}

/* A curve_server_key, when there is one, is a key a CURVE client can be given: Z85 text of 32 bytes. */
static int server_key_conforms(const cJSON *node)
{
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(node, "curve_server_key");
    return !key ||
        (cJSON_IsString(key) && key->valuestring && fsn_curve_key_valid(key->valuestring, strlen(key->valuestring)));
}

/* A node of endpoints.schema.json: node_id a string, pid an integer of a process (1 to PID_MAX_LIMIT),
 * role, control and host, when present, strings, curve_server_key a CURVE key. Any other node is
 * left out, as the Python agent does. */
static int node_conforms(const cJSON *node, const cJSON *pid, const char *node_id)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(node, "role");
    const cJSON *control = cJSON_GetObjectItemCaseSensitive(node, "control");
    if (!node_id || !cJSON_IsNumber(pid) || pid->valuedouble < 1 || pid->valuedouble > 4194304 ||
        pid->valuedouble != (double)(long)pid->valuedouble)
        return 0;
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(node, "host");
    return (!role || cJSON_IsString(role)) && (!control || cJSON_IsString(control)) &&
        (!host || cJSON_IsString(host)) && server_key_conforms(node);
}

/* Whether a node lives on this host: its "host", when it names one, is ours (a pid is a process of
 * its own host; another host's node is that host's agent's). */
static char this_host[256]; /* targets_set_host; "": fs_host_identity's default */

void targets_set_host(const char *host)
{
    fs_strlcpy(this_host, host ? host : "", sizeof this_host);
}

static int node_is_here(const cJSON *node)
{
    const char *host = json_string(node, "host", NULL);
    char here[256];
    if (!host)
        return 1;
    fs_host_identity(this_host, here, sizeof here);
    return strcmp(host, here) == 0;
}

int targets_parse_endpoints(const char *text, size_t len, const char *run_id, const char *client_key, int *left_out,
                            target_found_fn fn, void *ctx)
{
    cJSON *doc = cJSON_ParseWithLength(text, len);
    const cJSON *nodes = doc ? cJSON_GetObjectItemCaseSensitive(doc, "nodes") : NULL;
    if (!cJSON_IsArray(nodes)) {
        cJSON_Delete(doc);
        return -1;
    }
    int found = 0, skipped = 0;
    const char *doc_run = json_string(doc, "run_id", "");
    const cJSON *node;
    cJSON_ArrayForEach(node, nodes) {
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(node, "pid");
        const char *node_id = json_string(node, "node_id", NULL);
        if (!node_conforms(node, pid, node_id)) {
            skipped++;
            continue;
        }
        if (!node_is_here(node))
            continue;
        struct target t;
        memset(&t, 0, sizeof t);
        t.pid = (pid_t)pid->valuedouble;
        fs_strlcpy(t.node_id, node_id, sizeof t.node_id);
        fs_strlcpy(t.role, json_string(node, "role", FS_DEFAULT_ROLE), sizeof t.role);
        fs_strlcpy(t.run_id, run_id && run_id[0] ? run_id : doc_run, sizeof t.run_id);
        fs_strlcpy(t.control, json_string(node, "control", ""), sizeof t.control);
        fs_strlcpy(t.curve_server_key, json_string(node, "curve_server_key", ""), sizeof t.curve_server_key);
        if (t.curve_server_key[0])
            fs_strlcpy(t.curve_client_key, client_key, sizeof t.curve_client_key);
        fn(ctx, &t);
        found++;
    }
    cJSON_Delete(doc);
    if (left_out)
        *left_out = skipped;
    return found;
}

/* -- endpoints directories -------------------------------------------------------------------- */

enum file_problem { /* what can be said about a file, once each */
                    PROBLEM_UNREADABLE = 1,
                    PROBLEM_NOT_REGULAR = 2,
                    PROBLEM_NOT_ENDPOINTS = 4,
                    PROBLEM_NODES_LEFT_OUT = 8,
                    PROBLEM_STALE = 16,
};

#define ENDPOINTS_FILE_MAX (4 << 20) /* bytes read of an endpoints file, as of --endpoints FILE */
#define IN_DIR "--endpoints-dir" /* where a file said to be wrong was found */
#define IN_FILE "--endpoints"
#define CLIENT_KEY_FILE "keys/client.key_secret" /* a run's client key, in its folder (flowstat.node.curve) */
#define NODES_LEFT_OUT                                                                                      \
    "%d node(s) left out: not as endpoints.schema.json says (node_id a string, pid an integer 1..4194304, " \
    "role and control strings, curve_server_key a Z85 key of 40 characters)"

/* FNV-1a, 64 bits: a file's path in the notes. */
static uint64_t path_hash(const char *path)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    return h;
}

/* The note of this file as it is now (st: NULL for one that has no size or time to tell, such as
 * a directory that cannot be opened): found, renewed if the file changed, or taken from the oldest. */
static struct file_note *note_of(struct target_notes *notes, const char *path, const struct stat *st)
{
    struct file_note now = {path_hash(path), st ? (long long)st->st_size : 0, st ? (long long)st->st_mtim.tv_sec : 0,
                            st ? (long long)st->st_mtim.tv_nsec : 0, 0};
    for (size_t i = 0; i < notes->n; i++) {
        struct file_note *n = &notes->notes[i];
        if (n->path_hash != now.path_hash)
            continue;
        if (n->size != now.size || n->mtime_s != now.mtime_s || n->mtime_ns != now.mtime_ns)
            *n = now; /* another version of the file: nothing said about it yet */
        return n;
    }
    struct file_note *n = &notes->notes[notes->next];
    notes->next = (notes->next + 1) % TARGET_NOTES_MAX;
    if (notes->n < TARGET_NOTES_MAX)
        notes->n++;
    *n = now;
    return n;
}

/* Log a problem of an endpoints file (origin: the option that gave it), unless it was said of this
 * version of the file. */
__attribute__((format(printf, 6, 7))) static void say_once(struct target_notes *notes, const char *origin,
                                                           const char *path, const struct stat *st,
                                                           enum file_problem problem, const char *fmt, ...)
{
    struct file_note *n = note_of(notes, path, st);
    if (n->said & (unsigned)problem)
        return;
    n->said |= (unsigned)problem;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    LOG_WARN("%s: %s: %s", origin, path, text);
}

/* Alive: its /proc entry is there and it is no zombie (which has exited: only its entry is left). */
static int process_alive(pid_t pid)
{
    struct proc_reader r;
    struct proc_reading reading;
    if (proc_reader_open(&r, pid) != PROC_OK)
        return 0;
    int alive = proc_reader_read(&r, &reading) == PROC_OK;
    proc_reader_close(&r);
    return alive;
}

/* One file's nodes on their way to the caller's fn: those of a live process, marked with the file. */
struct dir_file_scan {
    const char *path;
    target_found_fn fn;
    void *ctx;
    int stale; /* nodes whose process is not alive */
};

static void found_in_dir_file(void *ctx, const struct target *candidate)
{
    struct dir_file_scan *scan = ctx;
    if (!process_alive(candidate->pid)) {
        scan->stale++;
        return;
    }
    struct target t = *candidate;
    fs_strlcpy(t.announced_by, scan->path, sizeof t.announced_by);
    scan->fn(scan->ctx, &t);
}

/* Open a directory's entry, unless it is something not to read: a FIFO (it would block) or
 * anything else not a regular file. -1 once said why, or when the file is gone (a node closed). */
static int open_dir_file(struct target_notes *notes, const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (lstat(path, st) == 0) /* there, but cannot be opened: a dangling link, no permission */
            say_once(notes, IN_DIR, path, st, PROBLEM_UNREADABLE, "cannot be read (%s)", strerror(err));
        return -1;
    }
    if (fstat(fd, st) != 0) {
        say_once(notes, IN_DIR, path, NULL, PROBLEM_UNREADABLE, "cannot be read (%s)", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        say_once(notes, IN_DIR, path, st, PROBLEM_NOT_REGULAR, "not a regular file: left alone");
        close(fd);
        return -1;
    }
    return fd;
}

/* The client key for the nodes of an endpoints file or directory (source): --curve-client-key, else
 * the run's, beside the file (RUN_DIR/keys/client.key_secret for RUN_DIR/endpoints.json) or inside
 * the directory, as flowstat.node.curve.default_client_key says. */
static void client_key_for(const struct target_spec *spec, const char *source, int is_dir, char *out, size_t size)
{
    const char *slash = strrchr(source, '/');
    if (spec->curve_client_key)
        fs_strlcpy(out, spec->curve_client_key, size);
    else if (is_dir)
        snprintf(out, size, "%s/%s", source, CLIENT_KEY_FILE);
    else if (slash)
        snprintf(out, size, "%.*s/%s", (int)(slash - source), source, CLIENT_KEY_FILE);
    else
        fs_strlcpy(out, CLIENT_KEY_FILE, size);
}

/* Read one endpoints file of a directory, as an --endpoints FILE, its nodes marked with it. */
static void read_dir_file(const struct target_spec *spec, struct target_notes *notes, const char *path,
                          const char *client_key, target_found_fn fn, void *ctx)
{
    struct stat st;
    int fd = open_dir_file(notes, path, &st);
    if (fd < 0)
        return;
    size_t len = 0;
    char *text = read_fd(fd, ENDPOINTS_FILE_MAX, &len);
    int err = errno;
    close(fd);
    if (!text) {
        say_once(notes, IN_DIR, path, &st, PROBLEM_UNREADABLE, "cannot be read (%s)", strerror(err));
        return;
    }
    struct dir_file_scan scan = {path, fn, ctx, 0};
    int left_out = 0;
    if (targets_parse_endpoints(text, len, spec->run_id, client_key, &left_out, found_in_dir_file, &scan) < 0)
        say_once(notes, IN_DIR, path, &st, PROBLEM_NOT_ENDPOINTS, "not a flowstat endpoints document");
    if (left_out)
        say_once(notes, IN_DIR, path, &st, PROBLEM_NODES_LEFT_OUT, NODES_LEFT_OUT, left_out);
    if (scan.stale)
        say_once(notes, IN_DIR, path, &st, PROBLEM_STALE,
                 "%d node(s) of a process that is not running: left out (a stale file)", scan.stale);
    free(text);
}

/* A node's file: NAME.json, NAME not starting with a dot (a file being written is .NAME.tmp). */
static int is_endpoints_file_name(const char *name)
{
    size_t n = strlen(name);
    return name[0] != '.' && n > 5 && strcmp(name + n - 5, ".json") == 0;
}

static void scan_endpoints_dir(const struct target_spec *spec, struct target_notes *notes, const char *dir_path,
                               target_found_fn fn, void *ctx)
{
    DIR *dir = opendir(dir_path);
    if (!dir) {
        say_once(notes, IN_DIR, dir_path, NULL, PROBLEM_UNREADABLE,
                 "cannot be opened (%s): looked at again at each rescan", strerror(errno));
        return;
    }
    char client_key[PATH_MAX];
    client_key_for(spec, dir_path, 1, client_key, sizeof client_key);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (!is_endpoints_file_name(e->d_name))
            continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name) >= (int)sizeof path)
            say_once(notes, IN_DIR, dir_path, NULL, PROBLEM_UNREADABLE, "%s: path too long", e->d_name);
        else
            read_dir_file(spec, notes, path, client_key, fn, ctx);
    }
    closedir(dir);
}

/* An --endpoints FILE, read at each search; its nodes left out are said once per version of it. */
static void read_endpoints_file(const struct target_spec *spec, struct target_notes *notes, const char *path,
                                target_found_fn fn, void *ctx)
{
    char client_key[PATH_MAX];
    size_t len = 0;
    int left_out = 0;
    struct stat st;
    client_key_for(spec, path, 0, client_key, sizeof client_key);
    char *text = read_file(path, ENDPOINTS_FILE_MAX, &len);
    if (!text || targets_parse_endpoints(text, len, spec->run_id, client_key, &left_out, fn, ctx) < 0)
        LOG_WARN("endpoints file %s: %s", path, text ? "not a flowstat endpoints document" : strerror(errno));
    else if (left_out && stat(path, &st) == 0)
        say_once(notes, IN_FILE, path, &st, PROBLEM_NODES_LEFT_OUT, NODES_LEFT_OUT, left_out);
    free(text);
}

void targets_discover(const struct target_spec *spec, struct target_notes *notes, int first, target_found_fn fn,
                      void *ctx)
{
    for (size_t i = 0; first && i < spec->npids; i++) {
        if (kill(spec->pids[i], 0) != 0 && errno == ESRCH)
            LOG_WARN("--pid %d: no such process", (int)spec->pids[i]);
        else
            found_pid(spec, spec->pids[i], fn, ctx);
    }
    for (size_t i = 0; i < spec->npidfiles; i++) {
        size_t len = 0;
        char *text = read_file(spec->pidfiles[i], 64, &len);
        long pid = text ? strtol(text, NULL, 10) : 0;
        if (pid > 0 && pid <= 4194304)
            found_pid(spec, (pid_t)pid, fn, ctx);
        else
            LOG_WARN("pid file %s: %s", spec->pidfiles[i], text ? "no process id in it" : strerror(errno));
        free(text);
    }
    if (spec->npatterns)
        scan_patterns(spec, fn, ctx);
    for (size_t i = 0; i < spec->nendpoints; i++)
        read_endpoints_file(spec, notes, spec->endpoints[i], fn, ctx);
    for (size_t i = 0; i < spec->nendpoint_dirs; i++)
        scan_endpoints_dir(spec, notes, spec->endpoint_dirs[i], fn, ctx);
}

int targets_dirs_changed(struct target_spec *spec)
{
    int changed = 0;
    for (size_t i = 0; i < spec->nendpoint_dirs; i++) {
        struct stat st;
        long long mtime_ns = -1; /* a directory that cannot be read: its problem is said by the search */
        if (stat(spec->endpoint_dirs[i], &st) == 0)
            mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        if (mtime_ns != spec->endpoint_dirs_mtime_ns[i]) {
            spec->endpoint_dirs_mtime_ns[i] = mtime_ns;
            changed = 1;
        }
    }
    return changed;
}
