/* kvcert.reference._decodelane, the vLLM drop-in's `_wrap` as a module function: a hit's or
 * an admission's tables as vLLM's KVCacheBlocks. */
#include "_decodelane.h"

/* wrap_blocks(views, tables, blocks_class, empty): the drop-in's `_wrap` (kvcert.reference.
 * vllm.tables.BlockTableViews._wrap) for tables that are lists or tuples of block ids within
 * `views`: `empty` when every table is empty, else blocks_class(tuple of one list per table,
 * views[b] for each id b). None where a table or an id is anything else (a negative id
 * included): the definition then answers. Per id it takes the view without a call, which is
 * most of what wrapping a long hit cost in Python. */
PyObject *
wrap_blocks(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[0]) ||
        !(PyTuple_CheckExact(args[1]) || PyList_CheckExact(args[1]))) {
        if (nargs != 4) {
            PyErr_SetString(PyExc_TypeError,
                            "wrap_blocks(views, tables, blocks_class, empty) takes 4 arguments");
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *views = args[0], *tables = args[1];
    Py_ssize_t groups = PySequence_Fast_GET_SIZE(tables), count = PyList_GET_SIZE(views);
    PyObject **table_items = PySequence_Fast_ITEMS(tables);
    int any = 0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        PyObject *table = table_items[g];
        if (!PyTuple_CheckExact(table) && !PyList_CheckExact(table)) {
            Py_RETURN_NONE;
        }
        any = any || PySequence_Fast_GET_SIZE(table) > 0;
    }
    if (!any) {
        return Py_NewRef(args[3]);
    }
    PyObject *wrapped = PyTuple_New(groups);
    if (wrapped == NULL) {
        return NULL;
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        PyObject *table = table_items[g];
        Py_ssize_t length = PySequence_Fast_GET_SIZE(table);
        PyObject *blocks = PyList_New(length);
        if (blocks == NULL) {
            Py_DECREF(wrapped);
            return NULL;
        }
        PyTuple_SET_ITEM(wrapped, g, blocks);
        PyObject **ids = PySequence_Fast_ITEMS(table); /* read again per id: nothing runs */
        for (Py_ssize_t j = 0; j < length; j++) {
            PyObject *id = ids[j];
            Py_ssize_t block = PyLong_CheckExact(id) ? PyLong_AsSsize_t(id) : -1;
            if (block < 0 || block >= count) {
                PyErr_Clear();
                Py_DECREF(wrapped);
                Py_RETURN_NONE;
            }
            PyList_SET_ITEM(blocks, j, Py_NewRef(PyList_GET_ITEM(views, block)));
        }
    }
    PyObject *answer = PyObject_CallOneArg(args[2], wrapped);
    Py_DECREF(wrapped);
    return answer;
}
