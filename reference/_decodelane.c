/* kvcert.reference._decodelane: a decode step and its registration, compiled.
 *
 * The same contracts as KVCacheManager.extend for one decode chunk (sampled tokens after
 * every known one, nothing in flight, no checkpoint) and commit.Registrar.register, for a
 * layout whose groups are all attention (full, sliding window, chunked local) over an lru
 * pool that tracks no liveness and records no events (kvcert.reference.decode_lane says
 * when a manager builds a lane, and tests/reference/test_decode_lane.py holds the compiled
 * and the Python paths equal, state for state). In Python a step that changes tables costs
 * about ten microseconds per request: the table plan (ALLOC-HOLD-1, ALLOC-SKIP-1,
 * ALLOC-WRITE-1), the release (ALLOC-FREE-1, lru), the allocation (ALLOC-EVICT-1), the
 * decode bounds (ALLOC-SPEC-1's quiet step) and at the step's end the registration
 * (ALLOC-COMMIT-1, HASH-CHAIN-1). Here each is one call over the request's own lists, its
 * digest chains and the pool's arrays.
 *
 * `extend` and `register` change nothing and answer None when the call is outside that
 * contract (a token that is not an id, a budget below the tokens, a chunk in flight,
 * max_model_len, a pool that cannot fit the step, a request with inner checkpoints): the
 * Python code then answers it, errors and Waiting included. Block 0 is the null block; a
 * free block's count entry is its lru predecessor, negated, and `links` the queue's
 * successors (kvcert.reference.refcounts).
 *
 * This file holds the type, the module and attribute access; _decodelane_step.c the step,
 * _decodelane_commit.c the registration, _decodelane.h what they share.
 */
#include "_decodelane.h"

PyObject *s_checkpoints, *s_computed, *s_scheduled, *s_lookahead, *s_decoding, *s_tokens,
    *s_tables, *s_held_from, *s_quiet_end, *s_quiet_state, *s_quiet_slots, *s_quiet_slots_floor,
    *s_num_free, *s_num_registered, *s_forget_run, *s_extend, *s_unique_chains, *s_chains,
    *s_registered, *s_commit_at, *s_size, *s_digests, *s_stream, *s_fed, *s_state, *s_records,
    *s_boundaries, *s_bind_run, *s_pipelined, *s_published, *s_publish, *s_fromlist, *s_take,
    *s_step, *s_in_flight, *s_tails, *s_requests, *s_lane_registers, *s_published_in_step,
    *s_register;

static PyObject *array_type; /* array.array: a request's tokens (hashing.decode_tokens) */
static PyObject *array_fromlist; /* its fromlist, called without a lookup per call */

/* Attributes of the objects the lane reads (Request, Chain, BlockPool: classes with
 * __slots__) go through their member descriptors, as attribute access does once it has
 * looked the descriptor up: each (type, name) pair's lookup is remembered, holding the type
 * and the (interned) name, in an open-addressed table that never evicts. The pairs are few
 * (the lane reads some sixty names of a handful of types), so probes stay short wherever
 * the allocator placed the types and names; a table that replaced entries (direct-mapped,
 * as it was) let two hot pairs sharing a line evict each other on every call, by chance of
 * the process's heap layout. Past SLOT_LIMIT pairs, the rest are not remembered. */
typedef struct {
    PyTypeObject *type; /* NULL: an empty entry */
    PyObject *name;
    PyMemberDef *member; /* NULL: not a slot, attribute access serves it */
} Slot;

#define SLOT_TABLE 1024 /* a power of two */
#define SLOT_LIMIT (SLOT_TABLE / 4)
static Slot slots[SLOT_TABLE];
static int slots_used;

/* slot_of's first sight of a pair: its member descriptor looked up and, while there is
 * room, remembered at `at` (the empty entry its probe ended on). Kept out of line, so the
 * lookup that finds its pair (every call after the first) saves no registers for it. */
static Py_NO_INLINE PyMemberDef *
slot_learn(PyTypeObject *type, PyObject *name, size_t at)
{
    PyObject *descriptor = PyObject_GetAttr((PyObject *)type, name);
    PyMemberDef *member = NULL;
    if (descriptor == NULL) {
        PyErr_Clear(); /* attribute access will say what is missing */
    } else if (Py_IS_TYPE(descriptor, &PyMemberDescr_Type) &&
               PyType_IsSubtype(type, PyDescr_TYPE(descriptor))) {
        member = ((PyMemberDescrObject *)descriptor)->d_member;
    }
    Py_XDECREF(descriptor);
    if (slots_used < SLOT_LIMIT) {
        slots[at] = (Slot){(PyTypeObject *)Py_NewRef(type), Py_NewRef(name), member};
        slots_used++;
    }
    return member;
}

