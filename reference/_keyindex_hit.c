/* kvcert.reference._keyindex.attention_hit: kvcert.reference.coordinator.find_hit, compiled
 * for when its first candidate passes (a shared prefix's usual case), state groups included
 * (checkpointing ones: the plan has none that keeps no checkpoint), and for the branch point
 * (`ignore_state`). find_hit stays the definition: it calls this first and, on None, runs its
 * own scan; tests/reference/test_attention_hit.py holds the two equal.
 *
 * Why: for a prompt of a few thousand tokens the search's probes take a microsecond, and the
 * Python around them (per group its kind, its prefix, its run of needed blocks, its table)
 * several; an engine pays that on every lookup it makes of a waiting request. */
#include "_keyindex.h"

/* The plan's codes of the kinds (config.SEARCH_CODES). */
enum { FULL = 0, WINDOW = 1, CHUNKED = 2, CROSS = 3, STATE = 4 };

typedef struct {
    long code, size, span;         /* kind, block size, window or chunk */
    const GroupView *view;         /* NULL for a cross group */
    PyObject *const *keys;         /* the request's key of each block */
    Py_ssize_t count;              /* how many keys */
    int32_t *blocks;               /* FULL: its cached prefix; else its run at the hit */
    PyObject *packed;              /* packed answers: the int32 array `blocks` lies in */
    Py_buffer buffer;              /* its buffer, held while `blocks` points into it */
} Group;

/* The first block a hit of `length` needs (kvcert.reference.groups.first_needed: HIT-FULL-1,
 * HIT-SW-1, HIT-CHUNK-1, HIT-MAMBA-1: a state group the block its state at `length` is in). */
static Py_ssize_t
first_needed(const Group *group, Py_ssize_t length)
{
    if (group->code == STATE) {
        return Py_MAX(0, length / group->size - 1);
    }
    if (group->code == WINDOW) {
        return Py_MAX(0, length - (group->span - 1)) / group->size;
    }
    if (group->code == CHUNKED) {
        return length / group->span * group->span / group->size;
    }
    return 0;
}

/* One plan entry read into `group`: 1, or 0 when it is not one this search serves. */
static int
read_plan(PyObject *entry, PyObject *view, PyObject *keys, Group *group)
{
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3) {
        return 0;
    }
    group->code = PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
    group->size = PyLong_AsLong(PyTuple_GET_ITEM(entry, 1));
    group->span = PyLong_AsLong(PyTuple_GET_ITEM(entry, 2));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (group->code == CROSS) {
        return 1;
    }
    int spans = group->code == WINDOW || group->code == CHUNKED; /* a window or a chunk */
    if (group->code < FULL || group->code > STATE || group->size < 1 || (spans && group->span < 1) ||
        !Py_IS_TYPE(view, &GroupViewType) ||
        !(PyList_CheckExact(keys) || PyTuple_CheckExact(keys))) {
        return 0;
    }
    group->view = (const GroupView *)view;
    group->keys = PySequence_Fast_ITEMS(keys);
    group->count = PySequence_Fast_GET_SIZE(keys);
    return 1;
}

/* Whether every block of [first, stop) is served, each written to group->blocks from index
 * first on: 1 yes, 0 no (or a key that is no digest: the definition answers), -1 error. */
static int
run_served(Group *group, Py_ssize_t first, Py_ssize_t stop)
{
    for (Py_ssize_t j = first; j < stop; j++) {
        int error;
        int32_t block = view_lookup(group->view, group->keys[j], &error);
        if (error) {
            return -1;
        }
        if (!block) {
            return 0;
        }
        group->blocks[j] = block;
    }
    return 1;
}

/* Every block of [first, stop) written to group->blocks from index first on, 0 (NULL_BLOCK)
 * where none is served (as a served map's `get` answers): 1, or -1 on error. */
static int
run_read(Group *group, Py_ssize_t first, Py_ssize_t stop)
{
    for (Py_ssize_t j = first; j < stop; j++) {
        int error;
        group->blocks[j] = view_lookup(group->view, group->keys[j], &error);
        if (error) {
            return -1;
        }
    }
    return 1;
}

/* An array('i') of `count` zeros: a packed table before its blocks are written (the
 * template is made once). NULL on error. */
