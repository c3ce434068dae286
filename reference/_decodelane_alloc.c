/* kvcert.reference._decodelane, a chunk's table changes carried out on the pool (release,
 * allocation off the lru queue, the tables filled: what KVCacheManager._drop and _fill do),
 * for a decode step (_decodelane_step.c plans it) and for an admission's first chunk
 * (`Lane_admit`: the second half of KVCacheManager.admit, once its hit is taken). */
#include "_decodelane.h"

/* How many distinct released blocks hold one reference (releasing them frees them): each
 * such block's count is marked while counting, so a block listed twice counts once. */
static Py_ssize_t
freed_by(Lane *lane, const Plan *plan, int *counts)
{
    Py_ssize_t freed = 0;
    for (Py_ssize_t k = 0; k < plan->released; k++) {
        long long block = lane->released[3 * k + 2];
        if (counts[block] == 1) {
            counts[block] = INT_MIN;
            freed++;
        }
    }
    for (Py_ssize_t k = 0; k < plan->released; k++) {
        long long block = lane->released[3 * k + 2];
        if (counts[block] == INT_MIN) {
            counts[block] = 1;
        }
    }
    return freed;
}

/* The pool's int32 array `array` as a writable buffer; 0 on error. */
static int
open_ints(PyObject *array, Py_buffer *view)
{
    if (PyObject_GetBuffer(array, view, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        return 0;
    }
    if (view->itemsize != sizeof(int) || view->format == NULL || strcmp(view->format, "i") != 0) {
        PyErr_SetString(PyExc_TypeError, "the pool's counts and links must be array('i')");
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* Release the planned entries (ALLOC-SKIP-1; lru: in the listed order, freed blocks join the
 * queue's tail), then allocate the wanted positions off its head (ALLOC-EVICT-1) and fill
 * them; the blocks per group, or NULL on error. Nothing fails half way once the pool is
 * known to fit, but for memory. */
static PyObject *
apply_plan(Lane *lane, PyObject *tables, PyObject *held_from, const Plan *plan, int *counts,
           int *links, Py_ssize_t pool_size, long long *num_free, PyObject **taken_out)
{
    /* release: null the entries, move each touched group's first held position, drop */
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {
        return NULL;
    }
    for (Py_ssize_t k = 0; k < plan->released; k++) {
        long long *at = lane->released + 3 * k;
        PyObject *table = PyList_GET_ITEM(tables, at[0]);
        PyList_SetItem(table, (Py_ssize_t)at[1], Py_NewRef(zero));
    }
    for (Py_ssize_t g = 0; g < lane->groups; g++) {
        int touched = 0;
        for (Py_ssize_t k = 0; k < plan->released && !touched; k++) {
            touched = lane->released[3 * k] == g;
        }
        if (!touched) {
            continue;
        }
        PyObject *table = PyList_GET_ITEM(tables, g);
        Py_ssize_t low = (Py_ssize_t)PyLong_AsLongLong(PyList_GET_ITEM(held_from, g));
        while (low < PyList_GET_SIZE(table) && entry(table, low) == 0) {
            low++;
        }
        PyObject *number = PyLong_FromSsize_t(low);
        if (number == NULL) {
            Py_DECREF(zero);
            return NULL;
        }
        PyList_SetItem(held_from, g, number);
    }
    /* the blocks whose count reaches 0, in order, then join the tail in that order (a
     * block listed twice is stepped twice, as refcounts.drop steps it) */
    Py_ssize_t freed = 0;
    int *to_free = plan->released ? PyMem_Malloc((size_t)plan->released * sizeof(int)) : NULL;
    if (plan->released && to_free == NULL) {
        Py_DECREF(zero);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < plan->released; k++) {
        int block = (int)lane->released[3 * k + 2];
        if (--counts[block] == 0) {
            to_free[freed++] = block;
        }
    }
    if (freed) {
        int last = -counts[0];
        if (last < 0 || last >= pool_size) {
            PyErr_Format(PyExc_ValueError, "the free queue's tail is block %d: its links were "
                                           "not kept by one queue", last);
            PyMem_Free(to_free);
            Py_DECREF(zero);
            return NULL;
        }
        for (Py_ssize_t k = 0; k < freed; k++) {
            int block = to_free[k];
            links[last] = block;
            counts[block] = -last;
            last = block;
        }
        links[last] = 0;
        counts[0] = -last;
        *num_free += freed;
    }
    PyMem_Free(to_free);
    /* allocate: the first blocks of the queue, unlinked as one run */
    PyObject *taken = PyList_New((Py_ssize_t)plan->wanted);
    if (taken == NULL) {
        Py_DECREF(zero);
        return NULL;
    }
    *taken_out = taken;
    if (plan->wanted) {
        int block = links[0];
        for (Py_ssize_t k = 0; k < plan->wanted; k++) {
            if (block < 1 || block >= pool_size) { /* refused, not followed */
                PyErr_Format(PyExc_ValueError, "the free queue reaches block %d: its links "
                                               "were not kept by one queue", block);
                Py_DECREF(zero);
                return NULL;
            }
            PyObject *number = PyLong_FromLong(block);
            if (number == NULL) {
                Py_DECREF(zero);
                return NULL;
            }
            PyList_SET_ITEM(taken, k, number);
            block = links[block];
        }
        if (block < 0 || block >= pool_size) {
            PyErr_Format(PyExc_ValueError, "the free queue reaches block %d: its links were "
                                           "not kept by one queue", block);
            Py_DECREF(zero);
            return NULL;
        }
        links[0] = block;
        counts[block] = 0; /* the new head (or, when none is left, the sentinel) */
    }
    /* fill the wanted positions, group by group */
    PyObject *added = PyTuple_New(lane->groups);
    if (added == NULL) {
        Py_DECREF(zero);
        return NULL;
    }
    Py_ssize_t used = 0;
    for (Py_ssize_t g = 0; g < lane->groups; g++) {
        Py_ssize_t n = plan->per_group[g];
        PyObject *blocks = PyTuple_New(n);
        if (blocks == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(added, g, blocks);
        if (!n) {
            continue;
        }
        PyObject *table = PyList_GET_ITEM(tables, g);
        long long top = lane->wanted[used + n - 1];
        while (PyList_GET_SIZE(table) <= top) {
            if (PyList_Append(table, zero) < 0) {
                goto fail;
            }
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            PyObject *number = PyList_GET_ITEM(taken, used + k);
            PyTuple_SET_ITEM(blocks, k, Py_NewRef(number));
            PyList_SetItem(table, (Py_ssize_t)lane->wanted[used + k], Py_NewRef(number));
        }
        long long low = PyLong_AsLongLong(PyList_GET_ITEM(held_from, g));
        if (lane->wanted[used] < low) {
            PyObject *number = PyLong_FromLongLong(lane->wanted[used]);
            if (number == NULL) {
                goto fail;
            }
            PyList_SetItem(held_from, g, number);
        }
        used += n;
    }
    Py_DECREF(zero);
    return added;
fail:
    Py_DECREF(zero);
    Py_DECREF(added);
    return NULL;
}


/* The plan carried out on the pool: its released entries released, its wanted positions
 * given blocks off the queue's head (their keys forgotten, ALLOC-EVICT-1, each then held
 * once) and the pool's free count moved. The new blocks per group (lane->no_blocks when it
 * wants none), None when the pool cannot fit it (nothing changed), NULL on error. */
PyObject *
carry_out(Lane *lane, PyObject *tables, PyObject *held_from, const Plan *plan)
{
    Py_buffer counts_view, links_view;
    long long num_free;
    if (!lane_get_ll(lane->pool, s_num_free, &num_free) ||
        !open_ints(lane->counts, &counts_view)) {
        return NULL;
    }
    PyObject *result = NULL, *taken = NULL;
    if (!open_ints(lane->links, &links_view)) {
        PyBuffer_Release(&counts_view);
        return NULL;
    }
    Py_ssize_t pool_size = counts_view.len / (Py_ssize_t)sizeof(int);
    if (links_view.len != counts_view.len) {
        PyErr_SetString(PyExc_ValueError, "the pool's counts and links differ in length");
        goto done;
    }
    for (Py_ssize_t k = 0; k < plan->released; k++) { /* before anything changes */
        if (lane->released[3 * k + 2] >= pool_size) {
            PyErr_Format(PyExc_ValueError, "a table holds block %lld, outside the pool",
                         lane->released[3 * k + 2]);
            goto done;
        }
    }
    Py_ssize_t freed = freed_by(lane, plan, counts_view.buf);
    if (plan->wanted > num_free + freed) {
        result = Py_NewRef(Py_None); /* Waiting: the general path says how much is missing */
        goto done;
    }
    PyObject *added = apply_plan(lane, tables, held_from, plan, counts_view.buf,
                                 links_view.buf, pool_size, &num_free, &taken);
    if (added == NULL) {
        goto done;
    }
    if (plan->wanted) {
        PyObject *forgotten = PyObject_CallMethodObjArgs(
            lane->keys, s_forget_run, taken, lane->evictions, lane->dead_evictions, NULL);
        long long registered;
        if (forgotten == NULL || !lane_get_ll(lane->pool, s_num_registered, &registered) ||
            !lane_set_ll(lane->pool, s_num_registered, registered - PyLong_AsLongLong(forgotten))) {
            Py_XDECREF(forgotten);
            Py_DECREF(added);
            goto done;
        }
        Py_DECREF(forgotten);
        int *counts = counts_view.buf;
        for (Py_ssize_t k = 0; k < plan->wanted; k++) {
            counts[PyLong_AsLong(PyList_GET_ITEM(taken, k))] = 1;
        }
    } else {
        Py_SETREF(added, Py_NewRef(lane->no_blocks));
    }
    if (!lane_set_ll(lane->pool, s_num_free, num_free - plan->wanted)) {
        Py_DECREF(added);
        goto done;
    }
    result = added;
done:
    PyBuffer_Release(&counts_view);
    PyBuffer_Release(&links_view);
    Py_XDECREF(taken);
    return result;
}

/* TablePlanner.to_hold: how many new blocks `request` (its tables, its first chunk from
 * `computed` on of `scheduled` tokens) holds at once when it has computed its first `tokens`
 * in steps of that chunk: every position its last step keeps (ALLOC-HOLD-1) that holds no
 * block now. -1 where the general path must count (a position before a table's first), -2
 * on error. */
static long long
to_hold(Lane *lane, PyObject *tables, long long computed, long long scheduled, int decoding,
        long long tokens)
{
    long long start = max_ll(computed, tokens - max_ll(scheduled, 1)), count = 0;
    for (Py_ssize_t g = 0; g < lane->groups; g++) {
        PyObject *table = PyList_GET_ITEM(tables, g);
        long long low = first_read(lane, g, start, tokens);
        long long high = state_table_end(lane, g, tokens, decoding); /* groups.table_end */
        long long held = min_ll(high, PyList_GET_SIZE(table));
        if (low < 0) {
            return -1;
        }
        count += max_ll(0, high - max_ll(low, held));
        for (long long j = low; j < held; j++) {
            long long block = entry(table, (Py_ssize_t)j);
            if (block == -1 && PyErr_Occurred()) {
                return -2;
            }
            count += block == 0;
        }
    }
    return count;
}

/* The plan's scratch lists past a decode step's size go once an admission has used them: a
 * long prompt's positions would stay held for the lane's life (16 bytes a block). */
static void
trim_scratch(Lane *lane)
{
    enum { KEPT = 4096 };
    if (lane->wanted_cap > KEPT) {
        PyMem_Free(lane->wanted);
        lane->wanted = NULL, lane->wanted_cap = 0;
    }
    if (lane->released_cap > 3 * KEPT) {
        PyMem_Free(lane->released);
        lane->released = NULL, lane->released_cap = 0;
    }
}

/* The admission's checks and allocation for `request` (the caller's, read below): 1 done,
 * 0 the general path's (nothing changed), -1 error. `*added`: the new blocks per group;
 * `*computed` and `*scheduled`: the request's hit and first chunk. */
static int
admit_first_chunk(Lane *lane, PyObject *request, PyObject *tables, PyObject *held_from,
                  PyObject *const *args, PyObject **added, long long *computed,
                  long long *scheduled)
{
    long long reviving, keep_free, fit_keep_free, tokens = 0;
    int fit = args[5] != Py_None;
    if (!count_of(args[3], &reviving) || !count_of(args[4], &keep_free) ||
        !count_of(args[6], &fit_keep_free) || (fit && (!count_of(args[5], &tokens) || !tokens))) {
        return 0;
    }
    long long lookahead, pipelined, num_free;
    if (!lane_get_ll(request, s_computed, computed) ||
        !lane_get_ll(request, s_scheduled, scheduled) ||
        !lane_get_bound(request, s_lookahead, &lookahead) ||
        !lane_get_ll(request, s_pipelined, &pipelined) ||
        !lane_get_ll(lane->pool, s_num_free, &num_free)) {
        return -1;
    }
    PyObject *flag = lane_get(request, s_decoding);
    int decoding = flag == NULL ? -1 : PyObject_IsTrue(flag);
    Py_XDECREF(flag);
    if (decoding < 0) {
        return -1;
    }
    long long in_flight = *computed + *scheduled;
    if (pipelined || lookahead > MAX_PLAN || in_flight + lookahead > MAX_PLAN) {
        return 0;
    }
    Py_ssize_t *per_group = PyMem_Calloc((size_t)lane->groups + 1, sizeof(Py_ssize_t));
    if (per_group == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Plan plan = {.per_group = per_group};
    int fits, done = -1;
    if (!plan_step(lane, tables, held_from, *computed, in_flight, in_flight + lookahead,
                   in_flight, decoding, &plan, &fits)) {
        goto out;
    }
    if (!fits) { /* a table not a list (plan_step checks each), or a plan too large */
        done = 0;
        goto out;
    }
    plan.released = 0; /* find_hit's tables hold only what the hit reads: admit drops none */
    /* vLLM's whole-prompt gate, then the first chunk beside the blocks kept free; free hit
     * blocks count against both (ALLOC-TWO-PHASE-1): Waiting is the general path's */
    long long whole = fit ? to_hold(lane, tables, *computed, *scheduled, decoding, tokens) : 0;
    if (whole == -2) {
        goto out;
    }
    if (whole < 0 || whole + fit_keep_free > num_free - reviving ||
        plan.wanted + keep_free > num_free - reviving) {
        done = 0;
        goto out;
    }
    PyObject *taken = PyObject_CallMethodObjArgs(lane->pool, s_take, args[2], NULL);
    if (taken == NULL) {
        goto out;
    }
    Py_DECREF(taken);
    *added = carry_out(lane, tables, held_from, &plan);
    if (*added == Py_None) { /* the hits took fewer free blocks than `reviving` counts */
        Py_CLEAR(*added);
        PyErr_SetString(PyExc_ValueError, "admit: the pool's free count fell below what its "
                                          "free hit blocks account for");
    }
    done = *added == NULL ? -1 : 1;
out:
    PyMem_Free(per_group);
    trim_scratch(lane);
    return done;
}

/* admit(request, rid, hits, reviving, keep_free, fit_tokens, fit_keep_free, requests,
 * in_flight, current) -> the Scheduled of KVCacheManager.admit, from where its general path
 * plans the first chunk: `request` is the new Request holding its hit (computed, scheduled,
 * lookahead, decoding, tables, first held positions and commit bound set; no inner
 * checkpoint, no copied blocks), `hits` its hit blocks, not taken yet, `reviving` of them
 * free. The whole-prompt and first-chunk checks, the hits taken, the chunk's blocks given,
 * its quiet bounds, the request running (`requests`) and its chunk launched in step
 * `current` (`in_flight`), as that path does. None (nothing changed) where the general path
 * must answer: Waiting, a plan too large to list, an argument it would refuse. */
PyObject *
Lane_admit(Lane *lane, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !PyUnicode_CheckExact(args[1]) || !PyList_CheckExact(args[2]) ||
        !PyDict_CheckExact(args[7]) || !PyDict_CheckExact(args[8]) ||
        !PyLong_CheckExact(args[9])) {
        PyErr_SetString(PyExc_TypeError, "admit(request, rid: str, hits: list, reviving, "
                                         "keep_free, fit_tokens, fit_keep_free, requests: "
                                         "dict, in_flight: dict, current: int)");
        return NULL;
    }
    PyObject *request = args[0], *rid = args[1], *added = NULL, *answer = NULL;
    PyObject *tables = lane_get(request, s_tables);
    PyObject *held_from = tables == NULL ? NULL : lane_get(request, s_held_from);
    if (held_from == NULL) {
        goto done;
    }
    if (!lists_per_group(lane, tables, held_from)) {
        answer = Py_NewRef(Py_None);
        goto done;
    }
    long long computed, scheduled;
    int admitted =
        admit_first_chunk(lane, request, tables, held_from, args, &added, &computed, &scheduled);
    if (admitted <= 0) {
        answer = admitted ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    if (!plan_quiet(lane, request, tables, held_from, computed + scheduled) ||
        PyDict_SetItem(args[7], rid, request) < 0 ||
        !lane_launch(lane, rid, request, args[9], args[8])) {
        goto done;
    }
    PyObject *after = PyTuple_New(lane->groups); /* each table as it stands, a tuple */
    for (Py_ssize_t g = 0; after != NULL && g < lane->groups; g++) {
        PyObject *table = PyList_AsTuple(PyList_GET_ITEM(tables, g));
        if (table == NULL) {
            Py_CLEAR(after);
            break;
        }
        PyTuple_SET_ITEM(after, g, table);
    }
    if (after != NULL) {
        answer = make_answer(lane, computed, (Py_ssize_t)scheduled, added, after);
        Py_DECREF(after);
    }
done:
    Py_XDECREF(added);
    Py_XDECREF(held_from);
    Py_XDECREF(tables);
    return answer;
}
