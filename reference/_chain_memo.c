/* The digest memo's path compiled: kvcert.reference.hashing.DigestMemo.digest (resume a fresh
 * chain from its family's entry, digest the rest with checkpoints, record it) as one call.
 *
 * The definition is the Python method; this follows it step by step on the same objects (the
 * memo's OrderedDict of _Entry records, the chain's slots), so either path leaves the chain
 * and the memo exactly as the other would, and the two can serve one memo in turn
 * (tests/reference/test_digest_memo.py holds them equal). What it saves is the method's
 * Python, about 7 us a prompt: a 1,536-token prompt sharing 1,024 tokens took 17.5 us through
 * the Python memo and 15.7 us with no memo at all, 10.5 us here.
 *
 * It serves a Chain and a DigestMemo of the classes `memo_definitions` names, on the compiled
 * Sha256 state; anything else (hashlib's BLAKE2b, a subclass) it leaves to the definition by
 * answering False before changing anything.
 */
#include "_chain.h"

/* what memo_definitions names: the classes served, the entry's class, and the memo's costs */
static PyObject *memo_class, *chain_class, *entry_class;
static Py_ssize_t checkpoint_every, digest_cost, checkpoint_cost;

static PyObject *s_size, *s_lookahead, *s_header, *s_stream, *s_state, *s_fed, *s_digests,
    *s_chain_checkpoints, *s_records, *s_entries, *s_used, *s_budget, *s_entry_stream,
    *s_entry_checkpoints, *s_move_to_end, *s_pop, *s_popitem;

static int
intern_names(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_size, "size"},          {&s_lookahead, "lookahead"},
        {&s_header, "_header"},     {&s_stream, "_stream"},
        {&s_state, "_state"},       {&s_fed, "_fed"},
        {&s_digests, "digests"},    {&s_chain_checkpoints, "_checkpoints"},
        {&s_records, "_records"},   {&s_entries, "_entries"},
        {&s_used, "_used"},         {&s_budget, "budget"},
        {&s_entry_stream, "stream"}, {&s_entry_checkpoints, "checkpoints"},
        {&s_move_to_end, "move_to_end"}, {&s_pop, "pop"},
        {&s_popitem, "popitem"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return 0;
        }
    }
    return 1;
}

/* memo_definitions(memo_class, chain_class, entry_class, checkpoint_every, digest_cost,
 * checkpoint_cost): what memo_digest serves and follows, named once by hashing.py. */
PyObject *
memo_definitions(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "memo_definitions(memo_class, chain_class, entry_class, "
                        "checkpoint_every, digest_cost, checkpoint_cost)");
        return NULL;
    }
    Py_ssize_t numbers[3];
    for (int i = 0; i < 3; i++) {
        numbers[i] = PyLong_AsSsize_t(args[3 + i]);
        if (numbers[i] == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    if (numbers[0] < 1 || numbers[1] < 0 || numbers[2] < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "memo_definitions: checkpoint_every >= 1 and costs >= 0");
        return NULL;
    }
    if (!intern_names()) {
        return NULL;
    }
    Py_XSETREF(memo_class, Py_NewRef(args[0]));
    Py_XSETREF(chain_class, Py_NewRef(args[1]));
    Py_XSETREF(entry_class, Py_NewRef(args[2]));
    checkpoint_every = numbers[0];
    digest_cost = numbers[1];
    checkpoint_cost = numbers[2];
    Py_RETURN_NONE;
}

/* hashing._cost: the bytes an entry keeps alive, roughly */
static Py_ssize_t
cost(Py_ssize_t stream_bytes, Py_ssize_t digests, Py_ssize_t checkpoints)
{
    return stream_bytes + digest_cost * digests + checkpoint_cost * checkpoints;
}

/* An attribute read as a Py_ssize_t; 0 with an exception when it is not one. */
static int
get_size(PyObject *obj, PyObject *name, Py_ssize_t *value)
{
    PyObject *attr = PyObject_GetAttr(obj, name);
    if (attr == NULL) {
        return 0;
    }
    *value = PyLong_AsSsize_t(attr);
    Py_DECREF(attr);
    return !(*value == -1 && PyErr_Occurred());
}

