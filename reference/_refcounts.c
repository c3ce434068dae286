/* kvcert.reference._refcounts: the pool's reference counting over a run of blocks, compiled.
 *
 * The same contract as kvcert.reference.refcounts (the pure-Python definitions, and what
 * tests/reference/test_refcounts.py holds these equal to). A hit takes a hundred blocks and
 * a finished request gives them back; one C loop over the array('i') of counts replaces a
 * Python loop per block. Every block is checked against the array's bounds before any count
 * changes. Under lru a free block's entry is its free-queue predecessor, negated, and `hold`
 * given the queue's successor array unlinks the blocks it revives in the same pass; `link`
 * and `unlink_head` are that queue's runs at its tail and its head.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* `array`'s writable buffer when it is an array('i'), else 0 with a TypeError naming it. */
static int
int_buffer(PyObject *array, Py_buffer *view, const char *what)
{
    if (!PyObject_CheckBuffer(array)) {
        PyErr_Format(PyExc_TypeError, "%s must be an array('i'), got %.100s", what,
                     Py_TYPE(array)->tp_name);
        return 0;
    }
    if (PyObject_GetBuffer(array, view, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        return 0;
    }
    if (view->itemsize != sizeof(int) || view->format == NULL || strcmp(view->format, "i") != 0) {
        PyErr_Format(PyExc_TypeError, "%s must be an array('i')", what);
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* For `name(counts, blocks)`: the counts' buffer and the blocks as a fast sequence, every
 * block in low..len(counts) - 1; 0 on error. */
static int
open_run(PyObject *const *args, const char *name, Py_buffer *view, PyObject **run,
         Py_ssize_t low)
{
    PyObject *counts = args[0], *blocks = args[1];
    if (!int_buffer(counts, view, "counts")) {
        return 0;
    }
    *run = PySequence_Fast(blocks, "blocks must be a sequence");
    if (*run == NULL) {
        PyBuffer_Release(view);
        return 0;
    }
    Py_ssize_t size = view->len / (Py_ssize_t)sizeof(int);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(*run);
    PyObject **items = PySequence_Fast_ITEMS(*run);
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t block = PyLong_AsSsize_t(items[k]);
        if (block == -1 && PyErr_Occurred()) {
            goto fail;
        }
        if (block < low || block >= size) {
            PyErr_Format(PyExc_IndexError, "block %zd is outside the pool's blocks (%zd..%zd)",
                         block, low, size - 1);
            goto fail;
        }
    }
    return 1;
fail:
    Py_DECREF(*run);
    PyBuffer_Release(view);
    return 0;
}

/* Take one from each listed block's count, in order; the blocks whose count reached 0
 * (each occurrence counts: a block listed twice is stepped twice). */
static PyObject *
drop(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    PyObject *run;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "drop(counts, blocks) takes 2 arguments");
        return NULL;
    }
    if (!open_run(args, "drop", &view, &run, 0)) {
        return NULL;
    }
    int *counts = view.buf;
    PyObject *freed = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(run);
    PyObject **items = PySequence_Fast_ITEMS(run);
    for (Py_ssize_t k = 0; freed != NULL && k < n; k++) {
        Py_ssize_t block = PyLong_AsSsize_t(items[k]);
        if (--counts[block] == 0 && PyList_Append(freed, items[k]) < 0) {
            Py_CLEAR(freed);
        }
    }
    Py_DECREF(run);
    PyBuffer_Release(&view);
    return freed;
}

/* Add one to each listed block's count; the blocks that were free (entry 0 or less), in
 * order, each now held once. With `links` (the lru queue's successors; a free block's entry
 * is its predecessor, negated, block 0 the queue's sentinel) each revived block leaves the
 * queue first. */
