/* kvcert.reference._keyindex: the block pool's key map, compiled.
 *
 * The same contract as kvcert.reference.keyindex.PyKeyIndex (the pure-Python fallback, and
 * the definition tests/reference/test_keyindex.py holds this type equal to). Why it exists:
 * a dict from a 32-byte digest object to a block-id object costs about 140 B per cached
 * block; here a block's digest is stored once, in a flat array indexed by the block id, and
 * each group's map is an open-addressing table of int32 block ids (linear probing, backward
 * shift deletion, load at most 2/3). A table never holds more entries than the pool has
 * blocks, so its capacity stops at 3/2 of the pool's (capacities are not powers of two: a
 * slot is placed by multiplying the hash into the capacity): at most 6 B per block, where a
 * power of two costs up to 12. A key's later holders (copies registered while it was
 * served) are entries of the same table: linear probing puts each after the earlier holders
 * in their shared probe run, and backward-shift deletion never reorders entries of one home,
 * so a probe meets the served holder first and the others follow in registration order.
 *
 * Slots are placed by Python's own keyed hash of the digest bytes (SipHash with the
 * per-process random key), the value hash(digest) already caches on the digest object: an
 * adversary who grinds prompts for digests sharing low bits cannot aim at one slot run.
 * Every allocation goes through PyMem_* so tracemalloc sees it.
 */
#include "_keyindex.h"

static PyTypeObject KeyIndexType;

/* The first empty slot from `i` on (a later holder's place, behind the earlier ones). */
static inline size_t
empty_from(const Table *table, size_t i)
{
    while (table->slots[i]) {
        i = next_slot(table, i);
    }
    return i;
}

static int
table_init(Table *table, size_t capacity)
{
    table->slots = PyMem_Calloc(capacity, sizeof(int32_t));
    if (table->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    table->capacity = capacity;
    table->used = 0;
    table->served = 0;
    return 0;
}

/* Re-place every entry in a table of `capacity` slots. The old slots are read from an
 * empty one on, cyclically, so each probe run is met from its start and a key's holders are
 * re-inserted in their order. */
static int
table_resize(const KeyIndex *self, Table *table, size_t capacity)
{
    Table old = *table;
    if (table_init(table, capacity) < 0) {
        *table = old;
        return -1;
    }
    size_t start = 0;
    while (old.slots[start]) { /* one is empty: a table is never full */
        start++;
    }
    for (size_t k = 0; k < old.capacity; k++) {
        size_t i = start + k < old.capacity ? start + k : start + k - old.capacity;
        int32_t block = old.slots[i];
        if (block) {
            table->slots[empty_from(table, home_of(table, hash_stored(key_at(self, block))))] =
                block;
        }
    }
    table->used = old.used;
    table->served = old.served;
    PyMem_Free(old.slots);
    return 0;
}

/* Make room for one more entry: past a load of 2/3 the table doubles, up to the bound
 * (where it never holds more than 2/3: the pool has no more blocks to bind). */
static int
table_reserve(const KeyIndex *self, Table *table)
{
    if ((size_t)(table->used + 1) * 3 > table->capacity * 2 && table->capacity < self->bound) {
        size_t doubled = 2 * table->capacity;
        return table_resize(self, table, doubled < self->bound ? doubled : self->bound);
    }
    return 0;
}

/* Empty slot `i`, shifting back the entries of its probe run that may move (no tombstones). */
static void
table_remove(const KeyIndex *self, Table *table, size_t i)
{
    size_t j = i;
    for (;;) {
        j = next_slot(table, j);
        int32_t block = table->slots[j];
        if (block == 0) {
            break;
        }
        size_t home = home_of(table, hash_stored(key_at(self, block)));
        /* the entry stays when its home lies cyclically in (i, j] */
        int stays = i < j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            table->slots[i] = block;
            i = j;
        }
    }
    table->slots[i] = 0;
    table->used--;
}