static inline PyMemberDef *
slot_of(PyObject *obj, PyObject *name)
{
    PyTypeObject *type = Py_TYPE(obj);
    uint64_t mixed = ((uint64_t)(uintptr_t)type ^ ((uint64_t)(uintptr_t)name << 17)) *
                     UINT64_C(0x9E3779B97F4A7C15);
    size_t at = (size_t)(mixed >> 54); /* the top 10 bits: one of SLOT_TABLE */
    for (; slots[at].type != NULL; at = (at + 1) & (SLOT_TABLE - 1)) {
        if (slots[at].type == type && slots[at].name == name) {
            return slots[at].member;
        }
    }
    return slot_learn(type, name, at);
}

PyObject *
lane_get(PyObject *obj, PyObject *name)
{
    PyMemberDef *member = slot_of(obj, name);
    return member ? PyMember_GetOne((const char *)obj, member) : PyObject_GetAttr(obj, name);
}

int
lane_set(PyObject *obj, PyObject *name, PyObject *value)
{
    PyMemberDef *member = slot_of(obj, name);
    return member ? PyMember_SetOne((char *)obj, member, value)
                  : PyObject_SetAttr(obj, name, value);
}

/* An attribute of `obj` as a C integer; 0 on error. Past a long long it is an error, or with
 * `saturate` (a bound, where TOKEN_LIMIT means none) LLONG_MAX. */
static int
read_ll(PyObject *obj, PyObject *name, long long *value, int saturate)
{
    PyObject *attr = lane_get(obj, name);
    if (attr == NULL) {
        return 0;
    }
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(attr, &overflow);
    Py_DECREF(attr);
    if (overflow > 0 && saturate) {
        *value = LLONG_MAX;
    } else if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "a request counter is outside 64 bits");
        return 0;
    }
    return !(*value == -1 && PyErr_Occurred());
}

int
lane_get_ll(PyObject *obj, PyObject *name, long long *value)
{
    return read_ll(obj, name, value, 0);
}

int
lane_get_bound(PyObject *obj, PyObject *name, long long *value)
{
    return read_ll(obj, name, value, 1);
}

/* tokens.extend(appended), for decode tokens (a list or tuple of valid ids) appended to a
 * request's array: a list through array.fromlist, which sizes the array once where extend
 * iterates. The answer (None) or NULL. */
PyObject *
lane_append_tokens(PyObject *tokens, PyObject *appended)
{
    if (Py_IS_TYPE(tokens, (PyTypeObject *)array_type) && PyList_CheckExact(appended)) {
        PyObject *args[2] = {tokens, appended};
        return PyObject_Vectorcall(array_fromlist, args, 2, NULL);
    }
    return PyObject_CallMethodOneArg(tokens, s_extend, appended);
}

int
lane_set_ll(PyObject *obj, PyObject *name, long long value)
{
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return 0;
    }
    int failed = lane_set(obj, name, number);
    Py_DECREF(number);
    return failed == 0;
}


static const char *KIND_NAMES =
    "kinds are 0 (full), 1 (sliding window), 2 (chunked local), 3 (state)";

