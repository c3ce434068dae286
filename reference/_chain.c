/* kvcert.reference._chain: the digest chain's hot loops, compiled.
 *
 * The same contracts as their pure-Python definitions, which tests/reference/test_chain.py
 * holds these equal to:
 *   - `Sha256.boundaries` is kvcert.reference.hashing.py_boundaries: advance a SHA-256 state
 *     over a run of spans of the encoded token stream, reading the digest after each span;
 *   - `pack_tokens` is the packing half of kvcert.reference.inputs.token_ids: a list of token
 *     ids as little-endian int64, or None when one of them is not an id (the caller then
 *     finds and names it);
 *   - `first_difference` is kvcert.reference.hashing.py_first_difference: where two buffers
 *     first differ, which the digest memo asks of a prompt and its family's last one;
 *   - `memo_digest` (_chain_memo.c) is kvcert.reference.hashing.DigestMemo.digest.
 * A 128k-token prompt has 32,768 boundaries at 4 tokens; in Python each costs two calls, a
 * slice and a digest object's setup, which is nearly all of the hashing time. Here the state
 * is OpenSSL's SHA256_CTX, a plain struct: copied and finished in place per boundary, or,
 * where the CPU has SHA extensions, finished in lanes beside the chain's next block
 * (_chain_lanes.c says how and what it saves).
 */
#include "_chain.h"

#include <stdint.h>
#include <string.h>

#include "_chain_lanes.h"

/* Whether `boundaries` finishes its digests in lanes (_chain_lanes.c): on where the CPU
 * allows it; `use_lanes` switches it so the tests hold both loops to the definition. */
static int lanes_on = 0;

Sha256Object *
new_state(void)
{
    return PyObject_New(Sha256Object, &Sha256Type);
}

/* Feed a buffer-supporting object to the state; 0 on error. */
static int
feed(Sha256Object *self, PyObject *data)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return 0;
    }
    SHA256_Update(&self->ctx, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return 1;
}

static PyObject *
Sha256_new(PyTypeObject *Py_UNUSED(type), PyObject *args, PyObject *kwargs)
{
    PyObject *data = NULL;
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)
        || !PyArg_ParseTuple(args, "|O:Sha256", &data)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "Sha256(data=b'') takes its data by position");
        }
        return NULL;
    }
    Sha256Object *self = new_state();
    if (self == NULL) {
        return NULL;
    }
    SHA256_Init(&self->ctx);
    if (data != NULL && !feed(self, data)) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
Sha256_update(Sha256Object *self, PyObject *data)
{
    if (!feed(self, data)) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The digest of what was fed so far; the state keeps running (it finishes a copy). */
static PyObject *
digest_of(const SHA256_CTX *ctx)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, SHA256_DIGEST_LENGTH);
    if (out != NULL) {
        SHA256_CTX finished = *ctx;
        SHA256_Final((unsigned char *)PyBytes_AS_STRING(out), &finished);
    }
    return out;
}

static PyObject *
Sha256_digest(Sha256Object *self, PyObject *Py_UNUSED(ignored))
{
    return digest_of(&self->ctx);
}

static PyObject *
Sha256_copy(Sha256Object *self, PyObject *Py_UNUSED(ignored))
{
    Sha256Object *twin = new_state();
    if (twin != NULL) {
        twin->ctx = self->ctx;
    }
    return (PyObject *)twin;
}

int
run_boundaries(Sha256Object *self, PyObject *out, const unsigned char *data, Py_ssize_t len,
               Py_ssize_t start, Py_ssize_t first_end, Py_ssize_t step, Py_ssize_t count)
{
    if (count < 0 || step <= 0 || start < 0 || first_end < start
        || (count > 0 && (first_end > len || (len - first_end) / step < count - 1))) {
        PyErr_Format(PyExc_ValueError,
                     "boundaries: spans from %zd to %zd then %zd x %zd bytes do not fit in "
                     "%zd bytes",
                     start, first_end, count > 0 ? count - 1 : 0, step, len);
        return 0;
    }
    PyObject *digests = PyList_New(count);
    if (digests == NULL) {
        return 0;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *digest = PyBytes_FromStringAndSize(NULL, SHA256_DIGEST_LENGTH);
        if (digest == NULL) {
            Py_DECREF(digests);
            return 0;
        }
        PyList_SET_ITEM(digests, k, digest);
    }
    Py_ssize_t size = PyList_GET_SIZE(out); /* grow `out` first: then nothing can fail */
    if (PyList_SetSlice(out, size, size, digests) < 0) {
        Py_DECREF(digests);
        return 0;
    }
    /* The new digest objects are in `out` but no Python code runs before they are written. */
    const unsigned char *at = data + start;
    Py_ssize_t span = first_end - start;
    if (lanes_on) {
        lanes_boundaries(&self->ctx, at, (size_t)span, (size_t)step, (size_t)count,
                         PySequence_Fast_ITEMS(digests));
    } else {
        for (Py_ssize_t k = 0; k < count; k++) {
            SHA256_Update(&self->ctx, at, (size_t)span);
            at += span;
            span = step;
            SHA256_CTX finished = self->ctx;
            SHA256_Final((unsigned char *)PyBytes_AS_STRING(PyList_GET_ITEM(digests, k)),
                         &finished);
        }
    }
    Py_DECREF(digests);
    return 1;
}