static void
tables_free(Table *tables, Py_ssize_t num_groups)
{
    if (tables) {
        for (Py_ssize_t g = 0; g < num_groups; g++) {
            PyMem_Free(tables[g].slots);
        }
        PyMem_Free(tables);
    }
}

/* One empty table per group, or NULL with an exception set. */
static Table *
tables_new(Py_ssize_t num_groups)
{
    Table *tables = PyMem_Calloc((size_t)num_groups, sizeof(Table));
    if (tables == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t g = 0; g < num_groups; g++) {
        if (table_init(&tables[g], MIN_CAPACITY) < 0) {
            tables_free(tables, num_groups);
            return NULL;
        }
    }
    return tables;
}

/* Append the new reference `item` to `list`, giving it up; -1 (with `item` gone too) when it
 * is NULL or the append fails. */
static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL || PyList_Append(list, item) < 0) {
        Py_XDECREF(item);
        return -1;
    }
    Py_DECREF(item);
    return 0;
}

/* -- argument checks ---------------------------------------------------------------------- */

static int
block_arg(const KeyIndex *self, PyObject *arg, int32_t *block)
{
    Py_ssize_t value = PyLong_AsSsize_t(arg);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (value < 0 || value >= self->num_blocks) {
        PyErr_Format(PyExc_IndexError, "block %zd is outside the pool (0..%zd)", value,
                     self->num_blocks - 1);
        return -1;
    }
    *block = (int32_t)value;
    return 0;
}

static int
bindable_block_arg(const KeyIndex *self, PyObject *arg, int32_t *block)
{
    if (block_arg(self, arg, block) < 0) {
        return -1;
    }
    if (*block == 0) {
        PyErr_SetString(PyExc_ValueError, "block 0 is the null block: it never holds a key");
        return -1;
    }
    return 0;
}

/* Every item a block of the pool (checked before anything changes). */
static int
blocks_valid(const KeyIndex *self, PyObject **items, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t block;
        if (block_arg(self, items[k], &block) < 0) {
            return 0;
        }
    }
    return 1;
}

static int
group_arg(const KeyIndex *self, PyObject *arg, Py_ssize_t *group)
{
    *group = PyLong_AsSsize_t(arg);
    if (*group == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*group < 0 || *group >= self->num_groups) {
        PyErr_Format(PyExc_IndexError, "group %zd is outside 0..%zd", *group,
                     self->num_groups - 1);
        return -1;
    }
    return 0;
}

/* -- the operations ---------------------------------------------------------------------- */

/* Bind `block` to `key` in `group`: -1 when it held exactly that already (nothing changes),
 * 0 when it now serves the key, else the earlier holder that keeps serving it; -2 on error. */
static long
bind_one(KeyIndex *self, int32_t block, Py_ssize_t group, PyObject *key)
{
    Py_hash_t hash;
    const uint8_t *data = probe_key(key, &hash, 1);
    if (data == NULL) {
        return -2;
    }
    uint8_t *stored = self->keys + (size_t)block * KEY_SIZE;
    if (group_at(self, block) >= 0) {
        if (group_at(self, block) == group && memcmp(stored, data, KEY_SIZE) == 0) {
            return -1;
        }
        PyErr_Format(PyExc_ValueError, "block %d holds another key: unbind it first",
                     (int)block);
        return -2;
    }
    Table *table = &self->tables[group];
    if (table_reserve(self, table) < 0) {
        return -2;
    }
    int found;
    size_t i = find(self, table, data, hash, &found);
    memcpy(stored, data, KEY_SIZE);
    set_group(self, block, group);
    /* a copy goes behind the earlier holders, in the first empty slot of their run */
    table->slots[found ? empty_from(table, i) : i] = block;
    table->used++;
    table->served += !found;
    return found ? table->slots[i] : 0;
}

