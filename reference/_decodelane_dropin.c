/* kvcert.reference._decodelane, vLLM's per-step calls for a running request's decode chunk:
 * the drop-in's `allocate_slots` (kvcert.reference.vllm.KVCacheManager) for a chunk that
 * extends the request (synchronous scheduling) or that is scheduled behind the chunk in
 * flight (asynchronous: its slots held, `_schedule_pending`), and `start_pending`, which
 * starts such chunks once the step before them has ended.
 *
 * The drop-in's Python methods are the definitions: kvcert.reference.vllm.lane says when a
 * manager is served here, and kvcert.conformance.vllm.checks.drop_in_lane holds the two
 * equal, answer for answer and state for state, through vLLM's own Scheduler. A call takes
 * the core's decode lane (Lane_extend, lane_reserve) directly; any call outside the
 * contract below (another argument, an admission, a prefill, a pool that cannot fit the
 * chunk, an attribute that cannot be read as a count, a core or lane other than the ones
 * this was built for) is the Python method's, which then answers it from the start, errors
 * included: nothing here has changed anything by then. The managers served
 * have no runner checkpoints, so a chunk's inner checkpoint (`_Tracked.inner`) is 0 on both
 * paths and never written here. For a state hybrid each chunk served runs the runner-columns
 * check (columns_held) where the Python method would. */
#include "_decodelane_dropin.h"


/* queue.<name>(item) (no argument when `item` is NULL): for a deque, the chunks' queue
 * (`_Tracked.pending`), through its type's `method` with no lookup per call. */
static PyObject *
queue_call(PyObject *queue, PyObject *method, PyObject *name, PyObject *item)
{
    if (Py_IS_TYPE(queue, (PyTypeObject *)deque_type)) {
        PyObject *args[2] = {queue, item};
        return PyObject_Vectorcall(method, args, item ? 2 : 1, NULL);
    }
    return item ? PyObject_CallMethodOneArg(queue, name, item)
                : PyObject_CallMethodNoArgs(queue, name);
}

/* An attribute read as count_of reads it: 1 read, 0 not a count here, -1 error. */
static int
attr_count(PyObject *obj, PyObject *name, long long *out)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        return -1;
    }
    int read = count_of(value, out);
    Py_DECREF(value);
    return read;
}

/* Whether the manager still runs the core and lane this was built for. */
static int
same_core(DropIn *self)
{
    PyObject *core = lane_get(self->manager, s_core);
    if (core == NULL) {
        PyErr_Clear();
        return 0;
    }
    int same = core == self->core;
    Py_DECREF(core);
    if (!same) {
        return 0;
    }
    PyObject *lane = lane_get(self->core, s_lane);
    if (lane == NULL) {
        PyErr_Clear();
        return 0;
    }
    same = lane == self->lane;
    Py_DECREF(lane);
    return same;
}

/* vLLM's tokens from `known` to the least of `end` and its token count (a slice of its
 * all_token_ids, which stops at the count), as a list: one read where num_tokens and the
 * slice would be two calls into Python; `*count`, when asked, is that token count. A
 * ConstantList (`token_list`) is sliced through the list it keeps, as its __getitem__
 * would, without that Python call. */
static PyObject *
tokens_from(DropIn *self, PyObject *request, long long known, long long end, Py_ssize_t *count)
{
    PyObject *all = PyObject_GetAttr(request, s_all_token_ids);
    if (all == NULL) {
        return NULL;
    }
    if ((PyObject *)Py_TYPE(all) == self->token_list) {
        PyObject *kept = PyObject_GetAttr(all, s_wrapped);
        if (kept == NULL || !PyList_CheckExact(kept)) {
            PyErr_Clear(); /* not as lane.py found it: its own __getitem__ answers */
            Py_XDECREF(kept);
        } else {
            Py_DECREF(all);
            if (count != NULL) {
                *count = PyList_GET_SIZE(kept);
            }
            PyObject *part = PyList_GetSlice(kept, (Py_ssize_t)known, (Py_ssize_t)end);
            Py_DECREF(kept);
            return part; /* PyList_GetSlice stops at the list's end, as a slice does */
        }
    }
    if (count != NULL && (*count = PyObject_Length(all)) < 0) {
        Py_DECREF(all);
        return NULL;
    }
    PyObject *part = PySequence_GetSlice(all, (Py_ssize_t)known, (Py_ssize_t)end);
    Py_DECREF(all);
    if (part == NULL || PyList_CheckExact(part)) {
        return part;
    }
    Py_SETREF(part, PySequence_List(part));
    return part;
}