static int
set_size(PyObject *obj, PyObject *name, Py_ssize_t value)
{
    PyObject *number = PyLong_FromSsize_t(value);
    if (number == NULL) {
        return 0;
    }
    int failed = PyObject_SetAttr(obj, name, number);
    Py_DECREF(number);
    return failed == 0;
}

/* An entry's cost, as record and the eviction loop subtract it; -1 with an exception. */
static Py_ssize_t
entry_cost(PyObject *entry)
{
    PyObject *stream = PyObject_GetAttr(entry, s_entry_stream);
    PyObject *digests = stream ? PyObject_GetAttr(entry, s_digests) : NULL;
    PyObject *checkpoints = digests ? PyObject_GetAttr(entry, s_entry_checkpoints) : NULL;
    Py_ssize_t sizes[3] = {-1, -1, -1};
    if (checkpoints != NULL) {
        sizes[0] = PyObject_Length(stream);
        sizes[1] = sizes[0] < 0 ? -1 : PyObject_Length(digests);
        sizes[2] = sizes[1] < 0 ? -1 : PyObject_Length(checkpoints);
    }
    Py_XDECREF(stream);
    Py_XDECREF(digests);
    Py_XDECREF(checkpoints);
    return sizes[2] < 0 ? -1 : cost(sizes[0], sizes[1], sizes[2]);
}

/* What memo_digest reads of the chain and keeps while it runs. */
typedef struct {
    PyObject *chain;
    Sha256Object *state; /* the chain's state (replaced when resuming from a checkpoint) */
    PyObject *stream;    /* bytes or bytearray: the encoded tokens */
    Py_buffer view;      /* of stream */
    PyObject *digests;   /* the chain's list */
    PyObject *checkpoints; /* the chain's list of (k, fed, state) */
    Py_ssize_t size, lookahead, fed;
} Run;

static void
run_release(Run *run)
{
    if (run->view.obj != NULL) {
        PyBuffer_Release(&run->view);
    }
    Py_XDECREF(run->state);
    Py_XDECREF(run->stream);
    Py_XDECREF(run->digests);
    Py_XDECREF(run->checkpoints);
}

/* Read the chain; 1 when it is one memo_digest serves (a fresh chain of the class named, no
 * records, on the compiled state, a bytes or bytearray stream, lists of digests and
 * checkpoints), 0 when it is not (nothing raised), -1 on an error. */
static int
run_open(Run *run, PyObject *chain)
{
    run->chain = chain;
    if (Py_TYPE(chain) != (PyTypeObject *)chain_class) {
        return 0;
    }
    PyObject *records = PyObject_GetAttr(chain, s_records);
    if (records == NULL) {
        return -1;
    }
    int plain = PyDict_CheckExact(records) && PyDict_GET_SIZE(records) == 0;
    Py_DECREF(records);
    PyObject *state = PyObject_GetAttr(chain, s_state);
    if (state == NULL) {
        return -1;
    }
    run->state = (Sha256Object *)state;
    if (!plain || Py_TYPE(state) != &Sha256Type) {
        return 0;
    }
    if ((run->stream = PyObject_GetAttr(chain, s_stream)) == NULL ||
        (run->digests = PyObject_GetAttr(chain, s_digests)) == NULL) {
        return -1;
    }
    if (!(PyBytes_CheckExact(run->stream) || PyByteArray_CheckExact(run->stream)) ||
        !PyList_CheckExact(run->digests) || PyList_GET_SIZE(run->digests) != 0) {
        return 0;
    }
    if (!get_size(chain, s_size, &run->size) || !get_size(chain, s_lookahead, &run->lookahead) ||
        !get_size(chain, s_fed, &run->fed)) {
        return -1;
    }
    if ((run->checkpoints = PyObject_GetAttr(chain, s_chain_checkpoints)) == NULL) {
        return -1;
    }
    if (!PyList_CheckExact(run->checkpoints)) { /* read and grown as a list below */
        return 0;
    }
    return PyObject_GetBuffer(run->stream, &run->view, PyBUF_SIMPLE) < 0 ? -1 : 1;
}

/* Set one of the chain's attributes to a new reference it takes over (`value`), and keep a
 * reference in *held (the run's copy); 0 on error. */
