/* kvcert.reference._decodelane: a decode step that changes a request's tables, compiled.
 *
 * The same contract as KVCacheManager.extend's general path for one decode chunk (sampled
 * tokens appended, nothing in flight, no checkpoint) of a layout whose groups are all
 * attention (full, sliding window, chunked local) over an lru pool that tracks no liveness
 * and records no events (kvcert.reference.decode_lane says when a manager builds one, and
 * tests/reference/test_decode_lane.py holds the two paths equal, state for state). In that
 * path one step of one request costs about ten microseconds of Python: the table plan
 * (ALLOC-HOLD-1, ALLOC-SKIP-1, ALLOC-WRITE-1), the release (ALLOC-FREE-1, lru), the
 * allocation (ALLOC-EVICT-1) and the decode bounds (ALLOC-SPEC-1's quiet step). Here it is
 * one call over the request's own lists and the pool's arrays.
 *
 * `advance` changes nothing and answers None when the call is outside that contract (a
 * token that is not an id, a budget below the tokens, a chunk in flight, max_model_len, a
 * pool that cannot fit the step): the general path then answers it, errors and Waiting
 * included. Block 0 is the null block; a free block's count entry is its lru predecessor,
 * negated, and `links` the queue's successors (kvcert.reference.refcounts).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>

enum { FULL = 0, WINDOW = 1, CHUNKED = 2 };

/* The largest count a plan may hold: past it a step is the general path's (it answers
 * Waiting without listing positions). */
#define MAX_PLAN ((long long)1 << 40)

typedef struct {
    PyObject_HEAD
    Py_ssize_t groups;
    int *kind;
    long long *size; /* block size */
    long long *span; /* window or chunk; 0 for full attention */
    long long limit; /* max_model_len, or -1 */
    PyObject *pool;  /* num_free, num_registered */
    PyObject *counts;
    PyObject *links;
    PyObject *keys; /* forget_run(blocks, evictions, shadowed) */
    PyObject *evictions;
    PyObject *dead_evictions;
    PyObject *no_blocks;   /* what a step allocating nothing returns */
    PyObject *token_limit; /* no bound: the Python side's TOKEN_LIMIT */
    /* scratch, grown as needed: released (group, position, block) and wanted positions */
    long long *released;
    Py_ssize_t released_cap;
    long long *wanted;
    Py_ssize_t wanted_cap;
} Lane;

static PyObject *s_computed, *s_scheduled, *s_lookahead, *s_decoding, *s_tokens, *s_tables,
    *s_held_from, *s_quiet_end, *s_quiet_state, *s_quiet_slots, *s_quiet_slots_floor,
    *s_num_free, *s_num_registered, *s_forget_run, *s_extend;

static inline long long
min_ll(long long a, long long b)
{
    return a < b ? a : b;
}

static inline long long
max_ll(long long a, long long b)
{
    return a > b ? a : b;
}

static long long
cdiv(long long a, long long b)
{
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

static long long
floordiv(long long a, long long b)
{
    long long q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* ALLOC-HOLD-1: the first position kept while computing from `computed` on. */
static long long
first_read(const Lane *lane, Py_ssize_t g, long long computed)
{
    long long size = lane->size[g], span = lane->span[g];
    switch (lane->kind[g]) {
    case WINDOW:
        return floordiv(computed - (span - 1) > 0 ? computed - (span - 1) : 0, size);
    case CHUNKED:
        return floordiv(floordiv(computed, span) * span, size);
    default:
        return 0;
    }
}

/* The least `computed` whose one-token step no longer reads position `low`; -1: never. */
static long long
first_release(const Lane *lane, Py_ssize_t g, long long low)
{
    long long size = lane->size[g], span = lane->span[g];
    switch (lane->kind[g]) {
    case WINDOW:
        return (low + 1) * size + span - 1;
    case CHUNKED:
        return cdiv((low + 1) * size, span) * span;
    default:
        return -1;
    }
}

/* An attribute of `obj` as a C integer; 0 on error (an int outside long long included). */
static int
get_ll(PyObject *obj, PyObject *name, long long *value)
{
    PyObject *attr = PyObject_GetAttr(obj, name);
    if (attr == NULL) {
        return 0;
    }
    int overflow = 0;
    *value = PyLong_AsLongLongAndOverflow(attr, &overflow);
    Py_DECREF(attr);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "a request counter is outside 64 bits");
        return 0;
    }
    return !(*value == -1 && PyErr_Occurred());
}

