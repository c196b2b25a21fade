#include "watch.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

int watch_fds(const struct target *t)
{
    return WATCH_FDS_PER_PROCESS + (t->control[0] ? WATCH_FDS_PER_CONTROL : 0);
}

struct target *watch_find(struct watch *w, pid_t pid, const char *node_id)
{
    size_t cursor = 0, i;
    while ((i = fs_index_next(&w->by_pid, fs_hash_pid(pid), &cursor)) != FS_INDEX_NONE)
        if (w->targets[i].pid == pid && strcmp(w->targets[i].node_id, node_id) == 0)
            return &w->targets[i];
    return NULL;
}

int watch_found_again(struct watch *w, pid_t pid, unsigned long long search)
{
    int found = 0;
    size_t cursor = 0, i;
    while ((i = fs_index_next(&w->by_pid, fs_hash_pid(pid), &cursor)) != FS_INDEX_NONE)
        if (w->targets[i].pid == pid && w->targets[i].chosen) {
            w->targets[i].seen = search;
            found = 1;
        }
    return found;
}

int watch_stat_fd(void *watch, pid_t pid)
{
    struct watch *w = watch;
    size_t cursor = 0, i;
    while ((i = fs_index_next(&w->by_pid, fs_hash_pid(pid), &cursor)) != FS_INDEX_NONE)
        if (w->targets[i].pid == pid && w->targets[i].reader.stat_fd >= 0)
            return w->targets[i].reader.stat_fd;
    return -1;
}

static uint64_t gone_hash(const char *node_id, pid_t pid)
{
    return fs_hash_text(node_id) ^ fs_hash_pid(pid);
}

int watch_is_gone(const struct watch *w, const char *node_id, pid_t pid)
{
    size_t cursor = 0, i;
    while ((i = fs_index_next(&w->gone_by_node, gone_hash(node_id, pid), &cursor)) != FS_INDEX_NONE)
        if (w->gone[i].pid == pid && strcmp(w->gone[i].node_id, node_id) == 0)
            return 1;
    return 0;
}

/* Where the node's seq is counted, made if it is new: FS_INDEX_NONE if out of memory. */
static size_t seq_slot(struct watch *w, const char *node_id)
{
    uint64_t h = fs_hash_text(node_id);
    size_t cursor = 0, i;
    while ((i = fs_index_next(&w->seq_by_node, h, &cursor)) != FS_INDEX_NONE)
        if (strcmp(w->seqs[i].node_id, node_id) == 0)
            return i;
    if (w->nseqs == w->seqs_cap) {
        size_t cap = w->seqs_cap ? w->seqs_cap * 2 : 64;
        struct node_seq *grown = realloc(w->seqs, cap * sizeof *grown);
        if (!grown)
            return FS_INDEX_NONE;
        w->seqs = grown;
        w->seqs_cap = cap;
    }
    if (fs_index_add(&w->seq_by_node, h, w->nseqs) != 0)
        return FS_INDEX_NONE;
    struct node_seq *s = &w->seqs[w->nseqs];
    fs_strlcpy(s->node_id, node_id, sizeof s->node_id);
    s->next = 0;
    return w->nseqs++;
}

struct target *watch_add(struct watch *w, const struct target *t)
{
    size_t slot = seq_slot(w, t->node_id);
    if (slot == FS_INDEX_NONE)
        return NULL;
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        struct target *grown = realloc(w->targets, cap * sizeof *grown);
        if (!grown)
            return NULL;
        w->targets = grown;
        w->cap = cap;
    }
    if (fs_index_add(&w->by_pid, fs_hash_pid(t->pid), w->n) != 0)
        return NULL;
    struct target *added = &w->targets[w->n++];
    *added = *t;
    added->seq_slot = slot;
    added->leaving = 0;
    w->fds += watch_fds(added);
    return added;
}

long long watch_next_seq(struct watch *w, const struct target *t)
{
    return w->seqs[t->seq_slot].next++;
}

static void note_gone(struct watch *w, const struct target *t)
{
    if (w->ngone == w->gone_cap) {
        size_t cap = w->gone_cap ? w->gone_cap * 2 : 64;
        struct gone_node *grown = realloc(w->gone, cap * sizeof *grown);
        if (!grown)
            return; /* out of memory: a node that comes back is taken again */
        w->gone = grown;
        w->gone_cap = cap;
    }
    if (fs_index_add(&w->gone_by_node, gone_hash(t->node_id, t->pid), w->ngone) != 0)
        return;
    struct gone_node *g = &w->gone[w->ngone++];
    fs_strlcpy(g->node_id, t->node_id, sizeof g->node_id);
    g->pid = t->pid;
}

void watch_drop(struct watch *w, size_t i, int gone)
{
    struct target *t = &w->targets[i];
    if (gone)
        note_gone(w, t);
    if (t->leaving)
        w->leaving--;
    w->fds -= watch_fds(t);
    proc_reader_close(&t->reader);
    fsn_curve_wipe(&t->curve_client);
    fs_index_remove(&w->by_pid, fs_hash_pid(t->pid), i);
    size_t last = --w->n;
    if (i != last) {
        fs_index_move(&w->by_pid, fs_hash_pid(w->targets[last].pid), last, i);
        w->targets[i] = w->targets[last];
    }
    fsn_curve_wipe(&w->targets[last].curve_client); /* the copy left behind */
}

void watch_forget_gone(struct watch *w)
{
    w->ngone = 0;
    fs_index_clear(&w->gone_by_node);
}

void watch_free(struct watch *w)
{
    while (w->n)
        watch_drop(w, w->n - 1, 0);
    free(w->targets);
    free(w->seqs);
    free(w->gone);
    fs_index_free(&w->by_pid);
    fs_index_free(&w->seq_by_node);
    fs_index_free(&w->gone_by_node);
    memset(w, 0, sizeof *w);
}