/* The manager's _check_runner_columns(request, start, end, 0): 1 returned, 0 raised. */
int
call_check_columns(DropIn *self, PyObject *request, long long start, long long end)
{
    PyObject *method = PyObject_GetAttr(self->manager, s_check_columns);
    PyObject *checked =
        method == NULL ? NULL : PyObject_CallFunction(method, "OLLi", request, start, end, 0);
    Py_XDECREF(method);
    Py_XDECREF(checked);
    return checked != NULL;
}

/* _check_runner_columns for vLLM's chunk [start, end) of a manager with state groups and
 * neither drafts' blocks nor runner checkpoints: every state table holds a block at the
 * running state's column, ceil(end / block size) - 1. Where one does not, the manager's
 * method runs, to raise its IntegrationError; one replaced on the manager (a wrapper, a
 * broken twin) runs for every chunk, as the Python `_extend` calls it. 1 held (or the
 * method returned), 0 on error. */
static int
columns_held(DropIn *self, PyObject *request, PyObject *mine, long long start, long long end)
{
    if (self->states == 0) {
        return 1;
    }
    PyObject *instance = PyObject_GenericGetDict(self->manager, NULL);
    int replaced = instance == NULL ? -1 : PyDict_Contains(instance, s_check_columns);
    Py_XDECREF(instance);
    if (replaced) {
        return replaced < 0 ? 0 : call_check_columns(self, request, start, end);
    }
    PyObject *tables = lane_get(mine, s_tables);
    if (tables == NULL) {
        return 0;
    }
    int held = PyList_CheckExact(tables);
    for (Py_ssize_t k = 0; held && k < self->states; k++) {
        Py_ssize_t g = self->state_group[k];
        PyObject *table = g < PyList_GET_SIZE(tables) ? PyList_GET_ITEM(tables, g) : NULL;
        long long column = cdiv(end, self->state_size[k]) - 1;
        held = table != NULL && PyList_CheckExact(table) && column >= 0 &&
               column < PyList_GET_SIZE(table);
        if (held) {
            long long block = entry(table, (Py_ssize_t)column);
            if (block == -1 && PyErr_Occurred()) {
                Py_DECREF(tables);
                return 0;
            }
            held = block != 0;
        }
    }
    Py_DECREF(tables);
    return held ? 1 : call_check_columns(self, request, start, end);
}

/* The core's extend of a decode chunk through the lane: its answer, None (nothing changed:
 * the general path's) or NULL. `current`: the core's step being scheduled (its `_step`),
 * where the caller has read it; NULL reads it. */
static PyObject *
lane_extend(DropIn *self, PyObject *rid, long long budget, PyObject *appended,
            long long lookahead, PyObject *step, PyObject *current)
{
    current = current ? Py_NewRef(current) : lane_get(self->core, s_step);
    PyObject *in_flight = current ? lane_get(self->core, s_in_flight) : NULL;
    PyObject *budget_obj = PyLong_FromLongLong(budget);
    PyObject *ahead = PyLong_FromLongLong(lookahead);
    PyObject *answer = NULL;
    if (in_flight != NULL && budget_obj != NULL && ahead != NULL) {
        PyObject *argv[9] = {self->requests, rid, budget_obj, appended, ahead,
                             step, zero, in_flight, current};
        answer = Lane_extend((Lane *)self->lane, argv, 9);
    }
    Py_XDECREF(current);
    Py_XDECREF(in_flight);
    Py_XDECREF(budget_obj);
    Py_XDECREF(ahead);
    return answer;
}