static int
set_ll(PyObject *obj, PyObject *name, long long value)
{
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL) {
        return 0;
    }
    int failed = PyObject_SetAttr(obj, name, number);
    Py_DECREF(number);
    return failed == 0;
}

/* A table entry's block; -1 on error. */
static long long
entry(PyObject *table, Py_ssize_t j)
{
    return PyLong_AsLongLong(PyList_GET_ITEM(table, j));
}

static int
grow(long long **buffer, Py_ssize_t *capacity, Py_ssize_t needed)
{
    if (needed <= *capacity) {
        return 1;
    }
    Py_ssize_t capacity_now = needed < 64 ? 64 : needed * 2;
    long long *larger = PyMem_Realloc(*buffer, (size_t)capacity_now * sizeof(long long));
    if (larger == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    *buffer = larger;
    *capacity = capacity_now;
    return 1;
}

static int
compare_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Whether `appended` is a non-empty list or tuple of token ids (ints in 0..2**63 - 1) no
 * longer than `budget`; its length in *count. */
static int
decode_tokens_valid(PyObject *appended, PyObject *budget, Py_ssize_t *count)
{
    if (!PyList_CheckExact(appended) && !PyTuple_CheckExact(appended)) {
        return 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(appended);
    PyObject **items = PySequence_Fast_ITEMS(appended);
    if (n == 0 || !PyLong_CheckExact(budget)) {
        return 0;
    }
    int overflow = 0;
    long long allowed = PyLong_AsLongLongAndOverflow(budget, &overflow);
    if (allowed == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (!overflow && allowed < n) {
        return 0;
    }
    if (overflow < 0) {
        return 0;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!PyLong_CheckExact(items[k])) {
            return 0;
        }
        long long token = PyLong_AsLongLongAndOverflow(items[k], &overflow);
        if (overflow || token < 0) {
            PyErr_Clear();
            return 0;
        }
    }
    *count = n;
    return 1;
}

/* The table positions step [computed, end) releases and wants, as the general path plans
 * them (tables.TablePlanner.changes for attention groups); 0 on error, and *fits = 0 when
 * the plan is too large to list. */
typedef struct {
    Py_ssize_t released;     /* entries in lane->released, three numbers each */
    Py_ssize_t wanted;       /* positions in lane->wanted, group by group */
    Py_ssize_t *per_group;   /* wanted positions per group */
} Plan;

static int
plan_step(Lane *lane, PyObject *tables, PyObject *held_from, long long computed,
          long long end, Plan *plan, int *fits)
{
    plan->released = plan->wanted = 0;
    *fits = 1;
    for (Py_ssize_t g = 0; g < lane->groups; g++) {
        PyObject *table = PyList_GET_ITEM(tables, g);
        if (!PyList_CheckExact(table)) {
            *fits = 0;
            return 1;
        }
        long long size = PyList_GET_SIZE(table), block_size = lane->size[g];
        long long last = cdiv(end, block_size);
        long long low = PyLong_AsLongLong(PyList_GET_ITEM(held_from, g));
        if (low == -1 && PyErr_Occurred()) {
            return 0;
        }
        if (size > last || (low < last && lane->kind[g] != FULL)) {
            long long first = first_read(lane, g, computed);
            /* past the new end (a shrunk lookahead), then what the step no longer reads */
            long long bounds[2][2] = {{max_ll(last, low), size},
                                      {low, min_ll(first, min_ll(last, size))}};
            for (int run = 0; run < 2; run++) {
                for (long long j = bounds[run][1] - 1; j >= bounds[run][0]; j--) {
                    long long block = entry(table, (Py_ssize_t)j);
                    if (block == -1 && PyErr_Occurred()) {
                        return 0;
                    }
                    if (block == 0) {
                        continue;
                    }
                    if (!grow(&lane->released, &lane->released_cap, 3 * (plan->released + 1))) {
                        return 0;
                    }
                    long long *at = lane->released + 3 * plan->released++;
                    at[0] = g, at[1] = j, at[2] = block;
                }
            }
        }
        long long first = floordiv(computed, block_size); /* ALLOC-WRITE-1 */
        long long held = min_ll(last, size);
        long long growth = max_ll(0, last - max_ll(first, held));
        if (plan->wanted + growth + max_ll(0, held - first) > MAX_PLAN) {
            *fits = 0;
            return 1;
        }
        Py_ssize_t before = plan->wanted;
        for (long long j = first; j < held; j++) {
            long long block = entry(table, (Py_ssize_t)j);
            if (block == -1 && PyErr_Occurred()) {
                return 0;
            }
            if (block == 0) {
                if (!grow(&lane->wanted, &lane->wanted_cap, plan->wanted + 1)) {
                    return 0;
                }
                lane->wanted[plan->wanted++] = j;
            }
        }
        if (growth) {
            if (!grow(&lane->wanted, &lane->wanted_cap, plan->wanted + (Py_ssize_t)growth)) {
                return 0;
            }
            for (long long j = last - growth; j < last; j++) {
                lane->wanted[plan->wanted++] = j;
            }
        }
        plan->per_group[g] = plan->wanted - before;
    }
    return 1;
}

/* How many distinct released blocks hold one reference (releasing them frees them). */
static Py_ssize_t
freed_by(Lane *lane, const Plan *plan, const int *counts)
{
    if (!plan->released) {
        return 0;
    }
    long long *blocks = PyMem_Malloc((size_t)plan->released * sizeof(long long));
    if (blocks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < plan->released; k++) {
        blocks[k] = lane->released[3 * k + 2];
    }
    qsort(blocks, (size_t)plan->released, sizeof(long long), compare_ll);
    Py_ssize_t freed = 0;
    for (Py_ssize_t k = 0; k < plan->released; k++) {
        if ((k == 0 || blocks[k] != blocks[k - 1]) && counts[blocks[k]] == 1) {
            freed++;
        }
    }
    PyMem_Free(blocks);
    return freed;
}

/* ALLOC-SPEC-1's quiet bounds for attention groups (tables.TablePlanner.plan_quiet). */
static int
plan_quiet(Lane *lane, PyObject *request, PyObject *tables, PyObject *held_from,
           long long computed)
{
    long long slots = LLONG_MAX, end = lane->limit >= 0 ? lane->limit : LLONG_MAX, floor = 0;
    for (Py_ssize_t g = 0; g < lane->groups; g++) {
        PyObject *table = PyList_GET_ITEM(tables, g);
        long long held = PyList_GET_SIZE(table), size = lane->size[g];
        long long p = floordiv(computed, size), top = held;
        for (; p < held; p++) {
            long long block = entry(table, (Py_ssize_t)p);
            if (block == -1 && PyErr_Occurred()) {
                return 0;
            }
            if (block == 0) {
                break;
            }
        }
        for (; top > 0; top--) {
            long long block = entry(table, (Py_ssize_t)(top - 1));
            if (block == -1 && PyErr_Occurred()) {
                return 0;
            }
            if (block != 0) {
                break;
            }
        }
        slots = p * size < slots ? p * size : slots;
        floor = (top - 1) * size + 1 > floor ? (top - 1) * size + 1 : floor;
        long long low = PyLong_AsLongLong(PyList_GET_ITEM(held_from, g));
        if (low == -1 && PyErr_Occurred()) {
            return 0;
        }
        if (lane->kind[g] != FULL && low < held) {
            long long release = first_release(lane, g, low);
            end = release < end ? release : end;
        }
    }
    long long quiet = end < slots ? end : slots;
    PyObject *values[4] = {
        quiet == LLONG_MAX ? Py_NewRef(lane->token_limit) : PyLong_FromLongLong(quiet),
        Py_NewRef(lane->token_limit),
        slots == LLONG_MAX ? Py_NewRef(lane->token_limit) : PyLong_FromLongLong(slots),
        PyLong_FromLongLong(floor),
    };
    PyObject *names[4] = {s_quiet_end, s_quiet_state, s_quiet_slots, s_quiet_slots_floor};
    int ok = 1;
    for (int k = 0; k < 4; k++) {
        ok = ok && values[k] != NULL && PyObject_SetAttr(request, names[k], values[k]) == 0;
    }
    for (int k = 0; k < 4; k++) {
        Py_XDECREF(values[k]);
    }
    return ok;
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
           int *links, long long *num_free, PyObject **taken_out)
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
            PyObject *number = PyLong_FromLong(block);
            if (number == NULL) {
                Py_DECREF(zero);
                return NULL;
            }
            PyList_SET_ITEM(taken, k, number);
            block = links[block];
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

/* advance(request, budget, appended, lookahead) -> the new blocks per group, or None. */
static PyObject *
Lane_advance(Lane *lane, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "advance(request, budget, appended, lookahead)");
        return NULL;
    }
    PyObject *request = args[0], *budget = args[1], *appended = args[2], *ahead = args[3];
    Py_ssize_t count;
    if (!decode_tokens_valid(appended, budget, &count) || !PyLong_CheckExact(ahead)) {
        Py_RETURN_NONE;
    }
    int overflow = 0;
    long long lookahead = PyLong_AsLongLongAndOverflow(ahead, &overflow);
    if (overflow || lookahead < 0 || lookahead > MAX_PLAN) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    long long computed, scheduled;
    if (!get_ll(request, s_computed, &computed) || !get_ll(request, s_scheduled, &scheduled)) {
        return NULL;
    }
    PyObject *tokens = PyObject_GetAttr(request, s_tokens);
    if (tokens == NULL) {
        return NULL;
    }
    Py_ssize_t known = PyObject_Length(tokens);
    long long end = computed + count;
    if (known < 0 || scheduled != 0 || computed != known || computed > MAX_PLAN ||
        (lane->limit >= 0 && end > lane->limit)) {
        Py_DECREF(tokens);
        if (known < 0) {
            return NULL;
        }
        Py_RETURN_NONE; /* errors, a chunk in flight, max_model_len: the general path's */
    }
    PyObject *tables = PyObject_GetAttr(request, s_tables);
    PyObject *held_from = tables == NULL ? NULL : PyObject_GetAttr(request, s_held_from);
    PyObject *result = NULL, *taken = NULL;
    Py_buffer counts_view, links_view;
    int counts_open = 0, links_open = 0;
    Py_ssize_t *per_group = PyMem_Calloc((size_t)lane->groups + 1, sizeof(Py_ssize_t));
    if (held_from == NULL || per_group == NULL) {
        if (per_group == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    if (!PyList_CheckExact(tables) || !PyList_CheckExact(held_from) ||
        PyList_GET_SIZE(tables) != lane->groups || PyList_GET_SIZE(held_from) != lane->groups) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Plan plan = {.per_group = per_group};
    int fits;
    if (!plan_step(lane, tables, held_from, computed, end + lookahead, &plan, &fits)) {
        goto done;
    }
    long long num_free;
    if (!fits || !get_ll(lane->pool, s_num_free, &num_free)) {
        result = fits ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    if (!open_ints(lane->counts, &counts_view)) {
        goto done;
    }
    counts_open = 1;
    if (!open_ints(lane->links, &links_view)) {
        goto done;
    }
    links_open = 1;
    Py_ssize_t freed = freed_by(lane, &plan, counts_view.buf);
    if (freed < 0) {
        goto done;
    }
    if (plan.wanted > num_free + freed) {
        result = Py_NewRef(Py_None); /* Waiting: the general path says how much is missing */
        goto done;
    }
    PyObject *added = apply_plan(lane, tables, held_from, &plan, counts_view.buf,
                                 links_view.buf, &num_free, &taken);
    if (added == NULL) {
        goto done;
    }
    if (plan.wanted) {
        /* the blocks taken lose their keys (ALLOC-EVICT-1), then are held once each */
        PyObject *forgotten = PyObject_CallMethodObjArgs(
            lane->keys, s_forget_run, taken, lane->evictions, lane->dead_evictions, NULL);
        long long registered;
        if (forgotten == NULL || !get_ll(lane->pool, s_num_registered, &registered) ||
            !set_ll(lane->pool, s_num_registered, registered - PyLong_AsLongLong(forgotten))) {
            Py_XDECREF(forgotten);
            Py_DECREF(added);
            goto done;
        }
        Py_DECREF(forgotten);
        int *counts = counts_view.buf;
        for (Py_ssize_t k = 0; k < plan.wanted; k++) {
            counts[PyLong_AsLong(PyList_GET_ITEM(taken, k))] = 1;
        }
    } else {
        Py_SETREF(added, Py_NewRef(lane->no_blocks));
    }
    PyObject *extended = PyObject_CallMethodOneArg(tokens, s_extend, appended);
    if (extended == NULL || !set_ll(lane->pool, s_num_free, num_free - plan.wanted) ||
        !set_ll(request, s_scheduled, count) || !set_ll(request, s_lookahead, lookahead) ||
        PyObject_SetAttr(request, s_decoding, Py_True) < 0 ||
        !plan_quiet(lane, request, tables, held_from, computed + count)) {
        Py_XDECREF(extended);
        Py_DECREF(added);
        goto done;
    }
    Py_DECREF(extended);
    result = added;
done:
    if (counts_open) {
        PyBuffer_Release(&counts_view);
    }
    if (links_open) {
        PyBuffer_Release(&links_view);
    }
    PyMem_Free(per_group);
    Py_XDECREF(taken);
    Py_XDECREF(held_from);
    Py_XDECREF(tables);
    Py_DECREF(tokens);
    return result;
}

static const char *KIND_NAMES = "kinds are 0 (full), 1 (sliding window), 2 (chunked local)";

static int
Lane_init(Lane *lane, PyObject *args, PyObject *kwargs)
{
    PyObject *kinds, *sizes, *spans, *limit;
    static char *names[] = {"kinds", "sizes", "spans", "limit", "pool", "counts", "links",
                            "keys", "evictions", "dead_evictions", "no_blocks", "token_limit",
                            NULL};
    PyObject *pool, *counts, *links, *keys, *evictions, *dead, *no_blocks, *token_limit;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOOO:DecodeLane", names, &kinds,
                                     &sizes, &spans, &limit, &pool, &counts, &links, &keys,
                                     &evictions, &dead, &no_blocks, &token_limit)) {
        return -1;
    }
    if (!PyTuple_CheckExact(kinds) || !PyTuple_CheckExact(sizes) || !PyTuple_CheckExact(spans) ||
        PyTuple_GET_SIZE(kinds) == 0 || PyTuple_GET_SIZE(sizes) != PyTuple_GET_SIZE(kinds) ||
        PyTuple_GET_SIZE(spans) != PyTuple_GET_SIZE(kinds)) {
        PyErr_SetString(PyExc_TypeError, "kinds, sizes and spans are tuples, one item per group");
        return -1;
    }
    Py_ssize_t groups = PyTuple_GET_SIZE(kinds);
    lane->kind = PyMem_Calloc((size_t)groups, sizeof(int));
    lane->size = PyMem_Calloc((size_t)groups, sizeof(long long));
    lane->span = PyMem_Calloc((size_t)groups, sizeof(long long));
    if (lane->kind == NULL || lane->size == NULL || lane->span == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t g = 0; g < groups; g++) {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, g));
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, g));
        long long span = PyLong_AsLongLong(PyTuple_GET_ITEM(spans, g));
        if (PyErr_Occurred()) {
            return -1;
        }
        if (kind < FULL || kind > CHUNKED || size < 1 || size > INT_MAX || span < 0 ||
            span > INT_MAX || (kind != FULL && span < 1)) {
            PyErr_Format(PyExc_ValueError,
                         "group %zd: %s, a block size in 1..2**31 - 1 and a window or chunk "
                         "in that range (0 for full attention)", g, KIND_NAMES);
            return -1;
        }
        lane->kind[g] = (int)kind, lane->size[g] = size, lane->span[g] = span;
    }
    lane->groups = groups;
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
    Py_TYPE(lane)->tp_free((PyObject *)lane);
}

