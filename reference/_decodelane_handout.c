/* kvcert.reference._decodelane, the drop-in's hand-out of a chunk the lane served: vLLM's
 * KVCacheBlocks of its new blocks, as the Python `_handed_out` makes them (its calls, in
 * _decodelane_dropin.c, say which chunks are served). */
#include "_decodelane_dropin.h"


/* Whether the lane's answer allocated nothing and copies nothing: 1, 0, or -1 on error. */
int
allocated_nothing(Lane *lane, PyObject *result)
{
    PyObject *new_blocks = PyMember_GetOne((const char *)result, lane->fields[2]);
    PyObject *copies = new_blocks ? PyMember_GetOne((const char *)result, lane->fields[4]) : NULL;
    int nothing = copies != NULL && PyTuple_CheckExact(new_blocks) &&
                  PyTuple_CheckExact(copies) && PyTuple_GET_SIZE(copies) == 0;
    for (Py_ssize_t g = 0; nothing && g < PyTuple_GET_SIZE(new_blocks); g++) {
        PyObject *added = PyTuple_GET_ITEM(new_blocks, g);
        nothing = PyTuple_CheckExact(added) && PyTuple_GET_SIZE(added) == 0;
    }
    Py_XDECREF(new_blocks);
    Py_XDECREF(copies);
    return PyErr_Occurred() ? -1 : nothing;
}

/* _handed_out for a chunk whose new blocks join the tables' tails, as the Python method
 * hands them (the tails past what vLLM's worker holds, `_Tracked.seen`, checked against
 * the new blocks; where the worker zeroes new blocks, the attention groups' ones listed for
 * it, `_note_new`; the lengths and the slots that keep every attention table's last block
 * recorded, `_saw`, where a state group's table bounds no slots; the tails as vLLM's
 * KVCacheBlocks, `_wrap`): 1 handed out, 0 the Python method's (a check that fails, whose
 * error it raises; copies), -1 error. */