/* A decode chunk of the `appended` tokens through the lane's lane_decode, for the core's
 * record `mine` of `rid`, every one of whose `tokens` is computed and nothing scheduled,
 * launched in `step` (None: the step being scheduled, `current`; NULL: read it): Lane_extend's
 * answer without its reads of what the caller has read. The arguments are checked as
 * Lane_extend checks them; where they or the core's chunks in flight are not as that
 * expects, Lane_extend answers. */
static PyObject *
decode_through_lane(DropIn *self, PyObject *rid, PyObject *mine, PyObject *tokens,
                    long long computed, PyObject *appended, long long lookahead, PyObject *step,
                    PyObject *current)
{
    Py_ssize_t budget = PyList_GET_SIZE(appended), count = 0;
    PyObject *allowed = PyLong_FromSsize_t(budget);
    PyObject *now = allowed == NULL ? NULL
                    : current      ? Py_NewRef(current)
                                   : lane_get(self->core, s_step);
    PyObject *in_flight = now ? lane_get(self->core, s_in_flight) : NULL;
    PyObject *answer = NULL;
    if (in_flight != NULL) {
        if (PyDict_CheckExact(in_flight) && PyLong_CheckExact(now) && lookahead <= MAX_PLAN &&
            lane_launchable(step, now) && decode_tokens_valid(appended, allowed, &count)) {
            answer = lane_decode((Lane *)self->lane, mine, rid, tokens, computed, appended, count,
                                 lookahead, step == Py_None ? now : step, in_flight);
        } else {
            answer = lane_extend(self, rid, budget, appended, lookahead, step, now);
        }
    }
    Py_XDECREF(allowed);
    Py_XDECREF(now);
    Py_XDECREF(in_flight);
    return answer;
}

/* _extend's chunk with nothing in flight or pending: a decode chunk (every known token
 * computed; the sampled ones appended) or a prompt's next chunk (known tokens only; one
 * reaching past them is the Python method's). No served manager has runner checkpoints
 * or drafts' state blocks, so the chunk's checkpoint is 0 on both paths. */
static int
extend_chunk(DropIn *self, PyObject *request, PyObject *rid, PyObject *mine, long long computed,
             long long start, long long end, long long slots, PyObject *current,
             PyObject **answer)
{
    PyObject *tokens = lane_get(mine, s_tokens);
    if (tokens == NULL) {
        return -1;
    }
    Py_ssize_t known = PyObject_Length(tokens);
    if (known < computed) { /* -1: an error; else not a state the core makes (the Python
                             * method says what is wrong) */
        Py_DECREF(tokens);
        return known < 0 ? -1 : 0;
    }
    Py_ssize_t count;
    PyObject *appended = tokens_from(self, request, known, end, &count);
    if (appended == NULL) {
        Py_DECREF(tokens);
        return -1;
    }
    long long real_end = min_ll(end, (long long)count);
    if (real_end - computed < 1 || (known != computed && PyList_GET_SIZE(appended))) {
        Py_DECREF(tokens);
        Py_DECREF(appended); /* drafts only (slots, nothing computed), or prompt and samples */
        return 0;
    }
    long long lookahead = max_ll(slots - real_end, 0);
    PyObject *result =
        known == computed
            ? decode_through_lane(self, rid, mine, tokens, computed, appended, lookahead, Py_None,
                                  current)
            : lane_extend(self, rid, real_end - computed, appended, lookahead, Py_None, current);
    Py_DECREF(tokens);
    Py_DECREF(appended);
    if (result == NULL) {
        return -1;
    }
    if (result == Py_None) {
        Py_DECREF(result);
        return 0;
    }
    if (!columns_held(self, request, mine, start, end)) {
        Py_DECREF(result);
        return -1;
    }
    *answer = handed_out(self, rid, result);
    Py_DECREF(result);
    return *answer == NULL ? -1 : 1;
}