static int
Lane_init(Lane *lane, PyObject *args, PyObject *kwargs)
{
    PyObject *kinds, *sizes, *spans, *spares, *every_state, *limit, *key_lookahead;
    PyObject *commit_delay;
    static char *names[] = {"kinds", "sizes", "spans", "spares", "every_state", "limit",
                            "key_lookahead", "commit_delay", "unit", "pool", "counts", "links",
                            "keys", "evictions", "dead_evictions", "no_blocks", "token_limit",
                            "scheduled", "quiet_steps", "same_pass", "registers", "commits",
                            NULL};
    PyObject *pool, *counts, *links, *keys, *evictions, *dead, *no_blocks, *token_limit;
    PyObject *scheduled, *quiet_steps, *commits;
    long long unit;
    int same_pass, registers;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOLOOOOOOOOOOppO:DecodeLane", names,
                                     &kinds, &sizes, &spans, &spares, &every_state, &limit,
                                     &key_lookahead, &commit_delay, &unit, &pool, &counts,
                                     &links, &keys, &evictions, &dead, &no_blocks, &token_limit,
                                     &scheduled, &quiet_steps, &same_pass, &registers,
                                     &commits)) {
        return -1;
    }
    lane->same_pass = same_pass, lane->registers = registers, lane->published = 0;
    Py_XSETREF(lane->commits, Py_NewRef(commits));
    if (!PyDict_CheckExact(quiet_steps)) {
        PyErr_SetString(PyExc_TypeError, "quiet_steps must be the manager's dict");
        return -1;
    }
    Py_XSETREF(lane->quiet_steps, Py_NewRef(quiet_steps));
    PyObject *one = PyLong_FromLong(1);
    lane->decode_step = one == NULL ? NULL : PyDict_GetItemWithError(quiet_steps, one);
    Py_XDECREF(one);
    if (PyErr_Occurred()) {
        return -1;
    }
    Py_XINCREF(lane->decode_step); /* held: the manager never replaces it */
    if (!PyType_Check(scheduled)) {
        PyErr_SetString(PyExc_TypeError, "scheduled must be the Scheduled class");
        return -1;
    }
    const char *field_names[5] = {"hit", "scheduled", "new_blocks", "tables", "copies"};
    for (int k = 0; k < 5; k++) {
        PyObject *field = PyObject_GetAttrString(scheduled, field_names[k]);
        if (field == NULL) {
            return -1;
        }
        int member = Py_IS_TYPE(field, &PyMemberDescr_Type);
        lane->fields[k] = member ? ((PyMemberDescrObject *)field)->d_member : NULL;
        Py_DECREF(field);
        if (!member) {
            PyErr_Format(PyExc_TypeError, "scheduled: field %s must be a slot", field_names[k]);
            return -1;
        }
    }
    Py_XSETREF(lane->scheduled, (PyTypeObject *)Py_NewRef(scheduled));
    PyObject *per_group[] = {kinds, sizes, spans, spares, every_state, key_lookahead,
                             commit_delay};
    Py_ssize_t groups = PyTuple_Check(kinds) ? PyTuple_GET_SIZE(kinds) : 0;
    for (size_t k = 0; k < sizeof(per_group) / sizeof(per_group[0]); k++) {
        if (!PyTuple_CheckExact(per_group[k]) || PyTuple_GET_SIZE(per_group[k]) != groups ||
            groups == 0) {
            PyErr_SetString(PyExc_TypeError, "kinds, sizes, spans, spares, every_state, "
                                             "key_lookahead and commit_delay are tuples, one "
                                             "item per group");
            return -1;
        }
    }
    if (unit < 1) {
        PyErr_SetString(PyExc_ValueError, "unit (the alignment attention commits in) >= 1");
        return -1;
    }
    lane->unit = unit;
    long long **columns[] = {&lane->size, &lane->span, &lane->spare, &lane->key_lookahead,
                             &lane->commit_delay};
    for (size_t k = 0; k < sizeof(columns) / sizeof(columns[0]); k++) {
        PyMem_Free(*columns[k]);
        *columns[k] = PyMem_Calloc((size_t)groups, sizeof(long long));
    }
    PyMem_Free(lane->kind);
    lane->kind = PyMem_Calloc((size_t)groups, sizeof(int));
    PyMem_Free(lane->every_state);
    lane->every_state = PyMem_Calloc((size_t)groups, sizeof(int));
    if (lane->kind == NULL || lane->size == NULL || lane->span == NULL || lane->spare == NULL ||
        lane->every_state == NULL || lane->key_lookahead == NULL || lane->commit_delay == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int has_state = 0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, g));
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, g));
        long long span = PyLong_AsLongLong(PyTuple_GET_ITEM(spans, g));
        long long ahead = PyLong_AsLongLong(PyTuple_GET_ITEM(key_lookahead, g));
        long long delay = PyLong_AsLongLong(PyTuple_GET_ITEM(commit_delay, g));
        long long spare = PyLong_AsLongLong(PyTuple_GET_ITEM(spares, g));
        long every = PyLong_AsLong(PyTuple_GET_ITEM(every_state, g));
        if (PyErr_Occurred()) {
            return -1;
        }
        /* drafts' positions belong to a state group with a running state (mode align) */
        if (spare < 0 || spare > INT_MAX || every < 0 || every > 1 ||
            (kind != STATE && (spare || every)) || (spare && every)) {
            PyErr_Format(PyExc_ValueError,
                         "group %zd: spares in 0..2**31 - 1 and every_state 0 or 1, both 0 "
                         "unless the group is a state group (3), and spares 0 where "
                         "every_state is 1", g);
            return -1;
        }
        if (kind < FULL || kind > STATE || size < 1 || size > INT_MAX || span < 0 ||
            span > INT_MAX || ((kind == WINDOW || kind == CHUNKED) && span < 1) || ahead < 0 || ahead > INT_MAX ||
            delay < 0 || delay > INT_MAX) {
            PyErr_Format(PyExc_ValueError,
                         "group %zd: %s, a block size in 1..2**31 - 1, a window or chunk in "
                         "that range (0 for full attention), and a key lookahead and commit "
                         "delay in 0..2**31 - 1", g, KIND_NAMES);
            return -1;
        }
        lane->kind[g] = (int)kind, lane->size[g] = size, lane->span[g] = span;
        lane->spare[g] = spare, lane->every_state[g] = (int)every;
        has_state |= kind == STATE;
        lane->key_lookahead[g] = ahead, lane->commit_delay[g] = delay;
    }
    lane->groups = groups;
    lane->has_state = has_state;
    lane->limit = limit == Py_None ? -1 : PyLong_AsLongLong(limit);
    if (lane->limit == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (!PyList_CheckExact(evictions) || !PyList_CheckExact(dead) ||
        !PyTuple_CheckExact(no_blocks)) {
        PyErr_SetString(PyExc_TypeError, "evictions and dead_evictions are the pool's lists, "
                                         "no_blocks a tuple");
        return -1;
    }
    PyObject **fields[] = {&lane->pool, &lane->counts, &lane->links, &lane->keys,
                           &lane->evictions, &lane->dead_evictions, &lane->no_blocks,
                           &lane->token_limit};
    PyObject *values[] = {pool, counts, links, keys, evictions, dead, no_blocks, token_limit};
    for (size_t k = 0; k < sizeof(values) / sizeof(values[0]); k++) {
        Py_XSETREF(*fields[k], Py_NewRef(values[k]));
    }
    return 0;
}

