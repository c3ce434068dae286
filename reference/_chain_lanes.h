/* The digest chain's boundary loop with its digests finished in lanes (_chain_lanes.c). */
#ifndef KVCERT_CHAIN_LANES_H
#define KVCERT_CHAIN_LANES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/sha.h>
#include <stddef.h>

/* 1 when this build and this CPU have what the lanes need (x86-64 SHA extensions). */
int lanes_supported(void);

/* Sha256.boundaries' loop on bounds already checked: feed `first_span` bytes from `at`, then
 * `count - 1` times `step` more, writing the digest after each span into the 32-byte
 * bytes object digests[k]. Only where lanes_supported(). */
void lanes_boundaries(SHA256_CTX *ctx, const unsigned char *at, size_t first_span, size_t step,
                      size_t count, PyObject *const *digests);

#endif