/* _schedule_pending's chunk [start, end): the core's reserve of its slots (no table changes
 * when they are held already, else the lane's allocation), the runner's columns checked, the
 * chunk queued for start_pending. Where they are held, reserve's holds_slots: an attention
 * group's last position up to the slots, a state group's running state at the chunk's end
 * (`reach`) when that lies past the chunk in flight (no drafts' blocks here: table_end is
 * the block `reach` falls in). */
static int
pending_chunk(DropIn *self, PyObject *request, PyObject *rid, PyObject *mine, PyObject *tracked,
              long long computed, long long scheduled, long long start, long long end,
              long long slots, PyObject *current, PyObject **answer)
{
    long long held, pipelined;
    if (!lane_get_ll(mine, s_lookahead, &held) || !lane_get_ll(mine, s_pipelined, &pipelined)) {
        return -1;
    }
    long long lookahead = max_ll(held, slots - computed - scheduled);
    long long reach = max_ll(pipelined, end);
    Lane *lane = (Lane *)self->lane;
    PyObject *result = NULL; /* the lane's Scheduled, when it allocated */
    if (lookahead != held || reach != pipelined) {
        long long last_token = computed + scheduled + lookahead; /* holds_slots' end */
        PyObject *tables = lane_get(mine, s_tables);
        if (tables == NULL) {
            return -1;
        }
        int holds = PyList_CheckExact(tables) && PyList_GET_SIZE(tables) == lane->groups;
        for (Py_ssize_t g = 0; holds && g < lane->groups; g++) {
            long long upto = last_token;
            if (lane->kind[g] == STATE) {
                if (reach <= computed + scheduled) {
                    continue; /* its running state is the chunk in flight's */
                }
                upto = reach;
            }
            PyObject *table = PyList_GET_ITEM(tables, g);
            long long last = cdiv(upto, lane->size[g]) - 1;
            holds = PyList_CheckExact(table) && last >= 0 && last < PyList_GET_SIZE(table);
            if (holds) {
                long long block = entry(table, (Py_ssize_t)last);
                if (block == -1 && PyErr_Occurred()) {
                    Py_DECREF(tables);
                    return -1;
                }
                holds = block != 0;
            }
        }
        Py_DECREF(tables);
        if (holds) { /* releases nothing, changes no table: the quiet bounds stand */
            if (!lane_set_ll(mine, s_lookahead, lookahead) ||
                !lane_set_ll(mine, s_pipelined, reach)) {
                return -1;
            }
        } else {
            result = lane_reserve(lane, mine, computed, computed + scheduled, lookahead, reach);
            if (result == NULL || result == Py_None) {
                Py_XDECREF(result);
                return result == NULL ? -1 : 0; /* Waiting, or beyond the lane: Python's */
            }
        }
    }
    if (!columns_held(self, request, mine, start, end)) {
        Py_XDECREF(result);
        return -1;
    }
    PyObject *queue = lane_get(tracked, s_pending);
    PyObject *ends = PyLong_FromLongLong(end), *reserved = PyLong_FromLongLong(slots);
    PyObject *chunk = ends && reserved ? PyTuple_Pack(4, ends, reserved, current, zero) : NULL;
    PyObject *added = queue && chunk ? queue_call(queue, deque_append, s_append, chunk) : NULL;
    Py_XDECREF(queue);
    Py_XDECREF(ends);
    Py_XDECREF(reserved);
    Py_XDECREF(chunk);
    if (added == NULL) {
        Py_XDECREF(result);
        return -1;
    }
    Py_DECREF(added);
    *answer = result ? handed_out(self, rid, result) : Py_NewRef(self->empty);
    Py_XDECREF(result);
    return *answer == NULL ? -1 : 1;
}