static void
Lane_dealloc(Lane *lane)
{
    PyMem_Free(lane->kind);
    PyMem_Free(lane->size);
    PyMem_Free(lane->span);
    PyMem_Free(lane->spare);
    PyMem_Free(lane->every_state);
    PyMem_Free(lane->key_lookahead);
    PyMem_Free(lane->commit_delay);
    PyMem_Free(lane->released);
    PyMem_Free(lane->wanted);
    Py_XDECREF(lane->pool);
    Py_XDECREF(lane->counts);
    Py_XDECREF(lane->links);
    Py_XDECREF(lane->keys);
    Py_XDECREF(lane->evictions);
    Py_XDECREF(lane->dead_evictions);
    Py_XDECREF(lane->no_blocks);
    Py_XDECREF(lane->token_limit);
    Py_XDECREF(lane->scheduled);
    Py_XDECREF(lane->quiet_steps);
    Py_XDECREF(lane->decode_step);
    Py_XDECREF(lane->commits);
    Py_TYPE(lane)->tp_free((PyObject *)lane);
}

/* take_published() -> the blocks this lane's launches published since the last call (the
 * manager's end_step adds them to what it reports hittable). */
static PyObject *
Lane_take_published(Lane *lane, PyObject *unused)
{
    long long published = lane->published;
    lane->published = 0;
    return PyLong_FromLongLong(published);
}