static PyMethodDef Lane_methods[] = {
    {"advance", (PyCFunction)(void (*)(void))Lane_advance, METH_FASTCALL,
     "advance(request, budget, appended, lookahead) -> the blocks the decode step allocated "
     "per group, with the request's tables, bounds and the pool moved as the general path "
     "moves them; None (nothing changed) when the general path must answer"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvcert.reference._decodelane.DecodeLane",
    .tp_basicsize = sizeof(Lane),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A manager's decode steps that change tables, for attention layouts under lru.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_methods = Lane_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvcert.reference._decodelane",
    .m_doc = "Decode steps that change tables, compiled (see kvcert.reference.decode_lane).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__decodelane(void)
{
    struct {
        PyObject **name;
        const char *text;
    } strings[] = {
        {&s_computed, "computed"}, {&s_scheduled, "scheduled"}, {&s_lookahead, "lookahead"},
        {&s_decoding, "decoding"}, {&s_tokens, "tokens"}, {&s_tables, "tables"},
        {&s_held_from, "held_from"}, {&s_quiet_end, "quiet_end"},
        {&s_quiet_state, "quiet_state"}, {&s_quiet_slots, "quiet_slots"},
        {&s_quiet_slots_floor, "quiet_slots_floor"}, {&s_num_free, "num_free"},
        {&s_num_registered, "num_registered"}, {&s_forget_run, "forget_run"},
        {&s_extend, "extend"},
    };
    for (size_t k = 0; k < sizeof(strings) / sizeof(strings[0]); k++) {
        *strings[k].name = PyUnicode_InternFromString(strings[k].text);
        if (*strings[k].name == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&LaneType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "DecodeLane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