/* allocate_slots(request, num_new_tokens, num_lookahead_tokens=) for a running request's
 * decode chunk: 1 served (*answer, or NULL on error), 0 the Python method's, -1 error. */
static int
serve_allocate(DropIn *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
               PyObject **answer)
{
    long long tokens, ahead = 0, vllm_computed, keep, step = 0;
    if (nargs != 2 || !count_of(args[1], &tokens)) {
        return 0;
    }
    if (kwnames != NULL) {
        PyObject *name = PyTuple_GET_SIZE(kwnames) == 1 ? PyTuple_GET_ITEM(kwnames, 0) : NULL;
        if (name == NULL || PyUnicode_Compare(name, s_num_lookahead_tokens) != 0 ||
            !count_of(args[2], &ahead)) {
            PyErr_Clear();
            return 0;
        }
    }
    if (!same_core(self)) {
        return 0;
    }
    PyObject *request = args[0];
    PyObject *rid = PyObject_GetAttr(request, s_request_id);
    if (rid == NULL || !PyUnicode_CheckExact(rid)) {
        PyErr_Clear();
        Py_XDECREF(rid);
        return 0;
    }
    int served = 0;
    PyObject *mine = PyDict_GetItemWithError(self->requests, rid);
    PyObject *tracked = mine ? PyDict_GetItemWithError(self->tracked, rid) : NULL;
    long long computed, scheduled;
    PyObject *current = NULL; /* the core's step being scheduled */
    if (tracked == NULL) { /* an admission (or a request the facade never saw) */
        PyErr_Clear();
        goto done;
    }
    Py_INCREF(mine);
    Py_INCREF(tracked);
    served = attr_count(request, s_num_computed_tokens, &vllm_computed);
    if (served == 1) {
        PyObject *kept = lane_get(tracked, s_keep);
        served = kept == NULL ? -1 : count_of(kept, &keep);
        Py_XDECREF(kept);
    }
    if (served == 1) {
        current = lane_get(self->core, s_step);
        served = current == NULL ? -1 : count_of(current, &step);
    }
    if (served < 0) { /* an attribute missing or failing: the Python method says so */
        PyErr_Clear();
        served = 0;
    }
    if (served == 1 && !(lane_get_ll(mine, s_computed, &computed) &&
                         lane_get_ll(mine, s_scheduled, &scheduled))) {
        served = -1;
    }
    if (served == 1 && vllm_computed < computed + scheduled) {
        served = 0; /* a rewind: the Python method refuses it */
    }
    Py_ssize_t waiting = 0;
    if (served == 1) {
        PyObject *queue = lane_get(tracked, s_pending);
        waiting = queue == NULL ? -1 : PyObject_Length(queue);
        Py_XDECREF(queue);
        served = waiting < 0 ? -1 : 1;
    }
    if (served == 1) {
        long long end = vllm_computed + tokens;
        long long slots = min_ll(max_ll(end + ahead, keep), self->max_model_len);
        if (scheduled && step == 0) {
            served = 0; /* unnumbered steps: the Python method ends the last one first */
        } else if (scheduled || waiting) {
            served = pending_chunk(self, request, rid, mine, tracked, computed, scheduled,
                                   vllm_computed, end, slots, current, answer);
        } else {
            served = extend_chunk(self, request, rid, mine, computed, vllm_computed, end, slots,
                                  current, answer);
        }
    }
    Py_XDECREF(current);
    Py_DECREF(mine);
    Py_DECREF(tracked);
done:
    Py_DECREF(rid);
    return served;
}

/* The Python definition, called with the manager before the caller's arguments. */
static PyObject *
call_with_manager(DropIn *self, PyObject *function, PyObject *const *args, Py_ssize_t nargs,
                  PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[16];
    PyObject **stack = total < 16 ? small : PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *));
    if (stack == NULL) {
        return PyErr_NoMemory();
    }
    stack[0] = self->manager;
    if (total) {
        memcpy(stack + 1, args, (size_t)total * sizeof(PyObject *));
    }
    PyObject *answer = PyObject_Vectorcall(function, stack, (size_t)nargs + 1, kwnames);
    if (stack != small) {
        PyMem_Free(stack);
    }
    return answer;
}

