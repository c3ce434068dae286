/* kvcert.reference._decodelane.DropIn, the type: what it is built from (the manager, its
 * Python definitions and its state groups), its garbage-collection hooks and its interned
 * names. Its calls are in _decodelane_dropin.c. */
#include "_decodelane_dropin.h"

PyObject *s_request_id, *s_num_computed_tokens, *s_all_token_ids,
    *s_pending, *s_keep, *s_core, *s_lane, *s_handed_out, *s_append,
    *s_popleft, *s_num_lookahead_tokens, *s_progress_of, *s_check_started, *s_zeroed,
    *s_seen, *s_blocks, *s_check_columns, *s_wrapped, *s_new_ids, *s_events, *zero;
PyObject *deque_type, *deque_append, *deque_popleft;

static int
DropIn_init(DropIn *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"manager", "general", "pending", "start_chunk", "end_step",
                            "state_columns", "token_list", NULL};
    PyObject *manager, *general, *pending, *start_chunk, *end_step, *state_columns, *token_list;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOO:DropIn", names, &manager, &general,
                                     &pending, &start_chunk, &end_step, &state_columns,
                                     &token_list)) {
        return -1;
    }
    if (token_list != Py_None && !PyType_Check(token_list)) {
        PyErr_SetString(PyExc_TypeError, "token_list: vLLM's ConstantList class, or None");
        return -1;
    }
    Py_ssize_t states = PyTuple_Check(state_columns) ? PyTuple_GET_SIZE(state_columns) : -1;
    Py_ssize_t *state_group = PyMem_Calloc((size_t)(states > 0 ? states : 1), sizeof(Py_ssize_t));
    long long *state_size = PyMem_Calloc((size_t)(states > 0 ? states : 1), sizeof(long long));
    if (state_group == NULL || state_size == NULL) {
        PyMem_Free(state_group);
        PyMem_Free(state_size);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < states; k++) {
        PyObject *pair = PyTuple_GET_ITEM(state_columns, k);
        long long g = -1, size = 0;
        if (PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2) {
            g = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 0));
            size = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
        }
        if (g < 0 || size < 1) {
            states = -1;
            break;
        }
        state_group[k] = (Py_ssize_t)g, state_size[k] = size;
    }
    if (states < 0) {
        PyMem_Free(state_group);
        PyMem_Free(state_size);
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "state_columns: a tuple of (group index >= 0, "
                                         "block size >= 1) pairs of ints");
        return -1;
    }
    PyMem_Free(self->state_group);
    PyMem_Free(self->state_size);
    self->states = states, self->state_group = state_group, self->state_size = state_size;
    PyObject *core = PyObject_GetAttr(manager, s_core);
    PyObject *lane = core ? PyObject_GetAttr(core, s_lane) : NULL;
    PyObject *got[] = {
        core ? PyObject_GetAttrString(core, "_requests") : NULL,
        PyObject_GetAttrString(manager, "_tracked"),
        PyObject_GetAttrString(manager, "empty_kv_cache_blocks"),
        PyObject_GetAttrString(manager, "max_model_len"),
    };
    int ok = lane != NULL && got[0] && got[1] && got[2] && got[3];
    if (ok && (!PyObject_TypeCheck(lane, &LaneType) || !PyDict_CheckExact(got[0]) ||
               !PyDict_CheckExact(got[1]))) {
        PyErr_SetString(PyExc_TypeError, "DropIn serves a drop-in manager whose core runs the "
                                         "decode lane (kvcert.reference.vllm.lane)");
        ok = 0;
    }
    long long limit = ok ? PyLong_AsLongLong(got[3]) : 0;
    if (ok && (PyErr_Occurred() || limit < 1)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "the manager's max_model_len must be a positive int");
        ok = 0;
    }
    if (ok) {
        PyObject **fields[] = {&self->manager, &self->core,     &self->lane,
                               &self->requests, &self->tracked, &self->empty,
                               &self->general, &self->pending,  &self->start_chunk,
                               &self->end_step, &self->token_list};
        PyObject *values[] = {manager, core,    lane,        got[0],   got[1],    got[2],
                              general, pending, start_chunk, end_step, token_list};
        for (size_t k = 0; k < sizeof(values) / sizeof(values[0]); k++) {
            Py_XSETREF(*fields[k], Py_NewRef(values[k]));
        }
        self->max_model_len = limit;
        self->vectorcall = (vectorcallfunc)DropIn_call;
    }
    Py_XDECREF(core);
    Py_XDECREF(lane);
    for (size_t k = 0; k < sizeof(got) / sizeof(got[0]); k++) {
        Py_XDECREF(got[k]);
    }
    return ok ? 0 : -1;
}

