/* kvcert.reference._refcounts: the pool's reference counting over a run of blocks, compiled.
 *
 * The same contract as kvcert.reference.refcounts (the pure-Python definitions, and what
 * tests/reference/test_refcounts.py holds these equal to). A hit takes a hundred blocks and
 * a finished request gives them back; one C loop over the array('i') of counts replaces a
 * Python loop per block. Every block is checked against the array's bounds before any count
 * changes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* For `name(counts, blocks)`: the counts' buffer and the blocks as a fast sequence, every
 * block in range; 0 on error. */
static int
open_run(PyObject *const *args, Py_ssize_t nargs, const char *name, Py_buffer *view,
         PyObject **run)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(counts, blocks) takes 2 arguments", name);
        return 0;
    }
    PyObject *counts = args[0], *blocks = args[1];
    if (PyObject_GetBuffer(counts, view, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        return 0;
    }
    if (view->itemsize != sizeof(int) || view->format == NULL || strcmp(view->format, "i") != 0) {
        PyErr_SetString(PyExc_TypeError, "counts must be an array('i')");
        PyBuffer_Release(view);
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
        if (block < 0 || block >= size) {
            PyErr_Format(PyExc_IndexError, "block %zd is outside the pool (0..%zd)", block,
                         size - 1);
            goto fail;
        }
    }
    return 1;
fail:
    Py_DECREF(*run);
    PyBuffer_Release(view);
    return 0;
}

/* Add `step` to each listed block's count, in order; the blocks whose count was `from`
 * before their own step (each occurrence counts: a block listed twice is stepped twice). */
static PyObject *
step_run(PyObject *const *args, Py_ssize_t nargs, int step, int from, const char *name)
{
    Py_buffer view;
    PyObject *run;
    if (!open_run(args, nargs, name, &view, &run)) {
        return NULL;
    }
    int *counts = view.buf;
    PyObject *crossed = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(run);
    PyObject **items = PySequence_Fast_ITEMS(run);
    for (Py_ssize_t k = 0; crossed != NULL && k < n; k++) {
        Py_ssize_t block = PyLong_AsSsize_t(items[k]);
        int before = counts[block];
        counts[block] = before + step;
        if (before == from && PyList_Append(crossed, items[k]) < 0) {
            Py_CLEAR(crossed);
        }
    }
    Py_DECREF(run);
    PyBuffer_Release(&view);
    return crossed;
}

static PyObject *
hold(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return step_run(args, nargs, 1, 0, "hold");
}

static PyObject *
drop(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    return step_run(args, nargs, -1, 1, "drop");
}

static PyObject *
set_one(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    PyObject *run;
    if (!open_run(args, nargs, "set_one", &view, &run)) {
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

static PyMethodDef methods[] = {
    {"hold", (PyCFunction)(void (*)(void))hold, METH_FASTCALL,
     "hold(counts, blocks) -> the blocks that were free (count 0), in order; counts += 1"},
    {"drop", (PyCFunction)(void (*)(void))drop, METH_FASTCALL,
     "drop(counts, blocks) -> the blocks whose count reached 0, in order; counts -= 1"},
    {"set_one", (PyCFunction)(void (*)(void))set_one, METH_FASTCALL,
     "set_one(counts, blocks): each listed block's count becomes 1"},
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
