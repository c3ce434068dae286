/* kvcert.reference._decodelane, a decode step: the quiet step that only appends tokens,
 * and the step that changes tables (its plan and bounds here; the release and allocation
 * in _decodelane_alloc.c). */
#include "_decodelane.h"

/* ALLOC-HOLD-1: the first position kept while computing [computed, end) (groups.first_read;
 * `end` is read by a state group only, one that has computed nothing yet). */
long long
first_read(const Lane *lane, Py_ssize_t g, long long computed, long long end)
{
    long long size = lane->size[g], span = lane->span[g];
    switch (lane->kind[g]) {
    case WINDOW:
        return floordiv(computed - (span - 1) > 0 ? computed - (span - 1) : 0, size);
    case CHUNKED:
        return floordiv(floordiv(computed, span) * span, size);
    case STATE: /* the state after `computed` tokens, carried into the running state */
        if (lane->every_state[g]) {
            return 0;
        }
        return computed ? floordiv(computed - 1, size) : cdiv(end, size) - 1;
    default:
        return 0;
    }
}

/* The least `computed` whose one-token step no longer reads position `low`; -1: never
 * (groups.first_release). */
static long long
first_release(const Lane *lane, Py_ssize_t g, long long low)
{
    long long size = lane->size[g], span = lane->span[g];
    switch (lane->kind[g]) {
    case WINDOW:
        return (low + 1) * size + span - 1;
    case CHUNKED:
        return cdiv((low + 1) * size, span) * span;
    case STATE:
        return lane->every_state[g] ? -1 : (low + 1) * size + 1;
    default:
        return -1;
    }
}

/* ALLOC-SPEC-1: how many positions a state group's chunk ending at `end` spans (groups.
 * table_end): for a decode chunk of a group with drafts' positions, every position a
 * verifying step ending up to `spare` tokens later (never past max_model_len) puts its
 * running state in, and the `spare` after it. */