/* The slot serving `block`'s key when `block` is the one serving it. */
static int
served_slot(const KeyIndex *self, int32_t block, size_t *slot)
{
    Py_ssize_t group = group_at(self, block);
    if (group < 0) {
        return 0;
    }
    const uint8_t *key = key_at(self, block);
    int found;
    *slot = find(self, &self->tables[group], key, hash_stored(key), &found);
    return found && self->tables[group].slots[*slot] == block;
}

static PyObject *
KeyIndex_bind(KeyIndex *self, PyObject *const *args, Py_ssize_t nargs)
{
    int32_t block;
    Py_ssize_t group;
    self->changes++;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "bind(block, group, key) takes 3 arguments");
        return NULL;
    }
    if (bindable_block_arg(self, args[0], &block) < 0 || group_arg(self, args[1], &group) < 0) {
        return NULL;
    }
    long result = bind_one(self, block, group, args[2]);
    return result == -2 ? NULL : PyLong_FromLong(result);
}

static PyObject *
KeyIndex_bind_run(KeyIndex *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t group;
    self->changes++;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "bind_run(group, blocks, keys) takes 3 arguments");
        return NULL;
    }
    if (group_arg(self, args[0], &group) < 0) {
        return NULL;
    }
    PyObject *blocks = PySequence_Fast(args[1], "blocks must be a sequence");
    if (blocks == NULL) {
        return NULL;
    }
    PyObject *keys = PySequence_Fast(args[2], "keys must be a sequence");
    if (keys == NULL) {
        Py_DECREF(blocks);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks);
    Py_ssize_t fresh = -1; /* -1: failed */
    PyObject **block_items = PySequence_Fast_ITEMS(blocks);
    PyObject **key_items = PySequence_Fast_ITEMS(keys);
    if (PySequence_Fast_GET_SIZE(keys) != n) {
        PyErr_Format(PyExc_ValueError, "bind_run: %zd blocks but %zd keys", n,
                     PySequence_Fast_GET_SIZE(keys));
    }
    else if (blocks_valid(self, block_items, n)) {
        fresh = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            int32_t block = (int32_t)PyLong_AsSsize_t(block_items[k]);
            long result = block ? bind_one(self, block, group, key_items[k]) : -1;
            if (result == -2) {
                fresh = -1;
                break;
            }
            fresh += result >= 0;
        }
    }
    Py_DECREF(blocks);
    Py_DECREF(keys);
    return fresh < 0 ? NULL : PyLong_FromSsize_t(fresh);
}

/* The next holder of the key at `slot` after it (0: none), found further along the run. */
static int32_t
later_holder(const KeyIndex *self, const Table *table, size_t slot)
{
    const uint8_t *key = key_at(self, table->slots[slot]);
    for (size_t j = next_slot(table, slot); table->slots[j]; j = next_slot(table, j)) {
        if (memcmp(key_at(self, table->slots[j]), key, KEY_SIZE) == 0) {
            return table->slots[j];
        }
    }
    return 0;
}

/* Unbind the bound `block`: when it served its key, the next holder serves it now (the
 * first of the run again once `block`'s entry is gone) or the key goes; a later holder just
 * leaves the run. Returns that next holder, 0 when none took over. */
static int32_t
unbind_one(KeyIndex *self, int32_t block)
{
    Table *table = &self->tables[group_at(self, block)];
    const uint8_t *key = key_at(self, block);
    int found; /* always: a bound block's key is served, by its first holder */
    size_t slot = find(self, table, key, hash_stored(key), &found);
    int32_t successor = 0;
    if (table->slots[slot] == block) {
        successor = later_holder(self, table, slot);
        table->served -= !successor;
    }
    else {
        while (table->slots[slot] != block) {
            slot = next_slot(table, slot);
        }
    }
    table_remove(self, table, slot);
    set_group(self, block, -1);
    memset(self->keys + (size_t)block * KEY_SIZE, 0, KEY_SIZE);
    return successor;
}

