/* A hash index: 64-bit hashes to positions in an array (several positions may share a hash; the
 * caller compares the keys), so that the agent finds a target among 10,000 without a walk through
 * them. Open addressing, linear probing, removal by backward shift (no tombstones). */
#ifndef FLOWSTAT_INDEX_H
#define FLOWSTAT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#define FS_INDEX_NONE ((size_t)-1)

struct fs_index_slot {
    uint64_t hash;
    size_t value; /* FS_INDEX_NONE: a free slot */
};

struct fs_index {
    struct fs_index_slot *slots;
    size_t cap, n; /* cap: 0 or a power of two */
};

/* 0, or -1 if out of memory (the index is as it was). */
int fs_index_add(struct fs_index *ix, uint64_t hash, size_t value);
/* The entry (hash, value) removed, if there is one. */
void fs_index_remove(struct fs_index *ix, uint64_t hash, size_t value);
/* The entry (hash, from) now says to: its value moved in the array. */
void fs_index_move(struct fs_index *ix, uint64_t hash, size_t from, size_t to);
/* The values of hash one by one: *cursor set to 0 first; FS_INDEX_NONE after the last. The index
 * must not change meanwhile. */
size_t fs_index_next(const struct fs_index *ix, uint64_t hash, size_t *cursor);
void fs_index_clear(struct fs_index *ix);
void fs_index_free(struct fs_index *ix);

/* FNV-1a of a string, and a pid mixed in. */
uint64_t fs_hash_text(const char *text);
uint64_t fs_hash_pid(int pid);

#endif