long long
state_table_end(const Lane *lane, Py_ssize_t g, long long end, int decoding)
{
    long long spare = lane->spare[g], size = lane->size[g];
    if (!(spare && decoding)) {
        return cdiv(end, size);
    }
    long long reach = end + spare;
    if (lane->limit >= 0) {
        reach = max_ll(end, min_ll(end + spare, lane->limit));
    }
    return cdiv(reach, size) + spare;
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

/* Whether `appended` is a non-empty list or tuple of token ids (ints in 0..2**63 - 1) no
 * longer than `budget`; its length in *count. */
int
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

/* The table positions the chunk [computed, in_flight) releases and wants, as the general
 * path plans them (tables.TablePlanner.changes): attention groups hold slots up to `end`
 * (the chunk's end and its lookahead), state groups their running state at `state_end` (the
 * chunk's end, or where a chunk reserved behind it ends), a decode chunk's with its drafts'
 * positions when `decoding`. An inner checkpoint still open (CKPT-INNER-1, of a chunk
 * reserved behind) changes none of it: its position, the block ending at a boundary past
 * `computed`, lies at or past the first one read and below that chunk's running state, and
 * its block is held since the reserve (`changes`' `saving` keeps what this keeps anyway).
 * 0 on error, and *fits = 0 when the plan is too large to list. */
int
plan_step(Lane *lane, PyObject *tables, PyObject *held_from, long long computed,
          long long in_flight, long long end, long long state_end, int decoding, Plan *plan,
          int *fits)
{
    plan->released = plan->wanted = 0;
    *fits = 1;
    for (Py_ssize_t g = 0; g < lane->groups; g++) {
        PyObject *table = PyList_GET_ITEM(tables, g);
        if (!PyList_CheckExact(table)) {
            *fits = 0;
            return 1;
        }
        int state = lane->kind[g] == STATE;
        long long size = PyList_GET_SIZE(table), block_size = lane->size[g];
        long long last = state ? state_table_end(lane, g, state_end, decoding)
                               : cdiv(end, block_size);
        long long low = PyLong_AsLongLong(PyList_GET_ITEM(held_from, g));
        if (low == -1 && PyErr_Occurred()) {
            return 0;
        }
        if (size > last || (low < last && lane->kind[g] != FULL)) {
            /* a state group reads where the chunk starts, whatever follows it */
            long long first = first_read(lane, g, computed, state ? in_flight : end);
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
        /* ALLOC-WRITE-1 (groups.first_written): a running state only where the chunk ends */
        long long first = state && !lane->every_state[g] ? cdiv(state_end, block_size) - 1
                                                         : floordiv(computed, block_size);
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

/* ALLOC-SPEC-1's quiet bounds (tables.TablePlanner.plan_quiet). */
int
plan_quiet(Lane *lane, PyObject *request, PyObject *tables, PyObject *held_from,
           long long computed)
{
    long long slots = LLONG_MAX, end = lane->limit >= 0 ? lane->limit : LLONG_MAX, floor = 0;
    long long state_end = LLONG_MAX;
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
        if (lane->kind[g] == STATE) { /* its running state's positions, drafts' after them */
            long long spare = lane->spare[g];
            state_end = min_ll(state_end, spare ? (p - spare) * size - spare : p * size);
            top = 0;
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
        if (lane->kind[g] != STATE) { /* an attention group's slots */
            slots = p * size < slots ? p * size : slots;
            floor = (top - 1) * size + 1 > floor ? (top - 1) * size + 1 : floor;
        }
        long long low = PyLong_AsLongLong(PyList_GET_ITEM(held_from, g));
        if (low == -1 && PyErr_Occurred()) {
            return 0;
        }
        if (lane->kind[g] != FULL && low < held) {
            long long release = first_release(lane, g, low);
            end = release >= 0 && release < end ? release : end;
        }
    }
    long long quiet = min_ll(end, min_ll(slots, state_end));
    PyObject *values[4] = {
        quiet == LLONG_MAX ? Py_NewRef(lane->token_limit) : PyLong_FromLongLong(quiet),
        state_end == LLONG_MAX ? Py_NewRef(lane->token_limit) : PyLong_FromLongLong(state_end),
        slots == LLONG_MAX ? Py_NewRef(lane->token_limit) : PyLong_FromLongLong(slots),
        PyLong_FromLongLong(floor),
    };
    PyObject *names[4] = {s_quiet_end, s_quiet_state, s_quiet_slots, s_quiet_slots_floor};
    int ok = 1;
    for (int k = 0; k < 4; k++) {
        ok = ok && values[k] != NULL && lane_set(request, names[k], values[k]) == 0;
    }
    for (int k = 0; k < 4; k++) {
        Py_XDECREF(values[k]);
    }
    return ok;
}

/* What a replanned chunk is: a decode step appending sampled tokens, a prompt's next chunk
 * (prefill), or `reserve`'s slots for a chunk scheduled behind the one in flight. */
enum Chunk { DECODE, PREFILL, RESERVE };

/* The tables' changes for the chunk [computed, end) holding slots up to end + lookahead,
 * applied: the table-changing decode step of `request` (`appended`: its `count` valid
 * tokens after its `computed` ones, nothing in flight, within max_model_len), a prefill
 * chunk of `count` known tokens (nothing in flight), or `reserve`'s allocation
 * (`_reserve_slow`: `end` the end of the chunk in flight, the lookahead and `pipelined` its
 * new ones). The new blocks per group, or None (nothing changed: the pool cannot fit it, or
 * the plan is too large to list). */
static PyObject *
replan(Lane *lane, PyObject *request, enum Chunk chunk, PyObject *tokens, PyObject *appended,
       Py_ssize_t count, long long lookahead, long long computed, long long end,
       long long pipelined)
{
    PyObject *tables = lane_get(request, s_tables);
    PyObject *held_from = tables == NULL ? NULL : lane_get(request, s_held_from);
    PyObject *result = NULL;
    Py_ssize_t *per_group = PyMem_Calloc((size_t)lane->groups + 1, sizeof(Py_ssize_t));
    if (held_from == NULL || per_group == NULL) {
        if (per_group == NULL) {
            PyErr_NoMemory();
        }
        goto done;
    }
    if (!lists_per_group(lane, tables, held_from)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* a state group's running state: where the chunk ends, or a chunk reserved behind it
     * (`reserve` passes it; a running request may keep one from an earlier reserve) */
    long long state_end = end;
    int decoding = 1; /* a decode step; a prefill chunk and `reserve` keep the request's */
    if (chunk != RESERVE && lane->has_state) {
        long long behind;
        if (!lane_get_ll(request, s_pipelined, &behind)) {
            goto done;
        }
        state_end = max_ll(end, behind);
    } else if (chunk == RESERVE) {
        state_end = max_ll(end, pipelined);
    }
    if (chunk != DECODE) {
        decoding = 0; /* read by state groups only */
        if (lane->has_state) {
            PyObject *flag = lane_get(request, s_decoding);
            decoding = flag == NULL ? -1 : PyObject_IsTrue(flag);
            Py_XDECREF(flag);
            if (decoding < 0) {
                goto done;
            }
        }
    }
    if (state_end > MAX_PLAN) { /* a running state that far: the general path's */
        result = Py_NewRef(Py_None);
        goto done;
    }
    Plan plan = {.per_group = per_group};
    int fits;
    if (!plan_step(lane, tables, held_from, computed, end, end + lookahead, state_end,
                   decoding, &plan, &fits)) {
        goto done;
    }
    if (!fits) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *added = carry_out(lane, tables, held_from, &plan);
    if (added == NULL || added == Py_None) {
        result = added;
        goto done;
    }
    PyObject *extended = chunk == DECODE ? lane_append_tokens(tokens, appended)
                                         : Py_NewRef(Py_None);
    int moved = extended != NULL && lane_set_ll(request, s_lookahead, lookahead);
    if (chunk == DECODE) {
        moved = moved && lane_set_ll(request, s_scheduled, count) &&
                lane_set(request, s_decoding, Py_True) == 0;
    } else if (chunk == PREFILL) {
        moved = moved && lane_set_ll(request, s_scheduled, count);
    } else {
        moved = moved && lane_set_ll(request, s_pipelined, pipelined);
    }
    Py_XDECREF(extended);
    if (!moved || !plan_quiet(lane, request, tables, held_from, end)) {
        Py_DECREF(added);
        goto done;
    }
    result = added;
done:
    PyMem_Free(per_group);
    Py_XDECREF(held_from);
    Py_XDECREF(tables);
    return result;
}

/* A Scheduled(hit, scheduled, new_blocks, tables) (copies empty), or NULL. */
PyObject *
make_answer(Lane *lane, long long hit, Py_ssize_t scheduled, PyObject *new_blocks,
            PyObject *tables)
{
    PyObject *values[5] = {PyLong_FromLongLong(hit), PyLong_FromSsize_t(scheduled),
                           Py_NewRef(new_blocks), Py_NewRef(tables), PyTuple_New(0)};
    PyObject *made = lane->scheduled->tp_alloc(lane->scheduled, 0);
    for (int k = 0; k < 5; k++) {
        if (made != NULL && (values[k] == NULL ||
                             PyMember_SetOne((char *)made, lane->fields[k], values[k]) < 0)) {
            Py_CLEAR(made);
        }
    }
    for (int k = 0; k < 5; k++) {
        Py_XDECREF(values[k]);
    }
    return made;
}

/* Whether the decode step [computed, end) holding slots up to end + lookahead changes no
 * table: within the request's quiet bounds (TablePlanner.plan_quiet, ALLOC-SPEC-1). -1 on
 * error. */
static int
is_quiet(PyObject *request, long long end, long long lookahead)
{
    long long quiet_end, pipelined, quiet_state, floor, slots;
    if (!lane_get_bound(request, s_quiet_end, &quiet_end) ||
        !lane_get_bound(request, s_pipelined, &pipelined) ||
        !lane_get_bound(request, s_quiet_state, &quiet_state) ||
        !lane_get_bound(request, s_quiet_slots_floor, &floor) ||
        !lane_get_bound(request, s_quiet_slots, &slots)) {
        return -1;
    }
    if (end > quiet_end || pipelined > quiet_state) {
        return 0;
    }
    return lookahead ? floor <= end + lookahead && end + lookahead <= slots : floor <= end;
}

/* The shared answer of a quiet step of `count` tokens (KVCacheManager._quiet_step). */
static PyObject *
quiet_answer(Lane *lane, Py_ssize_t count)
{
    if (count == 1 && lane->decode_step != NULL) { /* the manager's _decode_step */
        return Py_NewRef(lane->decode_step);
    }
    PyObject *key = PyLong_FromSsize_t(count);
    if (key == NULL) {
        return NULL;
    }
    PyObject *answer = PyDict_GetItemWithError(lane->quiet_steps, key);
    if (answer != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        return answer == NULL ? NULL : Py_NewRef(answer);
    }
    answer = make_scheduled(lane, count, lane->no_blocks);
    if (answer != NULL && PyDict_SetItem(lane->quiet_steps, key, answer) < 0) {
        Py_CLEAR(answer);
    }
    Py_DECREF(key);
    return answer;
}

/* KVCacheManager.extend's general path for a prompt's next chunk of running `request`
 * (`known` tokens, `computed` of them computed, `scheduled` in flight): up to `budget` of the
 * tokens left, its slots `lookahead` past them, launched in `step`. None where that path
 * must answer: a chunk in flight, nothing left to compute, max_model_len passed (each
 * refused there), a pool that cannot fit it (Waiting), a plan too large to list. */
static PyObject *
prefill_chunk(Lane *lane, PyObject *request, PyObject *rid, PyObject *tokens, long long known,
              long long computed, long long scheduled, long long budget, long long lookahead,
              PyObject *step, PyObject *in_flight)
{
    if (scheduled != 0 || computed >= known || (lane->limit >= 0 && known > lane->limit)) {
        Py_RETURN_NONE;
    }
    long long count = min_ll(budget, known - computed), end = computed + count;
    if (end > MAX_PLAN) {
        Py_RETURN_NONE;
    }
    PyObject *added = replan(lane, request, PREFILL, tokens, NULL, (Py_ssize_t)count, lookahead,
                             computed, end, -1);
    if (added == NULL || added == Py_None) {
        return added;
    }
    PyObject *answer = lane_launch(lane, rid, request, step, in_flight) /* _launch */
                           ? make_scheduled(lane, (Py_ssize_t)count, added)
                           : NULL;
    Py_DECREF(added);
    return answer;
}

/* extend(requests, rid, budget, appended, lookahead, step, checkpoint, in_flight, current)
 * -> KVCacheManager.extend's answer for a decode step of running request `rid` (sampled
 * tokens after every known one, nothing in flight, no checkpoint): the quiet step that only
 * appends them, or the step that changes tables; or for its prompt's next chunk (nothing
 * appended); the chunk launched in `step` (None: `current`, the step being scheduled). None
 * when the general path must answer (nothing changed then). */
PyObject *
Lane_extend(Lane *lane, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || !PyDict_CheckExact(args[0]) || !PyDict_CheckExact(args[7]) ||
        !PyLong_CheckExact(args[8])) {
        PyErr_SetString(PyExc_TypeError, "extend(requests: dict, rid, budget, appended, "
                                         "lookahead, step, checkpoint, in_flight: dict, "
                                         "current: int)");
        return NULL;
    }
    PyObject *rid = args[1], *appended = args[3], *ahead = args[4];
    PyObject *request = PyUnicode_CheckExact(rid) ? PyDict_GetItemWithError(args[0], rid) : NULL;
    if (request == NULL) { /* not running (or not a str): the general path says so */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *step = args[5], *in_flight = args[7];
    int checkpoint = PyObject_IsTrue(args[6]);
    if (checkpoint != 0) { /* a checkpoint, or an argument that cannot say: general path */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!lane_launchable(step, args[8])) {
        Py_RETURN_NONE;
    }
    int overflow = 0;
    if (step == Py_None) {
        step = args[8];
    }
    /* a prompt's next chunk appends nothing: its budget, at least 1, bounds it */
    int prefill = (PyList_CheckExact(appended) || PyTuple_CheckExact(appended)) &&
                  PySequence_Fast_GET_SIZE(appended) == 0;
    long long budget = 0;
    Py_ssize_t count = 0;
    if ((prefill ? !count_of(args[2], &budget) || budget < 1
                 : !decode_tokens_valid(appended, args[2], &count)) ||
        !PyLong_CheckExact(ahead)) {
        Py_RETURN_NONE;
    }
    long long lookahead = PyLong_AsLongLongAndOverflow(ahead, &overflow);
    if (overflow || lookahead < 0 || lookahead > MAX_PLAN) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    long long computed, scheduled;
    if (!lane_get_ll(request, s_computed, &computed) || !lane_get_ll(request, s_scheduled, &scheduled)) {
        return NULL;
    }
    PyObject *tokens = lane_get(request, s_tokens);
    if (tokens == NULL) {
        return NULL;
    }
    Py_ssize_t known = PyObject_Length(tokens);
    PyObject *answer = NULL;
    if (known < 0) {
        goto done;
    }
    if (prefill) {
        answer = prefill_chunk(lane, request, rid, tokens, known, computed, scheduled, budget,
                               lookahead, step, in_flight);
        goto done;
    }
    if (scheduled != 0 || computed != known) {
        answer = Py_NewRef(Py_None); /* a chunk in flight, prompt tokens left: general path */
        goto done;
    }
    answer = lane_decode(lane, request, rid, tokens, computed, appended, count, lookahead, step,
                         in_flight);
done:
    Py_DECREF(tokens);
    return answer;
}

/* Whether `step` is a step a chunk may launch in: None (the one being scheduled, `current`,
 * an int) or an int from 0 to that one. */
int
lane_launchable(PyObject *step, PyObject *current)
{
    if (step == Py_None) {
        return 1;
    }
    int overflow = 0;
    long long number = PyLong_CheckExact(step) ? PyLong_AsLongLongAndOverflow(step, &overflow) : -1;
    if (number < 0 || overflow || number > PyLong_AsLongLong(current)) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Lane_extend's decode chunk, for a caller that has read the core's record `request` of
 * `rid` (nothing scheduled, every one of its `tokens` computed: `computed`) and checked the
 * arguments as Lane_extend does (`appended`, `count` valid token ids: decode_tokens_valid;
 * `lookahead` in 0..MAX_PLAN; `step` the one being scheduled or an earlier one). */
PyObject *
lane_decode(Lane *lane, PyObject *request, PyObject *rid, PyObject *tokens, long long computed,
            PyObject *appended, Py_ssize_t count, long long lookahead, PyObject *step,
            PyObject *in_flight)
{
    long long end = computed + count;
    if (computed > MAX_PLAN) {
        Py_RETURN_NONE;
    }
    int quiet = is_quiet(request, end, lookahead);
    if (quiet < 0) {
        return NULL;
    }
    if (quiet) { /* only the tokens are appended (the fast path of KVCacheManager.extend) */
        PyObject *extended = lane_append_tokens(tokens, appended);
        if (extended == NULL) {
            return NULL;
        }
        Py_DECREF(extended);
        if (lane_set_ll(request, s_scheduled, count) && lane_set_ll(request, s_lookahead, lookahead) &&
            lane_set(request, s_decoding, Py_True) == 0 &&
            lane_launch(lane, rid, request, step, in_flight)) {
            return quiet_answer(lane, count);
        }
        return NULL;
    }
    if (lane->limit >= 0 && end > lane->limit) {
        Py_RETURN_NONE; /* max_model_len: the general path says so */
    }
    PyObject *added =
        replan(lane, request, DECODE, tokens, appended, count, lookahead, computed, end, -1);
    if (added == NULL || added == Py_None) {
        return added;
    }
    PyObject *answer = NULL;
    if (lane_launch(lane, rid, request, step, in_flight)) { /* KVCacheManager._launch */
        answer = make_scheduled(lane, count, added);
    }
    Py_DECREF(added);
    return answer;
}


/* KVCacheManager.reserve's allocation (`_reserve_slow`) for `request`, whose chunk in flight
 * ends at `end`, with its new lookahead and `pipelined` (the caller has found that reserve
 * changes something, its `decoding` stays as it is and no checkpoint is added): its
 * Scheduled, or None (nothing changed) where the general path must answer, Waiting
 * included. */
PyObject *
lane_reserve(Lane *lane, PyObject *request, long long computed, long long end,
             long long lookahead, long long pipelined)
{
    if (end > MAX_PLAN || lookahead > MAX_PLAN || pipelined > MAX_PLAN) {
        Py_RETURN_NONE;
    }
    PyObject *added =
        replan(lane, request, RESERVE, NULL, NULL, 0, lookahead, computed, end, pipelined);
    if (added == NULL || added == Py_None) {
        return added;
    }
    PyObject *answer = make_scheduled(lane, 0, added);
    Py_DECREF(added);
    return answer;
}