static PyObject *
hold(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "hold(counts, blocks, links=None) takes 2 or 3 arguments");
        return NULL;
    }
    int linked = nargs == 3 && args[2] != Py_None;
    Py_buffer view, links_view;
    PyObject *run;
    Py_ssize_t size = 0;
    if (linked) {
        if (!int_buffer(args[2], &links_view, "links")) {
            return NULL;
        }
        size = links_view.len / (Py_ssize_t)sizeof(int);
        Py_ssize_t counts_size = PyObject_Length(args[0]);
        if (counts_size >= 0 && counts_size != size) {
            PyErr_Format(PyExc_ValueError, "links has %zd entries, counts %zd: one per block",
                         size, counts_size);
        }
        if (counts_size != size) {
            PyBuffer_Release(&links_view);
            return NULL;
        }
    }
    if (!open_run(args, "hold", &view, &run, linked)) {
        if (linked) {
            PyBuffer_Release(&links_view);
        }
        return NULL;
    }
    int *counts = view.buf, *links = linked ? links_view.buf : NULL;
    PyObject *revived = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(run);
    PyObject **items = PySequence_Fast_ITEMS(run);
    for (Py_ssize_t k = 0; revived != NULL && k < n; k++) {
        Py_ssize_t block = PyLong_AsSsize_t(items[k]);
        int entry = counts[block];
        if (entry > 0) {
            counts[block] = entry + 1;
            continue;
        }
        if (links != NULL) { /* its neighbours close up */
            long long before = -(long long)entry, after = links[block];
            if (before >= size || after < 0 || after >= size) {
                PyErr_Format(PyExc_ValueError,
                             "block %zd's free-queue neighbours (%lld, %lld) are outside the "
                             "pool: the counts and links were not kept by one queue",
                             block, before, after);
                Py_CLEAR(revived);
                break;
            }
            links[before] = (int)after;
            counts[after] = (int)-before;
        }
        counts[block] = 1;
        if (PyList_Append(revived, items[k]) < 0) {
            Py_CLEAR(revived);
        }
    }
    Py_DECREF(run);
    PyBuffer_Release(&view);
    if (linked) {
        PyBuffer_Release(&links_view);
    }
    return revived;
}

static PyObject *
set_one(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    PyObject *run;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_one(counts, blocks) takes 2 arguments");
        return NULL;
    }
    if (!open_run(args, "set_one", &view, &run, 0)) {
        return NULL;
    }
    int *counts = view.buf;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(run);
    PyObject **items = PySequence_Fast_ITEMS(run);
    for (Py_ssize_t k = 0; k < n; k++) {
        counts[PyLong_AsSsize_t(items[k])] = 1;
    }
    Py_DECREF(run);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* How many listed blocks no one holds (entry 0 or less), each listing counted. */
static PyObject *
count_free(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    PyObject *run;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "count_free(counts, blocks) takes 2 arguments");
        return NULL;
    }
    if (!open_run(args, "count_free", &view, &run, 0)) {
        return NULL;
    }
    const int *counts = view.buf;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(run), free = 0;
    PyObject **items = PySequence_Fast_ITEMS(run);
    for (Py_ssize_t k = 0; k < n; k++) {
        free += counts[PyLong_AsSsize_t(items[k])] <= 0;
    }
    Py_DECREF(run);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(free);
}

/* The counts and links buffers of the lru ring, one entry per block each; 0 on error. */
static int
open_ring(PyObject *const *args, Py_buffer *counts, Py_buffer *links, Py_ssize_t *size)
{
    if (!int_buffer(args[0], counts, "counts")) {
        return 0;
    }
    if (!int_buffer(args[1], links, "links")) {
        PyBuffer_Release(counts);
        return 0;
    }
    *size = counts->len / (Py_ssize_t)sizeof(int);
    if (links->len != counts->len) {
        PyErr_Format(PyExc_ValueError, "links has %zd entries, counts %zd: one per block",
                     links->len / (Py_ssize_t)sizeof(int), *size);
        PyBuffer_Release(links);
        PyBuffer_Release(counts);
        return 0;
    }
    return 1;
}

