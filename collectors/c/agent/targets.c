#include "targets.h"

#include "schema_fields.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
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

static void found_pid(const struct target_spec *spec, pid_t pid, int chosen, target_found_fn fn, void *ctx)
{
    struct target t;
    memset(&t, 0, sizeof t);
    t.pid = pid;
    t.chosen = chosen;
    t.top = chosen && spec->top > 0;
    fs_strlcpy(t.role, FS_DEFAULT_ROLE, sizeof t.role);
    fs_strlcpy(t.run_id, spec->run_id ? spec->run_id : "", sizeof t.run_id);
    name_from_process(&t);
    fn(ctx, &t);
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

/* upstream, when there is one, is a list of node ids (the agent does not use it: the pipeline
 * graph's readers do; a node that says it wrongly is left out as the Python agent leaves it). */
static int upstream_conforms(const cJSON *node)
{
    const cJSON *up = cJSON_GetObjectItemCaseSensitive(node, "upstream");
    if (!up)
        return 1;
    if (!cJSON_IsArray(up))
        return 0;
    const cJSON *id = NULL;
    cJSON_ArrayForEach(id, up) {
        if (!cJSON_IsString(id))
            return 0;
    }
    return 1;
}

/* A node of endpoints.schema.json: node_id a string, pid an integer of a process (1 to PID_MAX_LIMIT),
 * role, control and host, when present, strings, curve_server_key a CURVE key, upstream a list of
 * strings. Any other node is left out, as the Python agent does. */
static int node_conforms(const cJSON *node, const cJSON *pid, const char *node_id)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(node, "role");
    const cJSON *control = cJSON_GetObjectItemCaseSensitive(node, "control");
    if (!node_id || !cJSON_IsNumber(pid) || pid->valuedouble < 1 || pid->valuedouble > 4194304 ||
        pid->valuedouble != (double)(long)pid->valuedouble)
        return 0;
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(node, "host");
    return (!role || cJSON_IsString(role)) && (!control || cJSON_IsString(control)) &&
        (!host || cJSON_IsString(host)) && server_key_conforms(node) && upstream_conforms(node);
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
                    PROBLEM_REFUSED = 32,
                    PROBLEM_NO_SUCH = 64,
};

#define ENDPOINTS_FILE_MAX (4 << 20) /* bytes read of an endpoints file, as of --endpoints FILE */
#define IN_DIR "--endpoints-dir" /* where a file said to be wrong was found */
#define IN_FILE "--endpoints"
#define CLIENT_KEY_FILE "keys/client.key_secret" /* a run's client key, in its folder (flowstat.node.curve) */
#define NODES_LEFT_OUT                                                                                      \
    "%d node(s) left out: not as endpoints.schema.json says (node_id a string, pid an integer 1..4194304, " \
    "role and control strings, curve_server_key a Z85 key of 40 characters, upstream a list of node ids)"

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

/* One file's nodes on their way to the caller's fn: those of a live process the file may speak
 * for, marked with the file. */
struct dir_file_scan {
    const char *path;
    target_found_fn fn;
    void *ctx;
    int stale; /* nodes whose process is not alive */
    uid_t owner; /* the file's */
    int remote_ok; /* --allow-remote-control */
    struct fs_buf refused; /* why nodes were not believed: "; " between them */
};

/* A control endpoint a request cannot leave this host by: ipc://, or TCP to a loopback address
 * (127.x.x.x, localhost, [::1]; a name that only starts so is not one). None is one too. */