static int
hand_out_new(DropIn *self, PyObject *rid, PyObject *result, PyObject **answer)
{
    Lane *lane = (Lane *)self->lane;
    PyObject *mine = PyDict_GetItemWithError(self->requests, rid);
    PyObject *tracked = mine ? PyDict_GetItemWithError(self->tracked, rid) : NULL;
    if (tracked == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *zeroed = PyObject_GetAttr(self->manager, s_zeroed);
    PyObject *seen = zeroed ? lane_get(tracked, s_seen) : NULL;
    PyObject *tables = seen ? lane_get(mine, s_tables) : NULL;
    PyObject *new_blocks = tables ? PyMember_GetOne((const char *)result, lane->fields[2]) : NULL;
    PyObject *copies = new_blocks ? PyMember_GetOne((const char *)result, lane->fields[4]) : NULL;
    PyObject *blocks = copies ? PyObject_GetAttr(self->manager, s_blocks) : NULL;
    PyObject *new_ids = blocks && zeroed == Py_True ? PyObject_GetAttr(self->manager, s_new_ids)
                                                     : NULL;
    PyObject *lengths = NULL, *tails = NULL, *keep = NULL;
    int served = blocks == NULL || (zeroed == Py_True && new_ids == NULL) ? -1 : 0;
    Py_ssize_t groups = lane->groups;
    if (served < 0 || (zeroed != Py_False && zeroed != Py_True) ||
        (new_ids != NULL && !PyList_CheckExact(new_ids)) || !PyList_CheckExact(seen) ||
        PyList_GET_SIZE(seen) != groups || !PyList_CheckExact(tables) ||
        PyList_GET_SIZE(tables) != groups || !PyTuple_CheckExact(new_blocks) ||
        PyTuple_GET_SIZE(new_blocks) != groups || !PyTuple_CheckExact(copies) ||
        PyTuple_GET_SIZE(copies) != 0 || !PyList_CheckExact(blocks)) {
        goto done;
    }
    Py_ssize_t added = 0, tail_held = 0;
    long long kept = 0;
    lengths = PyList_New(groups);
    tails = PyTuple_New(groups);
    if (lengths == NULL || tails == NULL) {
        served = -1;
        goto done;
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        PyObject *table = PyList_GET_ITEM(tables, g);
        long long start = PyLong_AsLongLong(PyList_GET_ITEM(seen, g));
        if (start < 0 || !PyList_CheckExact(table)) {
            served = PyErr_Occurred() ? -1 : 0;
            goto done;
        }
        Py_ssize_t length = PyList_GET_SIZE(table);
        Py_ssize_t from = start < length ? (Py_ssize_t)start : length;
        PyObject *tail = PyList_New(length - from);
        PyObject *number = PyLong_FromSsize_t(length);
        if (tail == NULL || number == NULL) {
            Py_XDECREF(tail);
            Py_XDECREF(number);
            served = -1;
            goto done;
        }
        PyTuple_SET_ITEM(tails, g, tail);
        PyList_SET_ITEM(lengths, g, number);
        for (Py_ssize_t j = from; j < length; j++) {
            long long block = entry(table, j);
            if (block < 0 || block >= PyList_GET_SIZE(blocks)) {
                if (!PyErr_Occurred()) {
                    PyErr_Format(PyExc_ValueError, "a table holds block %lld, outside the pool",
                                 block);
                }
                served = -1;
                goto done;
            }
            tail_held += block != 0;
            PyList_SET_ITEM(tail, j - from, Py_NewRef(PyList_GET_ITEM(blocks, (Py_ssize_t)block)));
        }
        added += PyTuple_Size(PyTuple_GET_ITEM(new_blocks, g));
        if (length && lane->kind[g] != STATE) { /* _saw: the slots keeping its last block */
            kept = max_ll(kept, (long long)(length - 1) * lane->size[g] + 1);
        }
    }
    if (added != tail_held) {
        goto done; /* a new block inside the worker's table: the Python method raises */
    }
    for (Py_ssize_t g = 0; new_ids != NULL && g < groups; g++) { /* the blocks to zero */
        PyObject *ids = PyTuple_GET_ITEM(new_blocks, g);
        for (Py_ssize_t k = 0; lane->kind[g] != STATE && k < PyTuple_Size(ids); k++) {
            if (PyList_Append(new_ids, PyTuple_GET_ITEM(ids, k)) < 0) {
                served = -1;
                goto done;
            }
        }
    }
    keep = PyLong_FromLongLong(kept);
    if (keep == NULL || lane_set(tracked, s_seen, lengths) < 0 ||
        lane_set(tracked, s_keep, keep) < 0) {
        served = -1;
        goto done;
    }
    *answer = PyObject_CallOneArg((PyObject *)Py_TYPE(self->empty), tails); /* KVCacheBlocks */
    served = *answer == NULL ? -1 : 1;
done:
    Py_XDECREF(zeroed);
    Py_XDECREF(new_ids);
    Py_XDECREF(seen);
    Py_XDECREF(tables);
    Py_XDECREF(new_blocks);
    Py_XDECREF(copies);
    Py_XDECREF(blocks);
    Py_XDECREF(lengths);
    Py_XDECREF(tails);
    Py_XDECREF(keep);
    return served;
}

/* _handed_out for a chunk the lane served: the shared empty blocks when it allocated
 * nothing, else its new blocks (hand_out_new), or the Python method where that says so.
 * A `_handed_out` replaced on the manager (a wrapper, a broken twin) answers every chunk,
 * as the Python `_extend` calls it for each (looked up as vLLM's calls would). */
PyObject *
handed_out(DropIn *self, PyObject *rid, PyObject *result)
{
    PyObject *instance = PyObject_GenericGetDict(self->manager, NULL);
    int replaced = instance == NULL ? -1 : PyDict_Contains(instance, s_handed_out);
    Py_XDECREF(instance);
    if (replaced < 0) {
        return NULL;
    }
    if (!replaced) {
        int nothing = allocated_nothing((Lane *)self->lane, result);
        if (nothing) {
            return nothing < 0 ? NULL : Py_NewRef(self->empty);
        }
        PyObject *answer = NULL;
        int served = hand_out_new(self, rid, result, &answer);
        if (served) {
            return served < 0 ? NULL : answer;
        }
    }
    PyObject *method = PyObject_GetAttr(self->manager, s_handed_out);
    if (method == NULL) {
        return NULL;
    }
    PyObject *answer = PyObject_CallFunctionObjArgs(method, rid, result, NULL);
    Py_DECREF(method);
    return answer;
}