static int
DropIn_traverse(DropIn *self, visitproc visit, void *arg)
{
    Py_VISIT(self->manager);
    Py_VISIT(self->core);
    Py_VISIT(self->lane);
    Py_VISIT(self->requests);
    Py_VISIT(self->tracked);
    Py_VISIT(self->empty);
    Py_VISIT(self->general);
    Py_VISIT(self->pending);
    Py_VISIT(self->start_chunk);
    Py_VISIT(self->end_step);
    Py_VISIT(self->token_list);
    return 0;
}

static int
DropIn_clear(DropIn *self)
{
    Py_CLEAR(self->manager);
    Py_CLEAR(self->core);
    Py_CLEAR(self->lane);
    Py_CLEAR(self->requests);
    Py_CLEAR(self->tracked);
    Py_CLEAR(self->empty);
    Py_CLEAR(self->general);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->start_chunk);
    Py_CLEAR(self->end_step);
    Py_CLEAR(self->token_list);
    return 0;
}

static void
DropIn_dealloc(DropIn *self)
{
    PyObject_GC_UnTrack(self);
    DropIn_clear(self);
    PyMem_Free(self->state_group);
    PyMem_Free(self->state_size);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Called before init (or after a failed one): the Python method answers every call. */
static PyObject *
DropIn_unready(DropIn *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyErr_SetString(PyExc_TypeError, "DropIn was not initialised");
    return NULL;
}

static PyObject *
DropIn_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    DropIn *self = (DropIn *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->vectorcall = (vectorcallfunc)DropIn_unready;
    }
    return (PyObject *)self;
}

static PyMethodDef DropIn_methods[] = {
    {"start_pending", (PyCFunction)DropIn_start_pending, METH_O,
     "start_pending(requests): the drop-in's start_pending, its decode chunks through the "
     "core's lane"},
    {"end_step", (PyCFunction)(void (*)(void))DropIn_end_step, METH_FASTCALL | METH_KEYWORDS,
     "end_step(step=None): the drop-in's end_step, through the core's lane"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject DropInType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcert.reference._decodelane.DropIn",
    .tp_basicsize = sizeof(DropIn),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The vLLM drop-in's allocate_slots (this object, called), start_pending and "
              "end_step, for decode chunks, through the core's decode lane.",
    .tp_new = DropIn_new,
    .tp_init = (initproc)DropIn_init,
    .tp_traverse = (traverseproc)DropIn_traverse,
    .tp_clear = (inquiry)DropIn_clear,
    .tp_dealloc = (destructor)DropIn_dealloc,
    .tp_vectorcall_offset = offsetof(DropIn, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_methods = DropIn_methods,
};

/* The interned names, at import. */
int
dropin_ready(void)
{
    struct {
        PyObject **name;
        const char *text;
    } strings[] = {
        {&s_request_id, "request_id"}, {&s_num_computed_tokens, "num_computed_tokens"},
        {&s_all_token_ids, "all_token_ids"},
        {&s_pending, "pending"}, {&s_keep, "keep"}, {&s_core, "core"},
        {&s_lane, "_lane"}, {&s_handed_out, "_handed_out"},
        {&s_append, "append"}, {&s_popleft, "popleft"},
        {&s_num_lookahead_tokens, "num_lookahead_tokens"}, {&s_progress_of, "progress_of"},
        {&s_check_started, "_check_started"},
        {&s_zeroed, "_zeroed"}, {&s_seen, "seen"}, {&s_blocks, "blocks"},
        {&s_check_columns, "_check_runner_columns"}, {&s_wrapped, "_x"},
        {&s_new_ids, "_new_ids"}, {&s_events, "enable_kv_cache_events"},
    };
    for (size_t k = 0; k < sizeof(strings) / sizeof(strings[0]); k++) {
        *strings[k].name = PyUnicode_InternFromString(strings[k].text);
        if (*strings[k].name == NULL) {
            return -1;
        }
    }
    zero = PyLong_FromLong(0);
    PyObject *collections = PyImport_ImportModule("collections");
    deque_type = collections ? PyObject_GetAttrString(collections, "deque") : NULL;
    Py_XDECREF(collections);
    deque_append = deque_type ? PyObject_GetAttr(deque_type, s_append) : NULL;
    deque_popleft = deque_append ? PyObject_GetAttr(deque_type, s_popleft) : NULL;
    if (zero == NULL || deque_popleft == NULL || !PyType_Check(deque_type)) {
        return -1;
    }
    return PyType_Ready(&DropInType);
}