static PyObject *
KeyIndex_unbind(KeyIndex *self, PyObject *arg)
{
    int32_t block;
    self->changes++;
    if (block_arg(self, arg, &block) < 0) {
        return NULL;
    }
    if (group_at(self, block) < 0) {
        return PyLong_FromLong(-1);
    }
    return PyLong_FromLong(unbind_one(self, block));
}

/* counter[g] += counts[g] for each group, the list holding Python ints. */
static int
add_counts(PyObject *counter, const Py_ssize_t *counts, Py_ssize_t num_groups)
{
    for (Py_ssize_t g = 0; g < num_groups; g++) {
        if (!counts[g]) {
            continue;
        }
        Py_ssize_t before = PyLong_AsSsize_t(PyList_GET_ITEM(counter, g));
        if (before == -1 && PyErr_Occurred()) {
            return -1;
        }
        PyObject *count = PyLong_FromSsize_t(before + counts[g]);
        if (count == NULL) {
            return -1;
        }
        PyList_SetItem(counter, g, count); /* steals count */
    }
    return 0;
}

static PyObject *
KeyIndex_forget_run(KeyIndex *self, PyObject *const *args, Py_ssize_t nargs)
{
    self->changes++;
    if (nargs != 3 || !PyList_Check(args[1]) || PyList_GET_SIZE(args[1]) != self->num_groups ||
        !PyList_Check(args[2]) || PyList_GET_SIZE(args[2]) != self->num_groups) {
        PyErr_SetString(PyExc_TypeError, "forget_run(blocks, evictions, shadowed): the two "
                                          "counters are lists, one count per group");
        return NULL;
    }
    PyObject *blocks = PySequence_Fast(args[0], "blocks must be a sequence");
    if (blocks == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(blocks);
    PyObject **items = PySequence_Fast_ITEMS(blocks);
    if (!blocks_valid(self, items, n)) {
        Py_DECREF(blocks);
        return NULL;
    }
    Py_ssize_t groups = self->num_groups;
    Py_ssize_t *counts = PyMem_Calloc(2 * (size_t)groups, sizeof(Py_ssize_t));
    if (counts == NULL) {
        Py_DECREF(blocks);
        return PyErr_NoMemory();
    }
    Py_ssize_t forgotten = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int32_t block = (int32_t)PyLong_AsSsize_t(items[k]);
        Py_ssize_t group = group_at(self, block);
        if (group >= 0) {
            size_t slot;
            counts[group]++;
            counts[groups + group] += !served_slot(self, block, &slot);
            unbind_one(self, block);
            forgotten++;
        }
    }
    Py_DECREF(blocks);
    int failed = add_counts(args[1], counts, groups) < 0 ||
                 add_counts(args[2], counts + groups, groups) < 0;
    PyMem_Free(counts);
    return failed ? NULL : PyLong_FromSsize_t(forgotten);
}

/* The holders of `block`'s key in its group, the served one first, in registration order. */
static PyObject *
KeyIndex_holders(KeyIndex *self, PyObject *arg)
{
    int32_t block;
    if (block_arg(self, arg, &block) < 0) {
        return NULL;
    }
    PyObject *holders = PyList_New(0);
    if (holders == NULL || group_at(self, block) < 0) {
        return holders;
    }
    const uint8_t *key = key_at(self, block);
    Table *table = &self->tables[group_at(self, block)];
    int found;
    size_t slot = find(self, table, key, hash_stored(key), &found);
    for (; table->slots[slot]; slot = next_slot(table, slot)) {
        int32_t holder = table->slots[slot];
        if (memcmp(key_at(self, holder), key, KEY_SIZE) != 0) {
            continue; /* another key's entry in the same run */
        }
        if (append_new(holders, PyLong_FromLong(holder)) < 0) {
            Py_DECREF(holders);
            return NULL;
        }
    }
    return holders;
}

static PyObject *
KeyIndex_is_served(KeyIndex *self, PyObject *arg)
{
    int32_t block;
    size_t slot;
    if (block_arg(self, arg, &block) < 0) {
        return NULL;
    }
    return PyBool_FromLong(served_slot(self, block, &slot));
}

