/* The targets an agent watches, found by pid and node id at once (an agent may watch 10,000); the
 * nodes it reported gone (not taken again until a reload); and each node's seq, which goes on
 * across the node being dropped and found again (a reload, --top), so that (agent, node, seq) is
 * never repeated nor skipped. */
#ifndef FLOWSTAT_WATCH_H
#define FLOWSTAT_WATCH_H

#include <stddef.h>
#include <sys/types.h>

#include "index.h"
#include "targets.h"

/* What an agent holds open for a target: /proc/PID/stat and statm, and a node's control channel
 * (its ZeroMQ socket's mailbox and connection). */
#define WATCH_FDS_PER_PROCESS 2
#define WATCH_FDS_PER_CONTROL 2

struct node_seq {
    char node_id[128];
    long long next;
};

struct gone_node {
    char node_id[128];
    pid_t pid;
};

struct watch {
    struct target *targets;
    size_t n, cap;
    size_t leaving; /* targets marked leaving (reported LEFT_TOP at the next round) */
    long long fds; /* open files the targets hold (watch_fds) */
    struct fs_index by_pid; /* targets */
    struct node_seq *seqs;
    size_t nseqs, seqs_cap;
    struct fs_index seq_by_node;
    struct gone_node *gone;
    size_t ngone, gone_cap;
    struct fs_index gone_by_node;
};

/* The open files a target holds while watched. */
int watch_fds(const struct target *t);
struct target *watch_find(struct watch *w, pid_t pid, const char *node_id);
/* The targets of this pid the choosers found (target.chosen) marked seen at `search`: 1 if any. A
 * pid that a new process took since the last round is its old target's until that round reports it
 * gone: the new one is found at the next search. */
int watch_found_again(struct watch *w, pid_t pid, unsigned long long search);
/* A watched target of this pid with its /proc/PID/stat open (a ranking reads it again), or -1. */
int watch_stat_fd(void *watch, pid_t pid);
/* Whether the node was reported gone with this pid. */
int watch_is_gone(const struct watch *w, const char *node_id, pid_t pid);
/* Take t (its reader open), its seq going on from its node's: the target in the list, or NULL if
 * out of memory (t is left to the caller). */
struct target *watch_add(struct watch *w, const struct target *t);
/* The next seq of a target's node. */
long long watch_next_seq(struct watch *w, const struct target *t);
/* Drop target i (its reader closed, its client keys wiped; its control channel is the caller's to
 * forget), noted gone if it is. The last target takes its place. */
void watch_drop(struct watch *w, size_t i, int gone);
/* Forget the nodes reported gone: a reload takes them again when its configuration names them. */
void watch_forget_gone(struct watch *w);
void watch_free(struct watch *w);

#endif