/* The lru queue's tail takes the listed blocks, in order (FreeQueue.add). */
static PyObject *
link_run(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "link(counts, links, blocks) takes 3 arguments");
        return NULL;
    }
    Py_buffer counts_view, links_view;
    Py_ssize_t size;
    if (!open_ring(args, &counts_view, &links_view, &size)) {
        return NULL;
    }
    int *counts = counts_view.buf, *links = links_view.buf;
    PyObject *run = PySequence_Fast(args[2], "blocks must be a sequence");
    PyObject *result = NULL;
    if (run == NULL) {
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(run);
    PyObject **items = PySequence_Fast_ITEMS(run);
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t block = PyLong_AsSsize_t(items[k]);
        if (block == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (block < 1 || block >= size) {
            PyErr_Format(PyExc_IndexError, "block %zd is outside the pool's blocks (1..%zd)",
                         block, size - 1);
            goto done;
        }
    }
    if (n) {
        long long last = -(long long)counts[0];
        if (last < 0 || last >= size) {
            PyErr_Format(PyExc_ValueError,
                         "the queue's tail %lld is outside the pool: not kept by one queue",
                         last);
            goto done;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            int block = (int)PyLong_AsSsize_t(items[k]);
            links[last] = block;
            counts[block] = (int)-last;
            last = block;
        }
        links[last] = 0;
        counts[0] = (int)-last;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(run);
    PyBuffer_Release(&links_view);
    PyBuffer_Release(&counts_view);
    return result;
}

/* The first `count` blocks of the lru queue, unlinked as one run (FreeQueue.pop_many). */
static PyObject *
unlink_head(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "unlink_head(counts, links, count) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer counts_view, links_view;
    Py_ssize_t size;
    if (!open_ring(args, &counts_view, &links_view, &size)) {
        return NULL;
    }
    int *counts = counts_view.buf, *links = links_view.buf;
    PyObject *taken = PyList_New(count > 0 ? count : 0);
    long long block = links[0];
    for (Py_ssize_t k = 0; taken != NULL && k < count; k++) {
        if (block < 1 || block >= size) {
            PyErr_Format(PyExc_ValueError,
                         "the queue holds fewer than %zd blocks, or is not one queue", count);
            Py_CLEAR(taken);
            break;
        }
        PyObject *number = PyLong_FromLongLong(block);
        if (number == NULL) {
            Py_CLEAR(taken);
            break;
        }
        PyList_SET_ITEM(taken, k, number);
        block = links[block];
    }
    if (taken != NULL && (block < 0 || block >= size)) {
        PyErr_Format(PyExc_ValueError, "block %lld follows the run: not kept by one queue",
                     block);
        Py_CLEAR(taken);
    }
    if (taken != NULL) {
        links[0] = (int)block;
        counts[block] = 0; /* the new head's predecessor is the sentinel */
    }
    PyBuffer_Release(&links_view);
    PyBuffer_Release(&counts_view);
    return taken;
}

/* A whole request's release under lru (refcounts.py_release_tables): table g from its last
 * position down to lows[g], null entries skipped, group by group, each block dropped once;
 * those reaching 0 join the queue's tail in that order. Everything is checked first. */
static PyObject *
release_tables(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "release_tables(counts, links, tables, lows) takes 4 arguments");
        return NULL;
    }
    Py_buffer counts_view, links_view;
    Py_ssize_t size;
    if (!open_ring(args, &counts_view, &links_view, &size)) {
        return NULL;
    }
    int *counts = counts_view.buf, *links = links_view.buf, *freed = NULL;
    PyObject *tables = PySequence_Fast(args[2], "tables must be a sequence");
    PyObject *lows = tables == NULL ? NULL : PySequence_Fast(args[3], "lows must be a sequence");
    PyObject **runs = NULL, *result = NULL;
    Py_ssize_t *starts = NULL, n = 0, made = 0, total = 0, count = 0;
    if (lows == NULL) {
        goto done;
    }
    n = PySequence_Fast_GET_SIZE(tables);
    if (PySequence_Fast_GET_SIZE(lows) != n) {
        PyErr_Format(PyExc_ValueError, "%zd tables and %zd lows: one low per table", n,
                     PySequence_Fast_GET_SIZE(lows));
        goto done;
    }
    runs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
    starts = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    if (runs == NULL || starts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t g = 0; g < n; g++) { /* every low and table checked before any change */
        Py_ssize_t low = PyLong_AsSsize_t(PySequence_Fast_ITEMS(lows)[g]);
        if (low == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (low < 0) {
            PyErr_Format(PyExc_ValueError, "a table's low position must be 0 or more, got %zd",
                         low);
            goto done;
        }
        runs[g] = PySequence_Fast(PySequence_Fast_ITEMS(tables)[g], "a table must be a sequence");
        if (runs[g] == NULL) {
            goto done;
        }
        made = g + 1;
        Py_ssize_t length = PySequence_Fast_GET_SIZE(runs[g]);
        starts[g] = low < length ? low : length;
    }
    for (Py_ssize_t g = 0; g < n; g++) { /* then the blocks, as `drop` checks its listing */
        PyObject **items = PySequence_Fast_ITEMS(runs[g]);
        for (Py_ssize_t j = PySequence_Fast_GET_SIZE(runs[g]) - 1; j >= starts[g]; j--) {
            Py_ssize_t block = PyLong_AsSsize_t(items[j]);
            if (block == -1 && PyErr_Occurred()) {
                goto done;
            }
            if (block < 0 || block >= size) {
                PyErr_Format(PyExc_IndexError,
                             "block %zd is outside the pool's blocks (0..%zd)", block, size - 1);
                goto done;
            }
            total += block != 0;
        }
    }
    long long last = -(long long)counts[0];
    if (total && (last < 0 || last >= size)) {
        PyErr_Format(PyExc_ValueError,
                     "the queue's tail %lld is outside the pool: not kept by one queue", last);
        goto done;
    }
    freed = PyMem_Malloc((size_t)(total ? total : 1) * sizeof(int));
    if (freed == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t g = 0; g < n; g++) { /* every block dropped first, as `drop`, then linked */
        PyObject **items = PySequence_Fast_ITEMS(runs[g]);
        for (Py_ssize_t j = PySequence_Fast_GET_SIZE(runs[g]) - 1; j >= starts[g]; j--) {
            int block = (int)PyLong_AsSsize_t(items[j]);
            if (block && --counts[block] == 0) {
                freed[count++] = block;
            }
        }
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        links[last] = freed[k];
        counts[freed[k]] = (int)-last;
        last = freed[k];
    }
    if (count) {
        links[last] = 0;
        counts[0] = (int)-last;
    }
    result = PyLong_FromSsize_t(count);
done:
    for (Py_ssize_t g = 0; g < made; g++) {
        Py_DECREF(runs[g]);
    }
    PyMem_Free(runs);
    PyMem_Free(starts);
    PyMem_Free(freed);
    Py_XDECREF(lows);
    Py_XDECREF(tables);
    PyBuffer_Release(&links_view);
    PyBuffer_Release(&counts_view);
    return result;
}