static int
run_set(Run *run, PyObject *name, PyObject *value, PyObject **held)
{
    if (value == NULL) {
        return 0;
    }
    int failed = PyObject_SetAttr(run->chain, name, value);
    Py_XSETREF(*held, value);
    return failed == 0;
}

/* DigestMemo.resume: give the chain the digests (at most `count`) it shares with its family's
 * entry and the hash state after them. 1 done, 0 not served (an entry whose saved state is
 * not the compiled one: checked before anything changes), -1 on error. */
static int
resume(Run *run, PyObject *entries, PyObject *family, Py_ssize_t count)
{
    PyObject *entry = PyDict_GetItemWithError(entries, family); /* borrowed */
    if (entry == NULL) {
        return PyErr_Occurred() ? -1 : 1;
    }
    Py_INCREF(entry);
    PyObject *theirs = NULL, *their_digests = NULL, *their_checkpoints = NULL, *kept = NULL;
    int done = -1;
    if ((theirs = PyObject_GetAttr(entry, s_entry_stream)) == NULL ||
        (their_digests = PyObject_GetAttr(entry, s_digests)) == NULL ||
        (their_checkpoints = PyObject_GetAttr(entry, s_entry_checkpoints)) == NULL) {
        goto end;
    }
    if (!PyBytes_CheckExact(theirs) || !PyList_CheckExact(their_digests) ||
        !PyList_CheckExact(their_checkpoints)) {
        PyErr_SetString(PyExc_TypeError, "a digest memo entry holds bytes and two lists");
        goto end;
    }
    Py_ssize_t size = run->size, lookahead = run->lookahead;
    Py_ssize_t high = PyList_GET_SIZE(their_digests) < count ? PyList_GET_SIZE(their_digests) : count;
    Py_ssize_t first = 8 * (size + lookahead), stop = 8 * (high * size + lookahead);
    Py_ssize_t their_len = PyBytes_GET_SIZE(theirs);
    if (first > stop || stop > run->view.len || stop > their_len) {
        PyErr_Format(PyExc_ValueError,
                     "first_difference: [%zd, %zd) is not within buffers of %zd and %zd bytes",
                     first, stop, run->view.len, their_len);
        goto end;
    }
    const unsigned char *their_bytes = (const unsigned char *)PyBytes_AS_STRING(theirs);
    Py_ssize_t differ = bytes_first_difference(run->view.buf, their_bytes, first, stop);
    Py_ssize_t low = (differ / 8 - lookahead) / size; /* differ >= first: not negative */
    low = low < high ? low : high;
    Py_ssize_t fed = low * size + lookahead, start = 0;
    Sha256Object *their_state = NULL; /* the last checkpoint kept, if any */
    if (low) {
        if ((kept = PyList_New(0)) == NULL) {
            goto end;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(their_checkpoints); i++) {
            PyObject *checkpoint = PyList_GET_ITEM(their_checkpoints, i);
            if (!PyTuple_CheckExact(checkpoint) || PyTuple_GET_SIZE(checkpoint) != 3) {
                PyErr_SetString(PyExc_TypeError, "a memo checkpoint is a (k, fed, state) tuple");
                goto end;
            }
            Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(checkpoint, 0));
            if (at == -1 && PyErr_Occurred()) {
                goto end;
            }
            if (at <= low && PyList_Append(kept, checkpoint) < 0) {
                goto end;
            }
        }
        Py_ssize_t saved = PyList_GET_SIZE(kept);
        if (saved) {
            PyObject *last = PyList_GET_ITEM(kept, saved - 1);
            if (Py_TYPE(PyTuple_GET_ITEM(last, 2)) != &Sha256Type) {
                done = 0;
                goto end;
            }
            their_state = (Sha256Object *)PyTuple_GET_ITEM(last, 2);
            start = PyLong_AsSsize_t(PyTuple_GET_ITEM(last, 1));
            if (start == -1 && PyErr_Occurred()) {
                goto end;
            }
        }
        if (start < 0 || start > fed || 8 * fed > their_len) {
            PyErr_SetString(PyExc_ValueError, "a memo checkpoint lies past its entry's stream");
            goto end;
        }
    }
    PyObject *moved = PyObject_CallMethodOneArg(entries, s_move_to_end, family);
    if (moved == NULL) {
        goto end;
    }
    Py_DECREF(moved);
    if (!low) {
        done = 1;
        goto end;
    }
    if (their_state != NULL) {
        Sha256Object *copy = new_state();
        if (copy == NULL) {
            goto end;
        }
        copy->ctx = their_state->ctx;
        if (!run_set(run, s_state, (PyObject *)copy, (PyObject **)&run->state)) {
            goto end;
        }
    }
    SHA256_Update(&run->state->ctx, their_bytes + 8 * start, (size_t)(8 * (fed - start)));
    if (run_set(run, s_chain_checkpoints, Py_NewRef(kept), &run->checkpoints) &&
        run_set(run, s_digests, PyList_GetSlice(their_digests, 0, low), &run->digests) &&
        set_size(run->chain, s_fed, fed)) {
        run->fed = fed;
        done = 1;
    }