/* boundaries(out, data, start, first_end, step, count): run_boundaries on a buffer. */
static PyObject *
Sha256_boundaries(Sha256Object *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "boundaries(out, data, start, first_end, step, count) takes 6 arguments");
        return NULL;
    }
    PyObject *out = args[0];
    if (!PyList_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError, "boundaries: out must be a list");
        return NULL;
    }
    Py_ssize_t bounds[4];
    for (int i = 0; i < 4; i++) {
        bounds[i] = PyLong_AsSsize_t(args[2 + i]);
        if (bounds[i] == -1 && PyErr_Occurred()) {
            return NULL;
        }
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int done = run_boundaries(self, out, view.buf, view.len, bounds[0], bounds[1], bounds[2],
                              bounds[3]);
    PyBuffer_Release(&view);
    if (!done) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Sha256_get_digest_size(PyObject *Py_UNUSED(self), void *Py_UNUSED(closure))
{
    return PyLong_FromLong(SHA256_DIGEST_LENGTH);
}

static PyMethodDef Sha256_methods[] = {
    {"update", (PyCFunction)Sha256_update, METH_O, "Feed bytes (any buffer) to the state."},
    {"digest", (PyCFunction)Sha256_digest, METH_NOARGS,
     "The digest of everything fed so far; the state keeps running."},
    {"copy", (PyCFunction)Sha256_copy, METH_NOARGS, "An independent state equal to this one."},
    {"boundaries", (PyCFunction)(void (*)(void))Sha256_boundaries, METH_FASTCALL,
     "boundaries(out, data, start, first_end, step, count): the digest after each span, "
     "appended to out."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Sha256_getset[] = {
    {"digest_size", Sha256_get_digest_size, NULL, "32 bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject Sha256Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcert.reference._chain.Sha256",
    .tp_basicsize = sizeof(Sha256Object),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SHA-256 (OpenSSL's), with hashlib's update/digest/copy and a boundary loop.",
    .tp_new = Sha256_new,
    .tp_methods = Sha256_methods,
    .tp_getset = Sha256_getset,
};

/* An exact int's value as a token id, or -1 when it is not one (negative, or past a long
 * long). A token id fits one 30-bit digit; CPython before 3.12 keeps such an int's sign in
 * its size and its value in that digit, read here without a call (the rest take the API's
 * path). */
static inline long long
id_of(PyObject *item)
{
#if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    size_t size = (size_t)Py_SIZE(item); /* a negative size (a negative int) wraps past 1 */
    if (size <= 1) {
        return size ? (long long)((PyLongObject *)item)->ob_digit[0] : 0;
    }
#endif
    int overflow = 0;
    long long id = PyLong_AsLongLongAndOverflow(item, &overflow);
    return overflow ? -1 : id;
}

/* pack_tokens(tokens): a list or tuple of ints in [0, 2**63) as little-endian int64 bytes;
 * None when an item is not such an int (a bool is not a token id). Per id: one type check,
 * the digit read without a call, and on a little-endian host one 8-byte store (byte stores
 * elsewhere); with a call and eight byte stores per id, a 52k-token prompt took 262 us, now
 * 84 us. */
static PyObject *
pack_tokens(PyObject *module, PyObject *tokens)
{
    if (!PyList_CheckExact(tokens) && !PyTuple_CheckExact(tokens)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *at = (unsigned char *)PyBytes_AS_STRING(out);
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    for (Py_ssize_t k = 0; k < n; k++, at += 8) {
        PyObject *item = items[k];
        long long id = PyLong_CheckExact(item) ? id_of(item) : -1;
        if (id < 0) {
            Py_DECREF(out);
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        uint64_t bits = (uint64_t)id;
#if PY_LITTLE_ENDIAN
        memcpy(at, &bits, 8);
#else
        for (int b = 0; b < 8; b++) {
            at[b] = (unsigned char)(bits >> (8 * b));
        }
#endif
    }
    return out;
}

/* first_difference(a, b, start, stop): the first offset in [start, stop) at which buffers a
 * and b differ, or stop where they agree throughout (both must hold stop bytes). The digest
 * memo's resume asks it once where a binary search of prefix comparisons read the shared
 * prefix about twice (a 52k-token prompt's 278 KB: 40 us then). memcmp by pages finds the
 * page, a byte loop the offset. */
Py_ssize_t
bytes_first_difference(const unsigned char *x, const unsigned char *y, Py_ssize_t start,
                       Py_ssize_t stop)
{
    Py_ssize_t at = start;
    while (at < stop) {
        Py_ssize_t span = stop - at < 4096 ? stop - at : 4096;
        if (memcmp(x + at, y + at, (size_t)span) != 0) {
            while (x[at] == y[at]) {
                at++;
            }
            break;
        }
        at += span;
    }
    return at;
}

static PyObject *
first_difference(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "first_difference(a, b, start, stop) takes 4 arguments");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    Py_ssize_t stop = start == -1 && PyErr_Occurred() ? -1 : PyLong_AsSsize_t(args[3]);
    if (stop == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer a, b;
    if (PyObject_GetBuffer(args[0], &a, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &b, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&a);
        return NULL;
    }
    PyObject *answer = NULL;
    if (start < 0 || stop < start || stop > a.len || stop > b.len) {
        PyErr_Format(PyExc_ValueError,
                     "first_difference: [%zd, %zd) is not within buffers of %zd and %zd bytes",
                     start, stop, a.len, b.len);
        goto done;
    }
    answer = PyLong_FromSsize_t(bytes_first_difference(a.buf, b.buf, start, stop));
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return answer;
}

/* use_lanes(on): switch `boundaries` to its lanes (True) or to one SHA256_Final a digest
 * (False); answers the previous setting. Lanes where the CPU lacks them: ValueError. */
static PyObject *
use_lanes(PyObject *Py_UNUSED(module), PyObject *on)
{
    if (!PyBool_Check(on)) {
        PyErr_Format(PyExc_TypeError, "use_lanes(on) takes True or False, not %.100s",
                     Py_TYPE(on)->tp_name);
        return NULL;
    }
    int want = on == Py_True;
    if (want && !lanes_supported()) {
        PyErr_SetString(PyExc_ValueError,
                        "use_lanes(True): this CPU or build has no SHA extensions for the "
                        "lanes; the one-at-a-time loop serves");
        return NULL;
    }
    int before = lanes_on;
    lanes_on = want;
    return PyBool_FromLong(before);
}

static PyMethodDef module_methods[] = {
    {"pack_tokens", pack_tokens, METH_O,
     "A list or tuple of token ids as little-endian int64 bytes; None if one is not an id."},
    {"first_difference", (PyCFunction)(void (*)(void))first_difference, METH_FASTCALL,
     "first_difference(a, b, start, stop): the first offset in [start, stop) where the "
     "buffers differ, else stop."},
    {"memo_definitions", (PyCFunction)(void (*)(void))memo_definitions, METH_FASTCALL,
     "memo_definitions(memo_class, chain_class, entry_class, checkpoint_every, digest_cost, "
     "checkpoint_cost): what memo_digest serves and follows (hashing.py names them)."},
    {"memo_digest", (PyCFunction)(void (*)(void))memo_digest, METH_FASTCALL,
     "memo_digest(memo, chain, count): DigestMemo.digest compiled; False (nothing changed) "
     "where it does not serve them."},
    {"use_lanes", use_lanes, METH_O,
     "use_lanes(on): finish boundaries' digests in lanes or one at a time; the previous "
     "setting."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef chain_module = {
    PyModuleDef_HEAD_INIT, "kvcert.reference._chain",
    "The digest chain's hot loops compiled (reference/_chain.c).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__chain(void)
{
    if (PyType_Ready(&Sha256Type) < 0) {
        return NULL;
    }
    lanes_on = lanes_supported();
    PyObject *module = PyModule_Create(&chain_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Sha256", (PyObject *)&Sha256Type) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
