/* kvcert.reference._keyindex's shared declarations: the index and its tables, a key's
 * probe, and what the hit search (_keyindex_hit.c) reads of them (_keyindex.c: the types,
 * their operations and the module). */
#ifndef KVCERT_KEYINDEX_H
#define KVCERT_KEYINDEX_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KEY_SIZE 32
#define MAX_GROUPS 0xFFFE  /* group numbers fit a uint16 beside all ones (unbound) */
#define NARROW_GROUPS 0xFE /* up to this many, a byte per block does */
#define MIN_CAPACITY 8

typedef struct {
    int32_t *slots;    /* block ids; 0 (the null block, never bound) marks an empty slot */
    size_t capacity;   /* any size from MIN_CAPACITY up to the index's bound */
    Py_ssize_t used;   /* occupied slots: served keys and their later holders */
    Py_ssize_t served; /* distinct keys */
} Table;

typedef struct {
    PyObject_HEAD
    Py_ssize_t num_blocks;
    Py_ssize_t num_groups;
    uint8_t *keys;    /* num_blocks * KEY_SIZE: the digest each block is bound to */
    uint8_t *groups;  /* per block: its group, all ones when it holds no key (one byte
                       * each, two when there are more than NARROW_GROUPS groups) */
    int wide;         /* two bytes per block */
    size_t bound;     /* the largest capacity a table needs: 3/2 of the bindable blocks */
    Table *tables;    /* per group: key -> the block serving it, then its later holders */
    unsigned long long changes; /* calls that could change a served map (`changes`) */
} KeyIndex;

typedef struct {
    PyObject_HEAD
    KeyIndex *index;
    Py_ssize_t group;
} GroupView;

extern PyTypeObject GroupViewType;

static inline Py_hash_t
hash_stored(const uint8_t *key)
{
#if PY_VERSION_HEX >= 0x030E0000
    return Py_HashBuffer(key, KEY_SIZE);
#else
    return _Py_HashBytes(key, KEY_SIZE);
#endif
}

/* `block`'s group, -1 when it holds no key. */
static inline Py_ssize_t
group_at(const KeyIndex *self, int32_t block)
{
    if (self->wide) {
        uint16_t group = ((const uint16_t *)self->groups)[block];
        return group == 0xFFFF ? -1 : group;
    }
    return self->groups[block] == 0xFF ? -1 : self->groups[block];
}

/* Record `block`'s group; -1: it holds no key (stored as all ones). */
static inline void
set_group(KeyIndex *self, int32_t block, Py_ssize_t group)
{
    if (self->wide) {
        ((uint16_t *)self->groups)[block] = (uint16_t)group;
    }
    else {
        self->groups[block] = (uint8_t)group;
    }
}

static inline const uint8_t *
key_at(const KeyIndex *self, int32_t block)
{
    return self->keys + (size_t)block * KEY_SIZE;
}

/* The digest bytes of `key` and their hash, or NULL when `key` is not a KEY_SIZE-byte bytes
 * object (with an exception set only when `strict`). */
static inline const uint8_t *
probe_key(PyObject *key, Py_hash_t *hash, int strict)
{
    if (!PyBytes_Check(key) || PyBytes_GET_SIZE(key) != KEY_SIZE) {
        if (strict) {
            PyErr_Format(PyExc_TypeError,
                         "a block key is a %d-byte digest (bytes), got %.100s of length %zd",
                         KEY_SIZE, Py_TYPE(key)->tp_name,
                         PyBytes_Check(key) ? PyBytes_GET_SIZE(key) : (Py_ssize_t)-1);
        }
        return NULL;
    }
    const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(key);
    *hash = PyBytes_CheckExact(key) ? PyObject_Hash(key) : hash_stored(data);
    return data;
}

/* The slot a key of this hash probes first: the hash's top 32 bits scaled into the
 * capacity (a bound capacity is no power of two to mask by). */
static inline size_t
home_of(const Table *table, Py_hash_t hash)
{
    uint32_t top = (uint32_t)((uint64_t)hash >> (8 * sizeof(Py_hash_t) - 32));
    return (size_t)(((uint64_t)top * table->capacity) >> 32);
}

static inline size_t
next_slot(const Table *table, size_t i)
{
    return i + 1 == table->capacity ? 0 : i + 1;
}

/* The slot of `key`'s first entry in `table` (the holder serving it), or the empty slot
 * where it would go. */
static inline size_t
find(const KeyIndex *self, const Table *table, const uint8_t *key, Py_hash_t hash, int *found)
{
    size_t i = home_of(table, hash);
    for (;;) {
        int32_t block = table->slots[i];
        if (block == 0) {
            *found = 0;
            return i;
        }
        if (memcmp(key_at(self, block), key, KEY_SIZE) == 0) {
            *found = 1;
            return i;
        }
        i = next_slot(table, i);
    }
}

/* The block serving `key` in the view's group, 0 when none (or not a digest). */
static inline int32_t
view_lookup(const GroupView *view, PyObject *key, int *error)
{
    Py_hash_t hash;
    const uint8_t *data = probe_key(key, &hash, 0);
    *error = 0;
    if (data == NULL) { /* not a digest: held by no block, but unhashable is an error (a dict's) */
        *error = !PyBytes_Check(key) && PyObject_Hash(key) == -1;
        return 0;
    }
    const KeyIndex *index = view->index;
    const Table *table = &index->tables[view->group];
    int found;
    size_t i = find(index, table, data, hash, &found);
    return found ? table->slots[i] : 0;
}

/* The blocks serving items[0], items[1], ... up to the first key not served, at most `n`,
 * written to `found`; how many. `*error`: a key was unhashable (an exception is set). With
 * `*odd` given, it is set when a key was no digest at all (served by no block). */
Py_ssize_t prefix_blocks(const GroupView *view, PyObject *const *items, Py_ssize_t n,
                         int32_t *found, int *error, int *odd);

/* kvcert.reference.coordinator's search when its first candidate passes (_keyindex_hit.c). */
PyObject *attention_hit(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
