#include "index.h"

#include <stdlib.h>
#include <string.h>

static size_t home(const struct fs_index *ix, uint64_t hash)
{
    return (size_t)(hash ^ (hash >> 29)) & (ix->cap - 1);
}

static void put(struct fs_index *ix, uint64_t hash, size_t value)
{
    size_t i = home(ix, hash);
    while (ix->slots[i].value != FS_INDEX_NONE)
        i = (i + 1) & (ix->cap - 1);
    ix->slots[i] = (struct fs_index_slot){hash, value};
    ix->n++;
}

/* Room for one more entry, the table kept at most half full. */
static int grow(struct fs_index *ix)
{
    if ((ix->n + 1) * 2 <= ix->cap)
        return 0;
    size_t cap = ix->cap ? ix->cap * 2 : 64;
    struct fs_index_slot *slots = malloc(cap * sizeof *slots), *old = ix->slots;
    if (!slots)
        return -1;
    for (size_t i = 0; i < cap; i++)
        slots[i].value = FS_INDEX_NONE;
    size_t old_cap = ix->cap;
    ix->slots = slots;
    ix->cap = cap;
    ix->n = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].value != FS_INDEX_NONE)
            put(ix, old[i].hash, old[i].value);
    free(old);
    return 0;
}

int fs_index_add(struct fs_index *ix, uint64_t hash, size_t value)
{
    if (grow(ix) != 0)
        return -1;
    put(ix, hash, value);
    return 0;
}

static size_t slot_of(const struct fs_index *ix, uint64_t hash, size_t value)
{
    if (!ix->cap)
        return FS_INDEX_NONE;
    for (size_t i = home(ix, hash); ix->slots[i].value != FS_INDEX_NONE; i = (i + 1) & (ix->cap - 1))
        if (ix->slots[i].hash == hash && ix->slots[i].value == value)
            return i;
    return FS_INDEX_NONE;
}

void fs_index_remove(struct fs_index *ix, uint64_t hash, size_t value)
{
    size_t hole = slot_of(ix, hash, value), mask = ix->cap - 1;
    if (hole == FS_INDEX_NONE)
        return;
    /* Each entry after the hole, up to a free slot, moves back into it unless its home lies
     * after the hole (it would no longer be found from there). */
    for (size_t j = (hole + 1) & mask; ix->slots[j].value != FS_INDEX_NONE; j = (j + 1) & mask) {
        size_t k = home(ix, ix->slots[j].hash);
        int stays = hole <= j ? (hole < k && k <= j) : (hole < k || k <= j);
        if (!stays) {
            ix->slots[hole] = ix->slots[j];
            hole = j;
        }
    }
    ix->slots[hole].value = FS_INDEX_NONE;
    ix->n--;
}

void fs_index_move(struct fs_index *ix, uint64_t hash, size_t from, size_t to)
{
    size_t i = slot_of(ix, hash, from);
    if (i != FS_INDEX_NONE)
        ix->slots[i].value = to;
}

size_t fs_index_next(const struct fs_index *ix, uint64_t hash, size_t *cursor)
{
    if (!ix->cap)
        return FS_INDEX_NONE;
    size_t mask = ix->cap - 1;
    for (size_t i = (home(ix, hash) + *cursor) & mask; *cursor < ix->cap && ix->slots[i].value != FS_INDEX_NONE;
         i = (i + 1) & mask) {
        ++*cursor;
        if (ix->slots[i].hash == hash)
            return ix->slots[i].value;
    }
    return FS_INDEX_NONE;
}

void fs_index_clear(struct fs_index *ix)
{
    for (size_t i = 0; i < ix->cap; i++)
        ix->slots[i].value = FS_INDEX_NONE;
    ix->n = 0;
}

void fs_index_free(struct fs_index *ix)
{
    free(ix->slots);
    memset(ix, 0, sizeof *ix);
}

uint64_t fs_hash_text(const char *text)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    return h;
}

uint64_t fs_hash_pid(int pid)
{
    uint64_t h = (uint64_t)(unsigned)pid * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 32);
}