end:
    Py_DECREF(entry);
    Py_XDECREF(theirs);
    Py_XDECREF(their_digests);
    Py_XDECREF(their_checkpoints);
    Py_XDECREF(kept);
    return done;
}

/* Chain._digest_to(count, checkpoints) for a chain without records: runs of boundaries, a
 * checkpoint saved every `checkpoint_every` when `checkpoints`. 0 on error. */
static int
digest_to(Run *run, Py_ssize_t count, int checkpoints)
{
    Py_ssize_t size = run->size, lookahead = run->lookahead;
    Py_ssize_t fed = run->fed, k = PyList_GET_SIZE(run->digests);
    const unsigned char *data = run->view.buf;
    while (k < count) {
        Py_ssize_t end = (k + 1) * size + lookahead, stop = count;
        if (checkpoints) {
            Py_ssize_t next = (k / checkpoint_every + 1) * checkpoint_every;
            stop = stop < next ? stop : next;
        }
        if (!run_boundaries(run->state, run->digests, data, run->view.len, 8 * fed, 8 * end,
                            8 * size, stop - k)) {
            return 0;
        }
        fed = stop * size + lookahead;
        k = stop;
        if (checkpoints && k % checkpoint_every == 0) {
            Sha256Object *copy = new_state();
            if (copy == NULL) {
                return 0;
            }
            copy->ctx = run->state->ctx;
            PyObject *checkpoint = PyTuple_New(3);
            PyObject *at = checkpoint ? PyLong_FromSsize_t(k) : NULL;
            PyObject *fed_number = at ? PyLong_FromSsize_t(fed) : NULL;
            if (fed_number == NULL) {
                Py_XDECREF(at);
                Py_XDECREF(checkpoint);
                Py_DECREF(copy);
                return 0;
            }
            PyTuple_SET_ITEM(checkpoint, 0, at);
            PyTuple_SET_ITEM(checkpoint, 1, fed_number);
            PyTuple_SET_ITEM(checkpoint, 2, (PyObject *)copy);
            int failed = PyList_Append(run->checkpoints, checkpoint);
            Py_DECREF(checkpoint);
            if (failed) {
                return 0;
            }
        }
    }
    run->fed = fed;
    return set_size(run->chain, s_fed, fed);
}

/* DigestMemo.record: the chain becomes its family's entry (unless it alone exceeds the
 * budget), least recently used entries dropped past the budget; `used` is the memo's count,
 * updated. 0 on error. */