static PyObject *
KeyIndex_key_of(KeyIndex *self, PyObject *arg)
{
    int32_t block;
    if (block_arg(self, arg, &block) < 0) {
        return NULL;
    }
    if (group_at(self, block) < 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)key_at(self, block), KEY_SIZE);
}

static PyObject *
KeyIndex_group_of(KeyIndex *self, PyObject *arg)
{
    int32_t block;
    if (block_arg(self, arg, &block) < 0) {
        return NULL;
    }
    Py_ssize_t group = group_at(self, block);
    if (group < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromSsize_t(group);
}

static PyObject *
KeyIndex_clear(KeyIndex *self, PyObject *Py_UNUSED(ignored))
{
    self->changes++;
    Table *tables = tables_new(self->num_groups);
    if (tables == NULL) {
        return NULL;
    }
    tables_free(self->tables, self->num_groups);
    self->tables = tables;
    memset(self->groups, 0xFF, (size_t)self->num_blocks * (self->wide ? 2 : 1));
    memset(self->keys, 0, (size_t)self->num_blocks * KEY_SIZE);
    Py_RETURN_NONE;
}

static PyObject *
KeyIndex_get_served(KeyIndex *self, void *Py_UNUSED(closure))
{
    PyObject *views = PyTuple_New(self->num_groups);
    if (views == NULL) {
        return NULL;
    }
    for (Py_ssize_t g = 0; g < self->num_groups; g++) {
        GroupView *view = PyObject_New(GroupView, &GroupViewType);
        if (view == NULL) {
            Py_DECREF(views);
            return NULL;
        }
        Py_INCREF(self);
        view->index = self;
        view->group = g;
        PyTuple_SET_ITEM(views, g, (PyObject *)view);
    }
    return views;
}

static int
KeyIndex_init(KeyIndex *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"num_blocks", "num_groups", NULL};
    Py_ssize_t num_blocks, num_groups;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nn", names, &num_blocks, &num_groups)) {
        return -1;
    }
    if (num_blocks < 1 || num_blocks > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "num_blocks must be in 1..%d, got %zd", INT32_MAX,
                     num_blocks);
        return -1;
    }
    if (num_groups < 1 || num_groups > MAX_GROUPS) {
        PyErr_Format(PyExc_ValueError, "num_groups must be in 1..%d, got %zd", MAX_GROUPS,
                     num_groups);
        return -1;
    }
    if (self->keys != NULL) {
        PyErr_SetString(PyExc_TypeError, "a KeyIndex is initialised once");
        return -1;
    }
    self->num_blocks = num_blocks;
    self->num_groups = num_groups;
    /* blocks 1..num_blocks - 1 can be bound: at a load of 2/3 with one slot to spare */
    self->bound = (size_t)(num_blocks - 1) * 3 / 2 + 2;
    if (self->bound < MIN_CAPACITY) {
        self->bound = MIN_CAPACITY;
    }
    self->keys = PyMem_Calloc((size_t)num_blocks, KEY_SIZE);
    self->wide = num_groups > NARROW_GROUPS;
    self->groups = PyMem_Malloc((size_t)num_blocks * (self->wide ? 2 : 1));
    if (self->keys == NULL || self->groups == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(self->groups, 0xFF, (size_t)num_blocks * (self->wide ? 2 : 1));
    self->tables = tables_new(num_groups);
    return self->tables == NULL ? -1 : 0;
}