static PyMethodDef Lane_methods[] = {
    {"publish", (PyCFunction)Lane_publish, METH_O,
     "publish(request) -> how many blocks its chunk just scheduled completes, registered now "
     "as commit.Registrar.publish does (same-pass visibility); None (nothing done) when the "
     "general path must publish"},
    {"take_published", (PyCFunction)Lane_take_published, METH_NOARGS,
     "take_published() -> how many blocks the lane's launches published (same-pass "
     "visibility, ALLOC-VIS-2) since the last call"},
    {"extend", (PyCFunction)(void (*)(void))Lane_extend, METH_FASTCALL,
     "extend(requests, rid, budget, appended, lookahead, step, checkpoint, in_flight, "
     "current) -> the Scheduled of a decode step, with the request's tables, bounds, the "
     "pool and the chunks in flight moved as KVCacheManager.extend's general path moves "
     "them; None (nothing changed) when the general path must answer"},
    {"admit", (PyCFunction)(void (*)(void))Lane_admit, METH_FASTCALL,
     "admit(request, rid, hits, reviving, keep_free, fit_tokens, fit_keep_free, requests, "
     "in_flight, current) -> the Scheduled of an admission whose hit `request` holds, its "
     "first chunk's blocks given and launched as KVCacheManager.admit's general path gives "
     "them; None (nothing changed) when the general path must answer"},
    {"end_chunks", (PyCFunction)(void (*)(void))Lane_end_chunks, METH_FASTCALL,
     "end_chunks(ending, requests) -> [(rid, request, before)] of the ended chunks that may "
     "commit a block; every ended chunk's tokens now count as computed"},
    {"end_step", (PyCFunction)(void (*)(void))Lane_end_step, METH_FASTCALL,
     "end_step(core, step) -> KVCacheManager.end_step(step) for the core this lane serves, "
     "one without `unit U`: how many blocks became hittable; None (nothing done) when the "
     "definition must answer, an invalid step included"},
    {"register", (PyCFunction)(void (*)(void))Lane_register, METH_FASTCALL,
     "register(request, before) -> how many blocks the step ending now completed and "
     "registered, as commit.Registrar.register does; None (nothing done) when the general "
     "path must register"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcert.reference._decodelane.DecodeLane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A manager's decode steps that change tables, for attention layouts under lru.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_methods = Lane_methods,
};

static PyMethodDef module_methods[] = {
    {"wrap_blocks", (PyCFunction)(void (*)(void))wrap_blocks, METH_FASTCALL,
     "wrap_blocks(views, tables, blocks_class, empty): the vLLM drop-in's _wrap for tables of "
     "block ids within views; None where the definition must answer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcert.reference._decodelane",
    .m_doc = "Decode steps that change tables, compiled (see kvcert.reference.decode_lane).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__decodelane(void)
{
    struct {
        PyObject **name;
        const char *text;
    } strings[] = {
        {&s_checkpoints, "checkpoints"}, {&s_computed, "computed"},
        {&s_scheduled, "scheduled"}, {&s_lookahead, "lookahead"},
        {&s_decoding, "decoding"}, {&s_tokens, "tokens"}, {&s_tables, "tables"},
        {&s_held_from, "held_from"}, {&s_quiet_end, "quiet_end"},
        {&s_quiet_state, "quiet_state"}, {&s_quiet_slots, "quiet_slots"},
        {&s_quiet_slots_floor, "quiet_slots_floor"}, {&s_num_free, "num_free"},
        {&s_num_registered, "num_registered"}, {&s_forget_run, "forget_run"},
        {&s_extend, "extend"}, {&s_unique_chains, "unique_chains"}, {&s_chains, "chains"},
        {&s_registered, "registered"}, {&s_commit_at, "commit_at"}, {&s_size, "size"},
        {&s_digests, "digests"}, {&s_stream, "_stream"}, {&s_fed, "_fed"},
        {&s_state, "_state"}, {&s_records, "_records"}, {&s_boundaries, "boundaries"},
        {&s_bind_run, "bind_run"}, {&s_pipelined, "pipelined"}, {&s_published, "published"},
        {&s_publish, "publish"}, {&s_fromlist, "fromlist"}, {&s_take, "take"},
        {&s_step, "_step"}, {&s_in_flight, "_in_flight"}, {&s_tails, "_tails"},
        {&s_requests, "_requests"}, {&s_lane_registers, "_lane_registers"},
        {&s_published_in_step, "_published_in_step"}, {&s_register, "_register"},
    };
    for (size_t k = 0; k < sizeof(strings) / sizeof(strings[0]); k++) {
        *strings[k].name = PyUnicode_InternFromString(strings[k].text);
        if (*strings[k].name == NULL) {
            return NULL;
        }
    }
    PyObject *arrays = PyImport_ImportModule("array");
    array_type = arrays ? PyObject_GetAttrString(arrays, "array") : NULL;
    Py_XDECREF(arrays);
    array_fromlist = array_type ? PyObject_GetAttr(array_type, s_fromlist) : NULL;
    if (array_fromlist == NULL || !PyType_Check(array_type) || PyType_Ready(&LaneType) < 0 ||
        dropin_ready() < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "DecodeLane", (PyObject *)&LaneType) < 0 ||
        PyModule_AddObjectRef(m, "DropIn", (PyObject *)&DropInType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
