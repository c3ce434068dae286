/* kvcert.reference._decodelane's drop-in object, shared by its calls
 * (_decodelane_dropin.c), their hand-out (_decodelane_handout.c) and its type
 * (_decodelane_dropin_type.c). */
#ifndef KVCERT_DECODELANE_DROPIN_H
#define KVCERT_DECODELANE_DROPIN_H

#include "_decodelane.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *manager;     /* the drop-in */
    PyObject *core;        /* manager.core this serves: another (a rebuilt core) is Python's */
    PyObject *lane;        /* core._lane this serves */
    PyObject *requests;    /* core._requests (bound once, in the core's __init__) */
    PyObject *tracked;     /* manager._tracked (likewise); core._in_flight is read per call:
                            * every step's end rebinds it */
    PyObject *empty;       /* manager.empty_kv_cache_blocks: a chunk allocating nothing */
    PyObject *general;     /* the Python allocate_slots (the class's function) */
    PyObject *pending;     /* the Python start_pending */
    PyObject *start_chunk; /* the Python _start_chunk(rid, chunks, progress, request) */
    PyObject *end_step;    /* the Python end_step */
    /* vLLM's ConstantList, whose instances (a request's all_token_ids) slice the list they
     * keep in `_x`, or None: every slice is then the sequence's own (lane.py checks this) */
    PyObject *token_list;
    long long max_model_len;
    /* the state groups (index, block size): their running state's column is checked after
     * each chunk served here, as _check_runner_columns does (no drafts' blocks, no runner
     * checkpoints in the managers served); none for an attention layout */
    Py_ssize_t states;
    Py_ssize_t *state_group;
    long long *state_size;
} DropIn;

/* interned names (made once, in dropin_ready) */
extern PyObject *s_request_id, *s_num_computed_tokens, *s_all_token_ids,
    *s_pending, *s_keep, *s_core, *s_lane, *s_handed_out, *s_append,
    *s_popleft, *s_num_lookahead_tokens, *s_progress_of, *s_check_started, *s_zeroed,
    *s_seen, *s_blocks, *s_check_columns, *s_wrapped, *s_new_ids, *s_events, *zero;
/* collections.deque (the facade's queue of pending chunks) and its append and popleft */
extern PyObject *deque_type, *deque_append, *deque_popleft;

/* a served chunk's answer (_decodelane_handout.c) and the checks it shares with the calls */
int allocated_nothing(Lane *lane, PyObject *result);
PyObject *handed_out(DropIn *self, PyObject *rid, PyObject *result);
int call_check_columns(DropIn *self, PyObject *request, long long start, long long end);

/* the calls: allocate_slots (the object, called), start_pending and end_step */
PyObject *DropIn_call(DropIn *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);
PyObject *DropIn_start_pending(DropIn *self, PyObject *requests);
PyObject *DropIn_end_step(DropIn *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);

#endif
