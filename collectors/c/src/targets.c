#include "targets.h"

#include "schema_fields.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "util.h"

/* Read a whole small file (at most max bytes); NUL-terminated; NULL on error. */
static char *read_file(const char *path, size_t max, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *buf = malloc(max + 1);
    size_t n = 0;
    while (buf && n < max) {
        ssize_t r = read(fd, buf + n, max - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
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

/* A node of endpoints.schema.json: node_id a string, pid an integer of a process (1 to PID_MAX_LIMIT),
 * role and control, when present, strings. Any other node is left out, as the Python agent does. */
static int node_conforms(const cJSON *node, const cJSON *pid, const char *node_id)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(node, "role");
    const cJSON *control = cJSON_GetObjectItemCaseSensitive(node, "control");
    if (!node_id || !cJSON_IsNumber(pid) || pid->valuedouble < 1 || pid->valuedouble > 4194304 ||
        pid->valuedouble != (double)(long)pid->valuedouble)
        return 0;
    return (!role || cJSON_IsString(role)) && (!control || cJSON_IsString(control));
}

int targets_parse_endpoints(const char *text, size_t len, const char *run_id, target_found_fn fn, void *ctx)
{
    cJSON *doc = cJSON_ParseWithLength(text, len);
    const cJSON *nodes = doc ? cJSON_GetObjectItemCaseSensitive(doc, "nodes") : NULL;
    if (!cJSON_IsArray(nodes)) {
        cJSON_Delete(doc);
        return -1;
    }
    int found = 0;
    const char *doc_run = json_string(doc, "run_id", "");
    const cJSON *node;
    cJSON_ArrayForEach(node, nodes) {
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(node, "pid");
        const char *node_id = json_string(node, "node_id", NULL);
        if (!node_conforms(node, pid, node_id))
            continue;
        struct target t;
        memset(&t, 0, sizeof t);
        t.pid = (pid_t)pid->valuedouble;
        fs_strlcpy(t.node_id, node_id, sizeof t.node_id);
        fs_strlcpy(t.role, json_string(node, "role", FS_DEFAULT_ROLE), sizeof t.role);
        fs_strlcpy(t.run_id, run_id && run_id[0] ? run_id : doc_run, sizeof t.run_id);
        fs_strlcpy(t.control, json_string(node, "control", ""), sizeof t.control);
        fn(ctx, &t);
        found++;
    }
    cJSON_Delete(doc);
    return found;
}

void targets_discover(const struct target_spec *spec, int first, target_found_fn fn, void *ctx)
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
    for (size_t i = 0; i < spec->nendpoints; i++) {
        size_t len = 0;
        char *text = read_file(spec->endpoints[i], 4 << 20, &len);
        if (!text || targets_parse_endpoints(text, len, spec->run_id, fn, ctx) < 0)
            LOG_WARN("endpoints file %s: %s", spec->endpoints[i],
                     text ? "not a flowstat endpoints document" : strerror(errno));
        free(text);
    }
}