static int
record(Run *run, PyObject *entries, PyObject *family, Py_ssize_t budget, Py_ssize_t *used)
{
    PyObject *old = PyObject_CallMethodObjArgs(entries, s_pop, family, Py_None, NULL);
    if (old == NULL) {
        return 0;
    }
    if (old != Py_None) {
        Py_ssize_t was = entry_cost(old);
        if (was < 0) {
            Py_DECREF(old);
            return 0;
        }
        *used -= was;
    }
    Py_DECREF(old);
    Py_ssize_t fed = run->fed;
    Py_ssize_t mine = cost(8 * fed, PyList_GET_SIZE(run->digests), PyList_GET_SIZE(run->checkpoints));
    if (mine > budget) {
        return 1;
    }
    PyObject *stream;
    if (PyBytes_CheckExact(run->stream) && PyBytes_GET_SIZE(run->stream) == 8 * fed) {
        stream = Py_NewRef(run->stream);
    } else {
        stream = PyBytes_FromStringAndSize(run->view.buf, 8 * fed);
    }
    PyObject *digests = stream ? PyList_GetSlice(run->digests, 0, PY_SSIZE_T_MAX) : NULL;
    PyObject *checkpoints =
        digests ? PyList_GetSlice(run->checkpoints, 0, PY_SSIZE_T_MAX) : NULL;
    PyObject *entry = NULL;
    if (checkpoints != NULL) {
        PyObject *fields[3] = {stream, digests, checkpoints};
        entry = PyObject_Vectorcall(entry_class, fields, 3, NULL);
    }
    Py_XDECREF(stream);
    Py_XDECREF(digests);
    Py_XDECREF(checkpoints);
    if (entry == NULL) {
        return 0;
    }
    int failed = PyObject_SetItem(entries, family, entry); /* the OrderedDict's own order */
    Py_DECREF(entry);
    if (failed) {
        return 0;
    }
    *used += mine;
    while (*used > budget) {
        PyObject *oldest = PyObject_CallMethodOneArg(entries, s_popitem, Py_False);
        if (oldest == NULL) {
            return 0;
        }
        Py_ssize_t dropped = PyTuple_CheckExact(oldest) && PyTuple_GET_SIZE(oldest) == 2
                                 ? entry_cost(PyTuple_GET_ITEM(oldest, 1))
                                 : -1;
        Py_DECREF(oldest);
        if (dropped < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "OrderedDict.popitem answered no pair");
            }
            return 0;
        }
        *used -= dropped;
    }
    return 1;
}

/* memo_digest(memo, chain, count): DigestMemo.digest(chain, count) when it serves them (True),
 * else False with nothing changed: the caller then runs the definition. */
PyObject *
memo_digest(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "memo_digest(memo, chain, count) takes 3 arguments");
        return NULL;
    }
    if (memo_class == NULL || Py_TYPE(args[0]) != (PyTypeObject *)memo_class) {
        Py_RETURN_FALSE;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[2]);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Run run = {0};
    PyObject *entries = NULL, *family = NULL, *answer = NULL;
    int opened = run_open(&run, args[1]);
    if (opened <= 0) {
        answer = opened == 0 ? Py_NewRef(Py_False) : NULL;
        goto done;
    }
    Py_ssize_t budget, used;
    if ((entries = PyObject_GetAttr(args[0], s_entries)) == NULL ||
        !get_size(args[0], s_budget, &budget) || !get_size(args[0], s_used, &used)) {
        goto done;
    }
    if (!PyDict_Check(entries)) {
        PyErr_SetString(PyExc_TypeError, "a DigestMemo keeps its entries in an OrderedDict");
        goto done;
    }
    /* the family: block size, chain header and the first block's bytes (DigestMemo._family) */
    Py_ssize_t first = 8 * (run.size + run.lookahead);
    if (first > run.view.len) {
        PyErr_SetString(PyExc_ValueError, "memo_digest: the stream holds no whole first block");
        goto done;
    }
    PyObject *size = PyObject_GetAttr(run.chain, s_size);
    PyObject *header = size ? PyObject_GetAttr(run.chain, s_header) : NULL;
    PyObject *opening = header ? PyBytes_FromStringAndSize(run.view.buf, first) : NULL;
    family = opening ? PyTuple_Pack(3, size, header, opening) : NULL;
    Py_XDECREF(size);
    Py_XDECREF(header);
    Py_XDECREF(opening);
    int resumed = family == NULL ? -1 : resume(&run, entries, family, count);
    if (resumed <= 0) {
        answer = resumed == 0 ? Py_NewRef(Py_False) : NULL;
        goto done;
    }
    int keep = cost(run.view.len, count, count / checkpoint_every) <= budget; /* could_keep */
    if (!digest_to(&run, count, keep)) {
        goto done;
    }
    if (keep && !(record(&run, entries, family, budget, &used) && set_size(args[0], s_used, used))) {
        goto done;
    }
    answer = Py_NewRef(Py_True);
done:
    run_release(&run);
    Py_XDECREF(entries);
    Py_XDECREF(family);
    return answer;
}