static int control_is_local(const char *control)
{
    if (!control[0] || strncmp(control, "ipc://", 6) == 0)
        return 1;
    if (strncmp(control, "tcp://", 6) != 0)
        return 0;
    const char *host = control + 6, *colon = strrchr(host, ':');
    char name[64];
    struct in_addr v4;
    if (!colon || (size_t)(colon - host) >= sizeof name)
        return 0;
    memcpy(name, host, (size_t)(colon - host));
    name[colon - host] = '\0';
    if (strcmp(name, "localhost") == 0 || strcmp(name, "[::1]") == 0)
        return 1;
    return inet_pton(AF_INET, name, &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

/* Why a node an endpoints directory's file announces is not believed (0: it is, why untouched).
 * The directory is shared by the host's users: a file speaks only for its owner's processes, and
 * only of a control endpoint on this host, where a request cannot be sent elsewhere (as the Python
 * agent's targets._untrusted). */
static int untrusted(const struct dir_file_scan *scan, const struct target *t, char *why, size_t n)
{
    char proc[64];
    struct stat st;
    snprintf(proc, sizeof proc, "/proc/%d", (int)t->pid);
    if (stat(proc, &st) != 0)
        snprintf(why, n, "pid %d is gone", (int)t->pid);
    else if (st.st_uid != scan->owner)
        snprintf(why, n, "the file's owner (uid %u) does not own pid %d (uid %u)", (unsigned)scan->owner, (int)t->pid,
                 (unsigned)st.st_uid);
    else if (!scan->remote_ok && !control_is_local(t->control))
        snprintf(why, n, "control endpoint %s is neither ipc:// nor on loopback", t->control);
    else
        return 0;
    return 1;
}

static void found_in_dir_file(void *ctx, const struct target *candidate)
{
    struct dir_file_scan *scan = ctx;
    if (!process_alive(candidate->pid)) {
        scan->stale++;
        return;
    }
    char why[400];
    if (untrusted(scan, candidate, why, sizeof why)) {
        fs_buf_puts(&scan->refused, scan->refused.len ? "; " : "");
        fs_buf_puts(&scan->refused, why);
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
    struct dir_file_scan scan = {path, fn, ctx, 0, st.st_uid, spec->allow_remote_control, {0}};
    int left_out = 0;
    if (targets_parse_endpoints(text, len, spec->run_id, client_key, &left_out, found_in_dir_file, &scan) < 0)
        say_once(notes, IN_DIR, path, &st, PROBLEM_NOT_ENDPOINTS, "not a flowstat endpoints document");
    if (left_out)
        say_once(notes, IN_DIR, path, &st, PROBLEM_NODES_LEFT_OUT, NODES_LEFT_OUT, left_out);
    if (scan.stale)
        say_once(notes, IN_DIR, path, &st, PROBLEM_STALE,
                 "%d node(s) of a process that is not running: left out (a stale file)", scan.stale);
    if (scan.refused.len)
        say_once(notes, IN_DIR, path, &st, PROBLEM_REFUSED, "refused: %s", scan.refused.data);
    fs_buf_free(&scan.refused);
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

/* -- processes as a farm chooses them: users, cgroups, units, the N heaviest -------------------- */

#define CGROUP_PROCS_MAX (64 << 20) /* bytes read of a cgroup.procs */

/* Pids chosen, in the order found (sorted and made unique by pids_settle). */
struct pid_list {
    pid_t *v;
    size_t n, cap;
};

static void pids_add(struct pid_list *l, pid_t pid)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        pid_t *grown = realloc(l->v, cap * sizeof *grown);
        if (!grown)
            return; /* out of memory: one process fewer chosen this time */
        l->v = grown;
        l->cap = cap;
    }
    l->v[l->n++] = pid;
}

static int by_pid(const void *a, const void *b)
{
    pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
    return (x > y) - (x < y);
}

static void pids_settle(struct pid_list *l)
{
    if (l->n)
        qsort(l->v, l->n, sizeof *l->v, by_pid);
    size_t kept = 0;
    for (size_t i = 0; i < l->n; i++)
        if (kept == 0 || l->v[kept - 1] != l->v[i])
            l->v[kept++] = l->v[i];
    l->n = kept;
}

/* A problem of a --user, --cgroup or --unit (about: "--user NAME"), said once. */
__attribute__((format(printf, 4, 5))) static void say_once_about(struct target_notes *notes, const char *about,
                                                                 enum file_problem problem, const char *fmt, ...)
{
    struct file_note *n = note_of(notes, about, NULL);
    if (n->said & (unsigned)problem)
        return;
    n->said |= (unsigned)problem;
    char text[PATH_MAX + 200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    LOG_WARN("%s: %s", about, text);
}

/* A whole file of any size (up to max bytes), NUL-terminated; NULL with errno on error. */
static char *read_whole(const char *path, size_t max, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    int err = buf ? 0 : ENOMEM;
    while (buf && !err) {
        if (n == cap && cap < max) {
            size_t bigger = cap * 2 < max ? cap * 2 : max;
            char *grown = realloc(buf, bigger + 1);
            if (!grown) {
                err = ENOMEM;
                break;
            }
            buf = grown;
            cap = bigger;
        }
        if (n == cap)
            break;
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            err = errno;
        else if (r == 0)
            break;
        else
            n += (size_t)r;
    }
    close(fd);
    if (err) {
        free(buf);
        errno = err;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Where the cgroup v2 hierarchy is mounted (/proc/self/mountinfo's cgroup2 line): 0, or -1. */
static int cgroup2_root(char *out, size_t n)
{
    size_t len = 0;
    char *text = read_whole("/proc/self/mountinfo", 16 << 20, &len);
    int rc = -1;
    for (char *line = text, *next; rc != 0 && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *dash = strstr(line, " - "), mount[PATH_MAX];
        if (!dash || strncmp(dash + 3, "cgroup2 ", 8) != 0)
            continue;
        /* ID PARENT MAJOR:MINOR ROOT MOUNT-POINT ...: the fifth */
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mount) == 1 && strlen(mount) < n) {
            fs_strlcpy(out, mount, n);
            rc = 0;
        }
    }
    free(text);
    return rc;
}

/* A cgroup given as an absolute path (/sys/...), or relative to the v2 root: 0, or -1. */
static int cgroup_dir(const char *name, const char *root, char *out, size_t n)
{
    if (strncmp(name, "/sys/", 5) == 0)
        return snprintf(out, n, "%s", name) < (int)n ? 0 : -1;
    while (*name == '/')
        name++;
    return root[0] && snprintf(out, n, "%s/%s", root, name) < (int)n ? 0 : -1;
}

static int is_dir_entry(const char *parent, const struct dirent *e)
{
    if (e->d_type != DT_UNKNOWN)
        return e->d_type == DT_DIR;
    char path[PATH_MAX];
    struct stat st;
    return snprintf(path, sizeof path, "%s/%s", parent, e->d_name) < (int)sizeof path && lstat(path, &st) == 0 &&
        S_ISDIR(st.st_mode);
}

static int no_dots(const struct dirent *e)
{
    return strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

struct path_list {
    char **v;
    size_t n, cap;
};

/* PARENT/NAME (NAME NULL: PARENT) added: 0, or -1 if out of memory. */
static int paths_add(struct path_list *l, const char *parent, const char *name)
{
    char *path = NULL;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **grown = realloc(l->v, cap * sizeof *grown);
        if (!grown)
            return -1;
        l->v = grown;
        l->cap = cap;
    }
    if (asprintf(&path, "%s%s%s", parent, name ? "/" : "", name ? name : "") < 0)
        return -1;
    l->v[l->n++] = path;
    return 0;
}

static void paths_free(struct path_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* The cgroup of a systemd unit: the first folder named so, breadth first (each folder's in name
 * order), at most TARGET_UNIT_DEPTH levels under the root. 0, or -1. */
static int unit_dir(const char *unit, const char *root, char *out, size_t n)
{
    struct path_list level = {0}, below = {0};
    int rc = root[0] && paths_add(&level, root, NULL) == 0 ? 1 : -1; /* 1: still looking */
    for (int depth = 0; depth < TARGET_UNIT_DEPTH && rc == 1; depth++) {
        for (size_t i = 0; i < level.n && rc == 1; i++) {
            struct dirent **entries = NULL;
            int count = scandir(level.v[i], &entries, no_dots, by_name);
            for (int k = 0; k < count; k++) {
                if (rc == 1 && is_dir_entry(level.v[i], entries[k])) {
                    if (strcmp(entries[k]->d_name, unit) == 0)
                        rc = snprintf(out, n, "%s/%s", level.v[i], unit) < (int)n ? 0 : -1;
                    else if (paths_add(&below, level.v[i], entries[k]->d_name) != 0)
                        rc = -1;
                }
                free(entries[k]);
            }
            free(entries);
        }
        paths_free(&level);
        level = below;
        memset(&below, 0, sizeof below);
    }
    paths_free(&level);
    paths_free(&below);
    return rc == 0 ? 0 : -1;
}

/* The processes of a cgroup's cgroup.procs, and of its descendants': 0, or -1 with errno when the
 * cgroup itself cannot be read (a descendant removed meanwhile is left out). */
static int cgroup_pids(const char *folder, struct pid_list *out, int depth)
{
    DIR *dir = opendir(folder);
    if (!dir)
        return -1;
    char path[PATH_MAX];
    size_t len = 0;
    char *procs = snprintf(path, sizeof path, "%s/cgroup.procs", folder) < (int)sizeof path
        ? read_whole(path, CGROUP_PROCS_MAX, &len)
        : NULL;
    for (char *p = procs, *end; p && *p; p = end) {
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        if (pid > 0 && pid <= 4194304)
            pids_add(out, (pid_t)pid);
    }
    free(procs);
    struct dirent *e;
    while (depth < 64 && (e = readdir(dir)) != NULL) /* cgroups nest at most cgroup.max.depth */
        if (no_dots(e) && is_dir_entry(folder, e) &&
            snprintf(path, sizeof path, "%s/%s", folder, e->d_name) < (int)sizeof path)
            cgroup_pids(path, out, depth + 1);
    closedir(dir);
    return 0;
}

/* The processes of the --cgroup and --unit options. */
static void scan_cgroups(const struct target_spec *spec, struct target_notes *notes, struct pid_list *out)
{
    char root[PATH_MAX] = "", folder[PATH_MAX], about[PATH_MAX + 16];
    if (cgroup2_root(root, sizeof root) != 0)
        root[0] = '\0';
    for (size_t i = 0; i < spec->ncgroups + spec->nunits; i++) {
        int is_unit = i >= spec->ncgroups;
        const char *name = is_unit ? spec->units[i - spec->ncgroups] : spec->cgroups[i];
        snprintf(about, sizeof about, "%s %s", is_unit ? "--unit" : "--cgroup", name);
        int found =
            is_unit ? unit_dir(name, root, folder, sizeof folder) : cgroup_dir(name, root, folder, sizeof folder);
        if (found != 0)
            say_once_about(notes, about, PROBLEM_NO_SUCH, "no such cgroup (the v2 hierarchy: %s)",
                           root[0] ? root : "not mounted");
        else if (cgroup_pids(folder, out, 0) != 0)
            say_once_about(notes, about, PROBLEM_UNREADABLE, "%s: %s", folder, strerror(errno));
    }
}

/* The uids of the --user options (names or numbers); a name no user has said once. */
static size_t resolve_users(const struct target_spec *spec, struct target_notes *notes, uid_t *uids)
{
    size_t n = 0;
    for (size_t i = 0; i < spec->nusers; i++) {
        const char *user = spec->users[i];
        char *end, buf[4096], about[300];
        unsigned long v = strtoul(user, &end, 10);
        struct passwd pw, *found = NULL;
        if (user[0] >= '0' && user[0] <= '9' && !*end && v <= (uid_t)-2) {
            uids[n++] = (uid_t)v;
            continue;
        }
        if (getpwnam_r(user, &pw, buf, sizeof buf, &found) == 0 && found) {
            uids[n++] = found->pw_uid;
            continue;
        }
        snprintf(about, sizeof about, "--user %s", user);
        say_once_about(notes, about, PROBLEM_NO_SUCH, "no such user");
    }
    return n;
}

static int choosers(const struct target_spec *spec)
{
    return spec->npatterns || spec->nusers || spec->ncgroups || spec->nunits;
}

/* A process's command line (its first 4 KiB), its arguments joined by spaces; NULL when it has
 * none (a kernel thread) or is gone. proc_fd: /proc, open; pid_name: the process's entry there. */
static char *command_line(int proc_fd, const char *pid_name)
{
    char path[64];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/cmdline", pid_name);
    int fd = openat(proc_fd, path, O_RDONLY | O_CLOEXEC);
    char *cmd = fd >= 0 ? read_fd(fd, 4096, &len) : NULL;
    if (fd >= 0)
        close(fd);
    for (size_t i = 0; cmd && i + 1 < len; i++) /* arguments are NUL-separated: match them as one line */
        if (cmd[i] == '\0')
            cmd[i] = ' ';
    if (cmd && len == 0) {
        free(cmd);
        cmd = NULL;
    }
    return cmd;
}

static int matches(const struct target_spec *spec, const char *cmd)
{
    for (size_t p = 0; cmd && p < spec->npatterns; p++)
        if (regexec(&spec->patterns[p], cmd, 0, NULL, 0) == 0)
            return 1;
    return 0;
}

static int owned(const uid_t *uids, size_t nuids, int proc_fd, const char *pid_name)
{
    struct stat st;
    if (!nuids || fstatat(proc_fd, pid_name, &st, 0) != 0)
        return 0;
    for (size_t u = 0; u < nuids; u++)
        if (st.st_uid == uids[u])
            return 1;
    return 0;
}

/* The processes of /proc the --pattern and --user options choose (with --top and no chooser: every
 * process), but the agent. */
static void scan_proc(const struct target_spec *spec, struct target_notes *notes, target_known_fn known, void *ctx,
                      struct pid_list *out)
{
    int everyone = spec->top && !choosers(spec);
    uid_t *uids = spec->nusers ? calloc(spec->nusers, sizeof *uids) : NULL;
    size_t nuids = uids ? resolve_users(spec, notes, uids) : 0;
    DIR *dir = everyone || spec->npatterns || nuids ? opendir("/proc") : NULL;
    if (!dir && (everyone || spec->npatterns || nuids))
        LOG_ERR("/proc: %s", strerror(errno));
    pid_t self = getpid();
    struct dirent *e;
    while (dir && (e = readdir(dir)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid == self)
            continue;
        if (everyone) {
            pids_add(out, pid);
            continue;
        }
        if (known && known(ctx, pid))
            continue;
        char *cmd = spec->npatterns ? command_line(dirfd(dir), e->d_name) : NULL;
        int taken = matches(spec, cmd);
        if (!taken && owned(uids, nuids, dirfd(dir), e->d_name)) { /* a kernel thread has no command line */
            if (!cmd)
                cmd = command_line(dirfd(dir), e->d_name);
            taken = cmd != NULL;
        }
        free(cmd);
        if (taken)
            pids_add(out, pid);
    }
    if (dir)
        closedir(dir);
    free(uids);
}

void targets_ranker_free(struct target_ranker *r)
{
    free(r->last);
    r->last = NULL;
    r->nlast = 0;
}

/* /proc/PID/stat as --top ranks by: the agent's open file when it has one, else opened. */
static enum proc_status read_rank(const struct target_ranker *r, pid_t pid, struct proc_rank *out)
{
    char buf[2048], path[64];
    int fd = r && r->stat_fd ? r->stat_fd(r->ctx, pid) : -1;
    ssize_t n;
    if (fd >= 0) {
        do
            n = pread(fd, buf, sizeof buf, 0);
        while (n < 0 && errno == EINTR);
    } else {
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            return PROC_GONE;
        do
            n = read(fd, buf, sizeof buf);
        while (n < 0 && errno == EINTR);
        close(fd);
    }
    return n > 0 ? parse_stat_rank(buf, (size_t)n, out) : PROC_GONE;
}

struct ranked {
    pid_t pid;
    double weight;
};

static int heaviest_first(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    if (x->weight != y->weight)
        return x->weight > y->weight ? -1 : 1;
    return (x->pid > y->pid) - (x->pid < y->pid);
}

/* Clock ticks since boot: the unit of a process's starttime. */
static double boot_ticks(long hz)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return ((double)ts.tv_sec + (double)ts.tv_nsec / 1e9) * (double)hz;
}

/* Keep in `chosen` (sorted by pid) only the spec->top heaviest, heaviest first: by resident
 * memory, or by the CPU used since the last ranking (a process not ranked then, or whose pid
 * another process has now: since it started, over its age). Kernel threads (no memory) and
 * processes gone are left out. As selection.Ranker. */
static void rank(const struct target_spec *spec, struct target_ranker *r, struct pid_list *chosen)
{
    static long hz = 0;
    if (hz == 0)
        hz = sysconf(_SC_CLK_TCK);
    if (r->by_rss != spec->top_by_rss) {
        targets_ranker_free(r);
        r->by_rss = spec->top_by_rss;
    }
    struct ranked *w = malloc((chosen->n ? chosen->n : 1) * sizeof *w);
    struct rank_entry *seen = malloc((chosen->n ? chosen->n : 1) * sizeof *seen);
    if (!w || !seen) {
        free(w), free(seen);
        chosen->n = 0;
        return;
    }
    double now = fs_monotonic(), boot = boot_ticks(hz);
    size_t nw = 0, before = 0;
    for (size_t i = 0; i < chosen->n; i++) {
        pid_t pid = chosen->v[i];
        struct proc_rank pr;
        if (read_rank(r, pid, &pr) != PROC_OK || pr.rss_pages == 0)
            continue;
        seen[nw] = (struct rank_entry){pid, pr.start, pr.ticks, now};
        w[nw].pid = pid;
        while (before < r->nlast && r->last[before].pid < pid) /* both sorted by pid */
            before++;
        const struct rank_entry *last = before < r->nlast && r->last[before].pid == pid ? &r->last[before] : NULL;
        if (spec->top_by_rss)
            w[nw].weight = (double)pr.rss_pages;
        else if (last && last->start == pr.start && now > last->at)
            w[nw].weight = ((double)pr.ticks - (double)last->ticks) / (now - last->at);
        else {
            double age = boot - (double)pr.start;
            w[nw].weight = (double)pr.ticks / ((age > 1 ? age : 1) / (double)hz);
        }
        nw++;
    }
    free(r->last);
    r->last = seen;
    r->nlast = nw;
    qsort(w, nw, sizeof *w, heaviest_first);
    chosen->n = nw < (size_t)spec->top ? nw : (size_t)spec->top;
    for (size_t i = 0; i < chosen->n; i++)
        chosen->v[i] = w[i].pid;
    free(w);
}

/* The processes the choosers name (pattern, user, cgroup, unit; with --top and none of them, every
 * process), or with --top the N heaviest of them. */
static void choose(const struct target_spec *spec, struct target_notes *notes, struct target_ranker *ranker,
                   target_known_fn known, target_found_fn fn, void *ctx)
{
    struct pid_list chosen = {0};
    struct target_ranker own = {0};
    if (spec->top)
        known = NULL; /* every one is ranked again */
    if (spec->npatterns || spec->nusers || (spec->top && !choosers(spec)))
        scan_proc(spec, notes, known, ctx, &chosen);
    if (spec->ncgroups || spec->nunits)
        scan_cgroups(spec, notes, &chosen);
    pids_settle(&chosen);
    pid_t self = getpid();
    if (spec->top)
        rank(spec, ranker ? ranker : &own, &chosen);
    for (size_t i = 0; i < chosen.n; i++)
        if (chosen.v[i] != self && !(known && known(ctx, chosen.v[i])))
            found_pid(spec, chosen.v[i], 1, fn, ctx);
    targets_ranker_free(&own);
    free(chosen.v);
}

#define HIDDEN_BY_HIDEPID                                                                                \
    "hidden: /proc is mounted with hidepid and this agent may not see other users' processes (it needs " \
    "CAP_SYS_PTRACE, or the group of hidepid's gid=: docs/farm.md)"

/* A process that runs (kill says so, or EPERM) while its /proc entry cannot be seen: /proc is
 * mounted with hidepid and the agent is neither privileged nor in hidepid's group. */
static int pid_hidden(pid_t pid)
{
    char path[32];
    snprintf(path, sizeof path, "/proc/%d", (int)pid);
    struct stat st; /* stat, not access: access checks with the real ids, and without capabilities */
    return stat(path, &st) != 0 && errno == ENOENT;
}

void targets_discover(const struct target_spec *spec, struct target_notes *notes, struct target_ranker *ranker,
                      int first, target_known_fn known, target_found_fn fn, void *ctx)
{
    for (size_t i = 0; first && i < spec->npids; i++) {
        if (kill(spec->pids[i], 0) != 0 && errno == ESRCH)
            LOG_WARN("--pid %d: no such process", (int)spec->pids[i]);
        else if (pid_hidden(spec->pids[i]))
            LOG_WARN("--pid %d: %s", (int)spec->pids[i], HIDDEN_BY_HIDEPID);
        else
            found_pid(spec, spec->pids[i], 0, fn, ctx);
    }
    for (size_t i = 0; i < spec->npidfiles; i++) {
        size_t len = 0;
        char *text = read_file(spec->pidfiles[i], 64, &len);
        long pid = text ? strtol(text, NULL, 10) : 0;
        if (pid > 0 && pid <= 4194304)
            found_pid(spec, (pid_t)pid, 0, fn, ctx);
        else
            LOG_WARN("pid file %s: %s", spec->pidfiles[i], text ? "no process id in it" : strerror(errno));
        free(text);
    }
    if (choosers(spec) || spec->top)
        choose(spec, notes, ranker, known, fn, ctx);
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
