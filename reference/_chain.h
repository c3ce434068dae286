/* What reference/_chain.c shares with the digest memo's compiled path (_chain_memo.c). */
#ifndef KVCERT_CHAIN_H
#define KVCERT_CHAIN_H

#define PY_SSIZE_T_CLEAN
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_CTX is deprecated for EVP, which cannot be copied cheaply */
#include <Python.h>
#include <openssl/sha.h>

/* A SHA-256 state: kvcert.reference._chain.Sha256. */
typedef struct {
    PyObject_HEAD
    SHA256_CTX ctx;
} Sha256Object;

extern PyTypeObject Sha256Type;

/* A new state object, its context not set (NULL, with an exception, on failure). */
Sha256Object *new_state(void);

/* Sha256.boundaries on a buffer of `len` bytes at `data`: every bound checked and every
 * digest object made (appended to the list `out`) before the state moves; 0 with an
 * exception when the spans do not fit or memory ran out (state and `out` then unchanged). */
int run_boundaries(Sha256Object *self, PyObject *out, const unsigned char *data, Py_ssize_t len,
                   Py_ssize_t start, Py_ssize_t first_end, Py_ssize_t step, Py_ssize_t count);

/* first_difference on bounds already checked: the first offset in [start, stop) at which
 * `x` and `y` differ, else stop. */
Py_ssize_t bytes_first_difference(const unsigned char *x, const unsigned char *y,
                                  Py_ssize_t start, Py_ssize_t stop);

/* The memo's compiled path (_chain_memo.c), two module functions. */
PyObject *memo_definitions(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *memo_digest(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