static PyMethodDef methods[] = {
    {"hold", (PyCFunction)(void (*)(void))hold, METH_FASTCALL,
     "hold(counts, blocks, links=None) -> the blocks that were free (entry 0 or less), in "
     "order, unlinked from the lru queue when its links are given, each now held once; "
     "other counts += 1"},
    {"drop", (PyCFunction)(void (*)(void))drop, METH_FASTCALL,
     "drop(counts, blocks) -> the blocks whose count reached 0, in order; counts -= 1"},
    {"set_one", (PyCFunction)(void (*)(void))set_one, METH_FASTCALL,
     "set_one(counts, blocks): each listed block's count becomes 1"},
    {"count_free", (PyCFunction)(void (*)(void))count_free, METH_FASTCALL,
     "count_free(counts, blocks) -> how many listed blocks have an entry of 0 or less"},
    {"link", (PyCFunction)(void (*)(void))link_run, METH_FASTCALL,
     "link(counts, links, blocks): the lru queue's tail takes the blocks, in order"},
    {"unlink_head", (PyCFunction)(void (*)(void))unlink_head, METH_FASTCALL,
     "unlink_head(counts, links, count) -> the first count blocks of the lru queue, "
     "unlinked as one run"},
    {"release_tables", (PyCFunction)(void (*)(void))release_tables, METH_FASTCALL,
     "release_tables(counts, links, tables, lows) -> how many blocks joined the lru queue's "
     "tail: each table from its last position down to its low, null entries skipped, "
     "dropped once, those reaching 0 linked in that order"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcert.reference._refcounts",
    .m_doc = "Reference counts over a run of blocks (see kvcert.reference.refcounts).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__refcounts(void)
{
    return PyModule_Create(&module);
}