PyObject *
DropIn_call(DropIn *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *answer = NULL;
    int served = serve_allocate(self, args, nargs, kwnames, &answer);
    if (served < 0) {
        return NULL;
    }
    return served ? answer : call_with_manager(self, self->general, args, nargs, kwnames);
}

/* start_pending's chunk of `rid`: 1 started here, 0 the Python _start_chunk's, -1 error. */
static int
start_one(DropIn *self, PyObject *rid, PyObject *queue, PyObject *mine, PyObject *request)
{
    long long computed, known, end, slots, checkpoint;
    PyObject *tokens = lane_get(mine, s_tokens);
    if (tokens == NULL || !lane_get_ll(mine, s_computed, &computed)) {
        Py_XDECREF(tokens);
        return -1;
    }
    known = PyObject_Length(tokens);
    PyObject *oldest = PySequence_GetItem(queue, 0);
    PyObject *latest = oldest ? PySequence_GetItem(queue, -1) : NULL;
    int served = latest != NULL && known >= 0;
    served = served && PyTuple_CheckExact(oldest) && PyTuple_GET_SIZE(oldest) == 4 &&
             PyTuple_CheckExact(latest) && PyTuple_GET_SIZE(latest) == 4 &&
             count_of(PyTuple_GET_ITEM(oldest, 0), &end) &&
             count_of(PyTuple_GET_ITEM(latest, 1), &slots) &&
             count_of(PyTuple_GET_ITEM(oldest, 3), &checkpoint) && checkpoint == 0;
    PyObject *step = served ? Py_NewRef(PyTuple_GET_ITEM(oldest, 2)) : NULL;
    Py_XDECREF(oldest);
    Py_XDECREF(latest);
    if (PyErr_Occurred()) {
        Py_DECREF(tokens);
        Py_XDECREF(step);
        return -1;
    }
    if (served && request != NULL) {
        served = 0;
        if (known == computed) { /* else a prefill: Python's */
            PyObject *appended = tokens_from(self, request, known, end, NULL);
            long long real_end = appended ? known + PyList_GET_SIZE(appended) : 0;
            PyObject *result = appended == NULL || real_end == known ? NULL
                               : decode_through_lane(self, rid, mine, tokens, computed, appended,
                                                     max_ll(slots - real_end, 0), step, NULL);
            /* nothing to compute (vLLM stopped the request): the chunk leaves, slots held */
            served = appended == NULL ? -1 : real_end == known ? 1
                     : result == NULL ? -1 : result != Py_None;
            Py_XDECREF(appended);
            int nothing = served == 1 && result ? allocated_nothing((Lane *)self->lane, result) : 1;
            if (nothing <= 0) { /* its slots were held: new blocks are an error */
                PyObject *checked = nothing < 0 ? NULL
                                    : PyObject_CallMethodObjArgs(self->manager, s_check_started,
                                                                 rid, result, NULL);
                served = checked == NULL ? -1 : 1;
                Py_XDECREF(checked);
            }
            Py_XDECREF(result);
        }
    }
    Py_DECREF(tokens);
    Py_XDECREF(step);
    if (served == 1) { /* as the Python method, the chunk leaves the queue */
        PyObject *popped = queue_call(queue, deque_popleft, s_popleft, NULL);
        served = popped == NULL ? -1 : 1;
        Py_XDECREF(popped);
    }
    return served;
}

/* A request with chunks pending, as start_pending lists them before starting any. */
typedef struct {
    PyObject *rid, *queue, *mine;
} Ready;