static PyObject *
zeros(Py_ssize_t count)
{
    static PyObject *zero; /* array('i', [0]) */
    if (zero == NULL) {
        PyObject *module = PyImport_ImportModule("array");
        zero = module ? PyObject_CallMethod(module, "array", "s[i]", "i", 0) : NULL;
        Py_XDECREF(module);
        if (zero == NULL) {
            return NULL;
        }
    }
    PyObject *times = PyLong_FromSsize_t(count);
    PyObject *made = times ? PyNumber_Multiply(zero, times) : NULL;
    Py_XDECREF(times);
    return made;
}

/* A packed table for at most `room` blocks, its buffer held by the group: 0 on error. */
static int
packed_table(Group *group, Py_ssize_t room)
{
    group->packed = zeros(room);
    if (group->packed == NULL || PyObject_GetBuffer(group->packed, &group->buffer,
                                                    PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        Py_CLEAR(group->packed);
        return 0;
    }
    if (group->buffer.itemsize != (Py_ssize_t)sizeof(int32_t)) { /* an int is not 32 bits */
        PyErr_SetString(PyExc_TypeError, "array('i') items are not 32-bit here");
        PyBuffer_Release(&group->buffer);
        Py_CLEAR(group->packed);
        return 0;
    }
    group->blocks = group->buffer.buf;
    return 1;
}

/* Give a packed table's buffer back (before the array may resize). */
static void
unpin(Group *group)
{
    if (group->buffer.obj != NULL) { /* PyBuffer_Release clears it */
        PyBuffer_Release(&group->buffer);
    }
    group->blocks = NULL;
}

/* Group g's table at `hit`: `nulls` null blocks, then its blocks from there up to `count`,
 * as a list of ints or, packed, its array('i') cut to `count` (taken from the group: the
 * blocks were written there, over zeros). */
static PyObject *
table_of(Group *group, Py_ssize_t nulls, Py_ssize_t count)
{
    if (group->packed != NULL) {
        unpin(group);
        PyObject *array = group->packed;
        group->packed = NULL;
        Py_ssize_t room = PySequence_Size(array);
        if (count > room) { /* all nulls, past the keys given: none was written */
            Py_SETREF(array, zeros(count));
        } else if (count < room && PySequence_DelSlice(array, count, room) < 0) {
            Py_CLEAR(array);
        }
        return array;
    }
    PyObject *table = PyList_New(count), *null = PyLong_FromLong(0);
    if (table == NULL || null == NULL) {
        Py_XDECREF(table);
        Py_XDECREF(null);
        return NULL;
    }
    for (Py_ssize_t j = 0; j < nulls; j++) { /* a window's long run of nulls: one object */
        PyList_SET_ITEM(table, j, Py_NewRef(null));
    }
    Py_DECREF(null);
    for (Py_ssize_t j = nulls; j < count; j++) {
        PyObject *id = PyLong_FromLong(group->blocks[j]);
        if (id == NULL) {
            Py_DECREF(table); /* its unset items are NULL, which the list skips */
            return NULL;
        }
        PyList_SET_ITEM(table, j, id);
    }
    return table;
}

/* The search over read groups: 1 with *answer set, 0 the definition's, -1 error. With
 * `ignore_state` state groups constrain nothing (the branch point) and their tables hold
 * what is served of their runs at the hit, null elsewhere. */
static int
search(Group *groups, Py_ssize_t n, Py_ssize_t bound, Py_ssize_t alignment, int ignore_state,
       PyObject **answer)
{
    for (Py_ssize_t g = 0; g < n; g++) { /* full groups: each prefix caps the hit */
        Group *group = &groups[g];
        if (group->code != FULL) {
            continue;
        }
        Py_ssize_t cap = Py_MIN(group->count, bound / group->size);
        int error, odd = 0;
        Py_ssize_t found = prefix_blocks(group->view, group->keys, cap, group->blocks, &error,
                                         &odd);
        if (error || odd) {
            return error ? -1 : 0;
        }
        bound = Py_MIN(bound, found * group->size); /* HIT-FULL-1: the prefix caps the hit */
    }
    Py_ssize_t top = bound / alignment * alignment;
    for (Py_ssize_t g = 0; g < n; g++) { /* the first candidate: every other group's run */
        Group *group = &groups[g];
        if (group->code == FULL || group->code == CROSS) {
            continue;
        }
        Py_ssize_t first = first_needed(group, top), stop = top / group->size;
        if (first < stop) {
            int served = stop > group->count           ? 0
                         : ignore_state && group->code == STATE ? run_read(group, first, stop)
                                                                : run_served(group, first, stop);
            if (served <= 0) {
                return served;
            }
        }
    }
    PyObject *tables = PyList_New(n);
    for (Py_ssize_t g = 0; tables != NULL && g < n; g++) {
        Group *group = &groups[g];
        Py_ssize_t count = group->code == CROSS ? 0 : top / group->size;
        Py_ssize_t nulls = group->code == FULL || !count ? 0 : first_needed(group, top);
        PyObject *table = table_of(group, nulls, count);
        if (table == NULL) {
            Py_CLEAR(tables);
            break;
        }
        PyList_SET_ITEM(tables, g, table);
    }
    *answer = tables == NULL ? NULL : Py_BuildValue("(nN)", top, tables);
    return *answer == NULL ? -1 : 1;
}

/* attention_hit(served, plan, keys, bound, alignment, packed, ignore_state): find_hit's
 * answer (hit, one table per group; `packed`: each an array('i'), coordinator.BLOCK_IDS) for
 * `bound` (num_tokens - 1, or the limit below it) when the largest candidate passes
 * (HIT-LEN-1, HIT-HYB-1; with `ignore_state`, BRANCH-1's); None for anything else, the
 * definition's to answer. */
PyObject *
attention_hit(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "attention_hit(served, plan, keys, bound, alignment, packed, "
                        "ignore_state) takes 7 arguments");
        return NULL;
    }
    PyObject *served = args[0], *plan = args[1], *keys = args[2];
    Py_ssize_t bound = PyLong_AsSsize_t(args[3]), alignment = PyLong_AsSsize_t(args[4]);
    int packed = PyObject_IsTrue(args[5]);
    int ignore_state = packed < 0 ? -1 : PyObject_IsTrue(args[6]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!PyTuple_CheckExact(plan) || !(PyTuple_CheckExact(served) || PyList_CheckExact(served)) ||
        !(PyTuple_CheckExact(keys) || PyList_CheckExact(keys)) || bound < 0 || alignment < 1) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(plan);
    if (PySequence_Fast_GET_SIZE(served) != n || PySequence_Fast_GET_SIZE(keys) != n) {
        Py_RETURN_NONE;
    }
    Group *groups = PyMem_Calloc((size_t)n, sizeof(Group));
    if (groups == NULL) {
        return PyErr_NoMemory();
    }
    int served_here = 1;
    for (Py_ssize_t g = 0; served_here == 1 && g < n; g++) {
        Group *group = &groups[g];
        served_here = read_plan(PyTuple_GET_ITEM(plan, g), PySequence_Fast_GET_ITEM(served, g),
                                PySequence_Fast_GET_ITEM(keys, g), group);
        if (served_here != 1) {
            break;
        }
        /* the most a table can hold; a cross group's is empty */
        Py_ssize_t room = group->code == CROSS ? 0 : Py_MIN(group->count, bound / group->size);
        if (packed) { /* written in place, then cut to the hit (table_of) */
            served_here = packed_table(group, room) ? 1 : -1;
        } else if (group->code != CROSS) {
            group->blocks = PyMem_Malloc((size_t)Py_MAX(room, 1) * sizeof(int32_t));
            served_here = group->blocks ? 1 : -1;
            if (group->blocks == NULL) {
                PyErr_NoMemory();
            }
        }
    }
    PyObject *answer = NULL;
    if (served_here == 1) {
        served_here = search(groups, n, bound, alignment, ignore_state, &answer);
    }
    for (Py_ssize_t g = 0; g < n; g++) {
        if (groups[g].packed != NULL) {
            unpin(&groups[g]);
            Py_DECREF(groups[g].packed);
        } else {
            PyMem_Free(groups[g].blocks);
        }
    }
    PyMem_Free(groups);
    if (served_here < 0) {
        return NULL;
    }
    return served_here ? answer : Py_NewRef(Py_None);
}