static void
KeyIndex_dealloc(KeyIndex *self)
{
    tables_free(self->tables, self->num_groups);
    PyMem_Free(self->keys);
    PyMem_Free(self->groups);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef KeyIndex_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))KeyIndex_bind, METH_FASTCALL,
     "bind(block, group, key): -1 when held already, 0 when it now serves the key, else "
     "the earlier holder"},
    {"bind_run", (PyCFunction)(void (*)(void))KeyIndex_bind_run, METH_FASTCALL,
     "bind_run(group, blocks, keys) -> how many were bound anew; block 0 skipped"},
    {"unbind", (PyCFunction)KeyIndex_unbind, METH_O,
     "unbind(block) -> -1 when it held no key, else the holder that serves its key now in "
     "its place (0: none)"},
    {"forget_run", (PyCFunction)(void (*)(void))KeyIndex_forget_run, METH_FASTCALL,
     "forget_run(blocks, evictions, shadowed) -> how many held a key; per group, counts "
     "them and those that were not served"},
    {"holders", (PyCFunction)KeyIndex_holders, METH_O,
     "holders(block) -> its key's holders, the served one first ([] when it holds none)"},
    {"is_served", (PyCFunction)KeyIndex_is_served, METH_O,
     "is_served(block): it holds a key and lookups of that key get it"},
    {"key_of", (PyCFunction)KeyIndex_key_of, METH_O, "key_of(block) -> digest or None"},
    {"group_of", (PyCFunction)KeyIndex_group_of, METH_O, "group_of(block) -> group or None"},
    {"clear", (PyCFunction)KeyIndex_clear, METH_NOARGS, "unbind every block"},
    {NULL, NULL, 0, NULL},
};

static PyObject *
KeyIndex_get_changes(KeyIndex *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->changes);
}

static PyGetSetDef KeyIndex_getset[] = {
    {"served", (getter)KeyIndex_get_served, NULL,
     "per group, a read-only mapping from key to the block serving it", NULL},
    {"changes", (getter)KeyIndex_get_changes, NULL,
     "how many calls could have changed a served map (bind, bind_run, unbind, forget_run, "
     "clear): equal counts, equal maps",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject KeyIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcert.reference._keyindex.KeyIndex",
    .tp_basicsize = sizeof(KeyIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per block its key and group; per group the key -> serving block map.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KeyIndex_init,
    .tp_dealloc = (destructor)KeyIndex_dealloc,
    .tp_methods = KeyIndex_methods,
    .tp_getset = KeyIndex_getset,
};

/* -- a group's read-only mapping --------------------------------------------------------- */

static PyObject *
GroupView_get(GroupView *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, default=None)");
        return NULL;
    }
    int error;
    int32_t block = view_lookup(self, args[0], &error);
    if (error) {
        return NULL;
    }
    if (block) {
        return PyLong_FromLong(block);
    }
    PyObject *fallback = nargs == 2 ? args[1] : Py_None;
    Py_INCREF(fallback);
    return fallback;
}