static void
ready_release(Ready *ready, Py_ssize_t count)
{
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_DECREF(ready[k].rid);
        Py_DECREF(ready[k].queue);
        Py_DECREF(ready[k].mine);
    }
    PyMem_Free(ready);
}

PyObject *
DropIn_start_pending(DropIn *self, PyObject *requests)
{
    if (!PyDict_CheckExact(requests) || !same_core(self)) {
        return PyObject_CallFunctionObjArgs(self->pending, self->manager, requests, NULL);
    }
    /* the requests with chunks pending, each still the core's (else Python says why), listed
     * first: a chunk started below may end a request (the Python _start_chunk), and the
     * definition lists them all before starting any. Held in a C array: no tuple a request. */
    Py_ssize_t size = PyDict_GET_SIZE(self->tracked), count = 0;
    Ready *ready = PyMem_Malloc((size_t)(size ? size : 1) * sizeof(Ready));
    if (ready == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *rid, *tracked;
    Py_ssize_t at = 0;
    int failed = 0;
    while (!failed && PyDict_Next(self->tracked, &at, &rid, &tracked)) {
        PyObject *queue = lane_get(tracked, s_pending);
        Py_ssize_t waiting = queue == NULL ? -1 : PyObject_Length(queue);
        PyObject *mine = waiting > 0 ? PyDict_GetItemWithError(self->requests, rid) : NULL;
        if (waiting < 0 || PyErr_Occurred()) {
            failed = 1;
        } else if (waiting > 0 && mine == NULL) {
            Py_DECREF(queue);
            ready_release(ready, count);
            return PyObject_CallFunctionObjArgs(self->pending, self->manager, requests, NULL);
        } else if (mine != NULL) {
            ready[count++] = (Ready){Py_NewRef(rid), Py_NewRef(queue), Py_NewRef(mine)};
        }
        Py_XDECREF(queue);
    }
    for (Py_ssize_t k = 0; !failed && k < count; k++) {
        PyObject *name = ready[k].rid, *queue = ready[k].queue, *mine = ready[k].mine;
        long long scheduled;
        if (!lane_get_ll(mine, s_scheduled, &scheduled)) {
            failed = 1;
            break;
        }
        if (scheduled) {
            continue; /* its chunk in flight runs in a later step */
        }
        PyObject *request = PyDict_GetItemWithError(requests, name);
        int served = PyErr_Occurred() ? -1 : start_one(self, name, queue, mine, request);
        if (served == 0) {
            PyObject *progress = PyObject_CallMethodOneArg(self->core, s_progress_of, name);
            PyObject *done = progress == NULL ? NULL
                             : PyObject_CallFunctionObjArgs(self->start_chunk, self->manager, name,
                                                            queue, progress,
                                                            request ? request : Py_None, NULL);
            served = done == NULL ? -1 : 1;
            Py_XDECREF(progress);
            Py_XDECREF(done);
        }
        failed = served < 0;
    }
    ready_release(ready, count);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* end_step(step=None): the drop-in's end_step for a manager publishing no events (the
 * decode lane serves no core that records them), through the lane's end_step: the facade's
 * and the core's Python frames skipped. Any other call, a manager with events on, a core
 * or lane other than the ones this was built for, or a step the lane leaves to the
 * definition (which then says why it is invalid) is the Python method's. */
PyObject *
DropIn_end_step(DropIn *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames == NULL && nargs <= 1 && same_core(self)) {
        PyObject *events = PyObject_GetAttr(self->manager, s_events);
        if (events == NULL) {
            return NULL;
        }
        Py_DECREF(events);
        if (events == Py_False) {
            PyObject *call[2] = {self->core, nargs ? args[0] : Py_None};
            PyObject *answer = Lane_end_step((Lane *)self->lane, call, 2);
            if (answer != Py_None) {
                return answer; /* the count, or NULL: an error the definition would raise */
            }
            Py_DECREF(answer);
        }
    }
    return call_with_manager(self, self->end_step, args, nargs, kwnames);
}