static PyObject *
GroupView_subscript(GroupView *self, PyObject *key)
{
    int error;
    int32_t block = view_lookup(self, key, &error);
    if (error) {
        return NULL;
    }
    if (!block) {
        PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return PyLong_FromLong(block);
}

static int
GroupView_contains(GroupView *self, PyObject *key)
{
    int error;
    int32_t block = view_lookup(self, key, &error);
    return error ? -1 : block != 0;
}

static Py_ssize_t
GroupView_length(GroupView *self)
{
    return self->index->tables[self->group].served;
}

/* The blocks serving keys[0], keys[1], ... up to the first key not served, at most `cap`
 * (kvcert.reference.coordinator._cached_prefix's definition, in one C loop), packed as
 * native int32 in a bytes object. A long prefix probes a table far larger than the caches,
 * two dependent misses per key (its slot, then the digest of the block there), so the keys
 * run through a pipeline: while key i is probed, key i + PREFIX_AHEAD / 2 has its slot read
 * and its block's digest fetched ahead, and key i + PREFIX_AHEAD is hashed and its slot
 * fetched ahead (a steady stream of misses in flight; batches drained it at each batch's
 * end, 25% slower in a cold cache). Past the first miss, at most PREFIX_AHEAD keys are
 * hashed and fetched for nothing. */
#define PREFIX_AHEAD 32
#define PREFIX_RING 64 /* a power of two above PREFIX_AHEAD */
Py_ssize_t
prefix_blocks(const GroupView *view, PyObject *const *items, Py_ssize_t n, int32_t *found,
              int *error, int *odd)
{
    const KeyIndex *index = view->index;
    const Table *table = &index->tables[view->group];
    /* a rolling pipeline: key count + PREFIX_AHEAD is hashed and its slot fetched ahead,
     * key count + PREFIX_AHEAD / 2 has its slot read and its block's digest fetched ahead,
     * key count is probed */
    const uint8_t *data[PREFIX_RING];
    Py_hash_t hashes[PREFIX_RING];
    Py_ssize_t count = 0, hashed = 0, read = 0;
    *error = 0;
    while (count < n) {
        for (; hashed < n && hashed <= count + PREFIX_AHEAD; hashed++) {
            size_t r = (size_t)hashed % PREFIX_RING;
            data[r] = probe_key(items[hashed], &hashes[r], 0);
            if (data[r] != NULL) {
                __builtin_prefetch(&table->slots[home_of(table, hashes[r])]);
            }
        }
        for (; read < hashed && read <= count + PREFIX_AHEAD / 2; read++) {
            size_t r = (size_t)read % PREFIX_RING;
            int32_t block = data[r] ? table->slots[home_of(table, hashes[r])] : 0;
            if (block) {
                __builtin_prefetch(key_at(index, block));
            }
        }
        size_t r = (size_t)count % PREFIX_RING;
        int32_t block = 0;
        if (data[r] != NULL) {
            int hit;
            size_t i = find(index, table, data[r], hashes[r], &hit);
            block = hit ? table->slots[i] : 0;
        }
        else { /* not a digest: served by no block, but unhashable is an error */
            *error = !PyBytes_Check(items[count]) && PyObject_Hash(items[count]) == -1;
            if (odd != NULL) {
                *odd = 1;
            }
        }
        if (*error || !block) {
            break;
        }
        found[count++] = block;
    }
    return count;
}

static PyObject *
scan_prefix(GroupView *self, PyObject *const *args, Py_ssize_t nargs, const char *name)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(keys, cap) takes 2 arguments", name);
        return NULL;
    }
    Py_ssize_t cap = PyLong_AsSsize_t(args[1]);
    if (cap == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *keys = PySequence_Fast(args[0], "keys must be a sequence");
    if (keys == NULL) {
        return NULL;
    }
    Py_ssize_t n = Py_MIN(PySequence_Fast_GET_SIZE(keys), Py_MAX(cap, 0));
    PyObject *packed = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    if (packed == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    int error;
    Py_ssize_t count = prefix_blocks(self, PySequence_Fast_ITEMS(keys), n,
                                     (int32_t *)PyBytes_AS_STRING(packed), &error, NULL);
    Py_DECREF(keys);
    if (error) {
        Py_DECREF(packed);
        return NULL;
    }
    if (count < n && _PyBytes_Resize(&packed, count * (Py_ssize_t)sizeof(int32_t)) < 0) {
        return NULL; /* the resize released it */
    }
    return packed;
}

/* scan_prefix's blocks as a list of ints, the definition's answer. */
static PyObject *
GroupView_prefix(GroupView *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *packed = scan_prefix(self, args, nargs, "prefix");
    if (packed == NULL) {
        return NULL;
    }
    const int32_t *found = (const int32_t *)PyBytes_AS_STRING(packed);
    Py_ssize_t count = PyBytes_GET_SIZE(packed) / (Py_ssize_t)sizeof(int32_t);
    PyObject *blocks = PyList_New(count);
    for (Py_ssize_t k = 0; blocks != NULL && k < count; k++) {
        PyObject *block = PyLong_FromLong(found[k]);
        if (block == NULL) {
            Py_CLEAR(blocks);
            break;
        }
        PyList_SET_ITEM(blocks, k, block);
    }
    Py_DECREF(packed);
    return blocks;
}

static PyObject *
GroupView_prefix_ids(GroupView *self, PyObject *const *args, Py_ssize_t nargs)
{
    return scan_prefix(self, args, nargs, "prefix_ids");
}

/* (key, block) per served key, in slot order (a later holder's entry is skipped). */
static PyObject *
GroupView_items(GroupView *self, PyObject *Py_UNUSED(ignored))
{
    const KeyIndex *index = self->index;
    const Table *table = &index->tables[self->group];
    PyObject *items = PyList_New(0);
    if (items == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < table->capacity; i++) {
        int32_t block = table->slots[i];
        if (!block || !served_slot(index, block, &(size_t){0})) {
            continue;
        }
        PyObject *item = Py_BuildValue("(y#i)", (const char *)key_at(index, block),
                                       (Py_ssize_t)KEY_SIZE, (int)block);
        if (append_new(items, item) < 0) {
            Py_DECREF(items);
            return NULL;
        }
    }
    return items;
}

static PyObject *
GroupView_iter(GroupView *self)
{
    PyObject *items = GroupView_items(self, NULL);
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *keys = PyList_New(n);
    if (keys == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *key = PyTuple_GET_ITEM(PyList_GET_ITEM(items, k), 0);
        Py_INCREF(key);
        PyList_SET_ITEM(keys, k, key);
    }
    Py_DECREF(items);
    PyObject *iterator = PyObject_GetIter(keys);
    Py_DECREF(keys);
    return iterator;
}

static void
GroupView_dealloc(GroupView *self)
{
    Py_DECREF(self->index);
    PyObject_Free(self);
}

static PyMethodDef GroupView_methods[] = {
    {"get", (PyCFunction)(void (*)(void))GroupView_get, METH_FASTCALL,
     "get(key, default=None) -> the block serving key"},
    {"items", (PyCFunction)GroupView_items, METH_NOARGS, "[(key, block), ...]"},
    {"prefix", (PyCFunction)(void (*)(void))GroupView_prefix, METH_FASTCALL,
     "prefix(keys, cap) -> the blocks serving keys[0], keys[1], ... up to the first miss"},
    {"prefix_ids", (PyCFunction)(void (*)(void))GroupView_prefix_ids, METH_FASTCALL,
     "prefix_ids(keys, cap) -> prefix's blocks as native int32 bytes"},
    {NULL, NULL, 0, NULL},
};

static PyMappingMethods GroupView_as_mapping = {
    .mp_length = (lenfunc)GroupView_length,
    .mp_subscript = (binaryfunc)GroupView_subscript,
};

static PySequenceMethods GroupView_as_sequence = {
    .sq_contains = (objobjproc)GroupView_contains,
};

PyTypeObject GroupViewType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcert.reference._keyindex.GroupView",
    .tp_basicsize = sizeof(GroupView),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One group's key -> serving block map (read-only; the KeyIndex changes it).",
    .tp_dealloc = (destructor)GroupView_dealloc,
    .tp_methods = GroupView_methods,
    .tp_as_mapping = &GroupView_as_mapping,
    .tp_as_sequence = &GroupView_as_sequence,
    .tp_iter = (getiterfunc)GroupView_iter,
};

static PyMethodDef module_methods[] = {
    {"attention_hit", (PyCFunction)(void (*)(void))attention_hit, METH_FASTCALL,
     "attention_hit(served, plan, keys, bound, alignment, packed, ignore_state) -> "
     "find_hit's (hit, tables) when its first candidate passes, else None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcert.reference._keyindex",
    .m_doc = "The block pool's key map in flat arrays (see kvcert.reference.keyindex).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__keyindex(void)
{
    if (PyType_Ready(&KeyIndexType) < 0 || PyType_Ready(&GroupViewType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "KEY_SIZE", KEY_SIZE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&KeyIndexType);
    if (PyModule_AddObject(m, "KeyIndex", (PyObject *)&KeyIndexType) < 0) {
        Py_DECREF(&KeyIndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
