/* kvcert.reference._decodelane, registration: what a step completed becomes hittable. */
#include "_decodelane.h"

/* Digest every boundary of `chain` whose tokens all exist (hashing.Chain.extend without a
 * memo): the tokens it has not encoded yet join its stream, then one boundaries call of its
 * compiled SHA-256 state. A chain carrying positioned extras (records fed mid-stream) takes
 * its own Python method, as does every chain on a big-endian machine (the stream is
 * little-endian, the request's array native). 0 on error. */
static int
extend_chain(PyObject *chain, PyObject *tokens, const long long *ids, Py_ssize_t n)
{
    PyObject *records = lane_get(chain, s_records);
    if (records == NULL) {
        return 0;
    }
    int plain = !PY_BIG_ENDIAN && PyDict_CheckExact(records) && PyDict_GET_SIZE(records) == 0;
    Py_DECREF(records);
    if (!plain) {
        PyObject *done = PyObject_CallMethodOneArg(chain, s_extend, tokens);
        Py_XDECREF(done);
        return done != NULL;
    }
    long long size, lookahead, fed;
    if (!lane_get_ll(chain, s_size, &size) || !lane_get_ll(chain, s_lookahead, &lookahead) ||
        !lane_get_ll(chain, s_fed, &fed)) {
        return 0;
    }
    PyObject *digests = lane_get(chain, s_digests);
    if (digests == NULL) {
        return 0;
    }
    long long count = max_ll(0, floordiv(n - lookahead, size));
    Py_ssize_t k = PyList_Size(digests); /* -1 (an error) when it is not a list */
    int ok = k >= 0;
    PyObject *stream = NULL, *state = NULL;
    if (!ok || count <= k) {
        goto done;
    }
    ok = 0;
    stream = lane_get(chain, s_stream);
    if (stream == NULL) {
        goto done;
    }
    Py_ssize_t have = PyBytes_CheckExact(stream)       ? PyBytes_GET_SIZE(stream)
                      : PyByteArray_CheckExact(stream) ? PyByteArray_GET_SIZE(stream)
                                                       : -1;
    if (have < 0) {
        PyErr_SetString(PyExc_TypeError, "a chain's stream must be bytes or a bytearray");
        goto done;
    }
    Py_ssize_t known = have / 8;
    if (n > known) { /* encode the new ids (little-endian int64, as the array holds them) */
        const char *fresh = (const char *)(ids + known);
        Py_ssize_t length = 8 * (n - known);
        int replaced = PyBytes_CheckExact(stream);
        if (have == 0 && replaced) {
            Py_SETREF(stream, PyBytes_FromStringAndSize(fresh, length));
        } else {
            if (replaced) { /* shared until it grows: a copy of its own, grown at once */
                /* made an eighth larger, then cut to its length: the allocation stays, so
                 * the next blocks' tokens join it without copying the stream again */
                Py_ssize_t room = (have + length) + (have + length) / 8;
                PyObject *own = PyByteArray_FromStringAndSize(NULL, room);
                if (own != NULL) {
                    memcpy(PyByteArray_AS_STRING(own), PyBytes_AS_STRING(stream), (size_t)have);
                    if (PyByteArray_Resize(own, have + length) < 0) {
                        Py_CLEAR(own);
                    }
                }
                Py_SETREF(stream, own);
            } else if (PyByteArray_Resize(stream, have + length) < 0) {
                goto done;
            }
            if (stream == NULL) {
                goto done;
            }
            memcpy(PyByteArray_AS_STRING(stream) + have, fresh, (size_t)length);
        }
        if (stream == NULL || (replaced && lane_set(chain, s_stream, stream) < 0)) {
            goto done;
        }
    }
    state = lane_get(chain, s_state);
    if (state == NULL) {
        goto done;
    }
    PyObject *call[7] = {state, digests, stream, NULL, NULL, NULL, NULL};
    long long numbers[4] = {8 * fed, 8 * ((k + 1) * size + lookahead), 8 * size, count - k};
    for (int j = 0; j < 4; j++) {
        call[3 + j] = PyLong_FromLongLong(numbers[j]);
    }
    PyObject *done = NULL;
    if (call[3] && call[4] && call[5] && call[6]) {
        done = PyObject_VectorcallMethod(s_boundaries, call, 7 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                         NULL);
    }
    for (int j = 3; j < 7; j++) {
        Py_XDECREF(call[j]);
    }
    ok = done != NULL && lane_set_ll(chain, s_fed, count * size + lookahead);
    Py_XDECREF(done);
done:
    Py_XDECREF(state);
    Py_XDECREF(stream);
    Py_DECREF(digests);
    return ok;
}

/* The keys of blocks start .. stop - 1 of a group of `block_size` (Chain.keys_between). */
static PyObject *
keys_between(PyObject *chain, long long block_size, long long start, long long stop)
{
    long long size;
    if (!lane_get_ll(chain, s_size, &size)) {
        return NULL;
    }
    PyObject *digests = lane_get(chain, s_digests);
    if (digests == NULL) {
        return NULL;
    }
    if (!PyList_CheckExact(digests)) {
        PyErr_SetString(PyExc_TypeError, "a chain's digests must be a list");
        Py_DECREF(digests);
        return NULL;
    }
    long long step = block_size / size, have = PyList_GET_SIZE(digests);
    PyObject *keys = PyList_New(0);
    for (long long j = start; keys != NULL && j < stop; j++) {
        long long link = (j + 1) * step - 1;
        if (link >= have) {
            break;
        }
        if (PyList_Append(keys, PyList_GET_ITEM(digests, link)) < 0) {
            Py_CLEAR(keys);
        }
    }
    Py_DECREF(digests);
    return keys;
}

/* register(request, before) -> how many blocks the step that moved `request`'s computed
 * count from `before` completed and registered (commit.Registrar.register for attention
 * groups keeping every block, over a pool that tracks no liveness), or None (nothing done)
 * for a request the general path must register: one with inner checkpoints, or a group
 * without a chain. */
PyObject *
Lane_register(Lane *lane, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "register(request, before)");
        return NULL;
    }
    if (lane->has_state) { /* a state group's registration: the general path's */
        Py_RETURN_NONE;
    }
    PyObject *request = args[0];
    PyObject *chains = lane_get(request, s_chains);
    PyObject *checkpoints = chains == NULL ? NULL : lane_get(request, s_checkpoints);
    PyObject *tokens = NULL, *unique = NULL, *registered = NULL, *tables = NULL, *result = NULL;
    Py_buffer ids;
    int ids_open = 0;
    if (checkpoints == NULL) {
        goto done;
    }
    if (!PyList_CheckExact(chains) || PyList_GET_SIZE(chains) != lane->groups ||
        PyObject_IsTrue(checkpoints) != 0) {
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t g = 0; g < lane->groups; g++) {
        if (PyList_GET_ITEM(chains, g) == Py_None) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    long long computed;
    tokens = lane_get(request, s_tokens);
    unique = tokens == NULL ? NULL : lane_get(request, s_unique_chains);
    registered = unique == NULL ? NULL : lane_get(request, s_registered);
    tables = registered == NULL ? NULL : lane_get(request, s_tables);
    if (tables == NULL || !lane_get_ll(request, s_computed, &computed)) {
        goto done;
    }
    if (PyObject_GetBuffer(tokens, &ids, PyBUF_FORMAT) < 0) {
        goto done;
    }
    ids_open = 1;
    if (ids.itemsize != 8 || ids.format == NULL || strcmp(ids.format, "q") != 0 ||
        !PyList_CheckExact(unique) || !PyList_CheckExact(registered) ||
        !PyList_CheckExact(tables) || PyList_GET_SIZE(registered) != lane->groups ||
        PyList_GET_SIZE(tables) != lane->groups) {
        PyErr_SetString(PyExc_TypeError, "a request's tokens are an array('q') and its "
                                         "chains, tables and registered marks lists");
        goto done;
    }
    Py_ssize_t n = ids.len / 8;
    for (Py_ssize_t c = 0; c < PyList_GET_SIZE(unique); c++) {
        if (!extend_chain(PyList_GET_ITEM(unique, c), tokens, ids.buf, n)) {
            goto done;
        }
    }
    long long total = 0, bound = 0, commit_at = LLONG_MAX;
    for (Py_ssize_t g = 0; g < lane->groups; g++) { /* ALLOC-COMMIT-1 */
        long long size = lane->size[g];
        long long start = PyLong_AsLongLong(PyList_GET_ITEM(registered, g));
        long long stop = floordiv(computed - lane->commit_delay[g], size);
        if (lane->key_lookahead[g]) {
            stop = min_ll(stop, floordiv(n - lane->key_lookahead[g], size));
        }
        stop = min_ll(stop, floordiv(floordiv(computed, lane->unit) * lane->unit, size));
        if (start == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (stop > start) {
            PyObject *keys = keys_between(PyList_GET_ITEM(chains, g), size, start, stop);
            if (keys == NULL) {
                goto done;
            }
            if (PyList_GET_SIZE(keys) < stop - start) {
                PyErr_Format(PyExc_RuntimeError, "no digest for a committed block of group %zd",
                             g);
                Py_DECREF(keys);
                goto done;
            }
            PyObject *table = PyList_GET_ITEM(tables, g);
            PyObject *blocks = PyList_GetSlice(table, (Py_ssize_t)start, (Py_ssize_t)stop);
            PyObject *group = PyLong_FromSsize_t(g);
            PyObject *bound_now = NULL;
            if (blocks != NULL && group != NULL) {
                PyObject *call[4] = {lane->keys, group, blocks, keys};
                bound_now = PyObject_VectorcallMethod(
                    s_bind_run, call, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            }
            Py_DECREF(keys);
            Py_XDECREF(group);
            if (bound_now == NULL) {
                Py_XDECREF(blocks);
                goto done;
            }
            bound += PyLong_AsLongLong(bound_now);
            Py_DECREF(bound_now);
            for (Py_ssize_t k = 0; k < PyList_GET_SIZE(blocks); k++) {
                total += entry(blocks, k) != 0;
            }
            Py_DECREF(blocks);
            PyObject *mark = PyLong_FromLongLong(stop);
            if (mark == NULL) {
                goto done;
            }
            PyList_SetItem(registered, g, mark);
            start = stop;
        }
        commit_at = min_ll(commit_at, (start + 1) * size);
    }
    long long registered_now;
    if (bound) {
        if (!lane_get_ll(lane->pool, s_num_registered, &registered_now) ||
            !lane_set_ll(lane->pool, s_num_registered, registered_now + bound)) {
            goto done;
        }
    }
    if (!lane_set_ll(request, s_commit_at, commit_at)) {
        goto done;
    }
    result = PyLong_FromLongLong(total);
done:
    if (ids_open) {
        PyBuffer_Release(&ids);
    }
    Py_XDECREF(tables);
    Py_XDECREF(registered);
    Py_XDECREF(unique);
    Py_XDECREF(tokens);
    Py_XDECREF(checkpoints);
    Py_XDECREF(chains);
    return result;
}


/* end_chunks(ending, requests) -> [(rid, request, before)]: each ending chunk's tokens now
 * count as computed (`before`: the count they started from), and the requests whose
 * computed count reached their commit_at are listed, in `ending`'s order (the loop of
 * KVCacheManager.end_step; a rid no longer running is skipped). */
PyObject *
Lane_end_chunks(Lane *lane, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "end_chunks(ending: list, requests: dict)");
        return NULL;
    }
    PyObject *ending = args[0], *requests = args[1];
    PyObject *committing = PyList_New(0);
    for (Py_ssize_t k = 0; committing != NULL && k < PyList_GET_SIZE(ending); k++) {
        PyObject *rid = PyList_GET_ITEM(ending, k);
        PyObject *request = PyDict_GetItemWithError(requests, rid);
        if (request == NULL) {
            if (PyErr_Occurred()) {
                Py_CLEAR(committing);
            }
            continue;
        }
        long long computed, scheduled, commit_at;
        if (!lane_get_ll(request, s_computed, &computed) ||
            !lane_get_ll(request, s_scheduled, &scheduled) ||
            !lane_get_bound(request, s_commit_at, &commit_at) ||
            !lane_set_ll(request, s_computed, computed + scheduled) ||
            !lane_set_ll(request, s_scheduled, 0) ||
            lane_set(request, s_published, Py_None) < 0) {
            Py_CLEAR(committing);
            break;
        }
        if (computed + scheduled >= commit_at) {
            PyObject *entry = Py_BuildValue("(OOL)", rid, request, computed);
            if (entry == NULL || PyList_Append(committing, entry) < 0) {
                Py_CLEAR(committing);
            }
            Py_XDECREF(entry);
        }
    }
    return committing;
}


/* commit.Registrar.publish through Lane_register: the blocks the chunk in flight completes
 * registered now (its tokens counted as computed meanwhile), and `published` set to the
 * marks before them when any moved (commit_at then moves too, else it stays). The count, or
 * None (nothing done) where the general path must publish, or NULL. */
static PyObject *
publish(Lane *lane, PyObject *request, long long computed, long long scheduled)
{
    PyObject *registered = lane_get(request, s_registered);
    PyObject *commit_at = registered == NULL ? NULL : lane_get(request, s_commit_at);
    PyObject *marks = NULL, *before = NULL, *count = NULL;
    if (commit_at == NULL) {
        goto done;
    }
    if (!PyList_CheckExact(registered)) {
        count = Py_NewRef(Py_None);
        goto done;
    }
    marks = PyList_GetSlice(registered, 0, PyList_GET_SIZE(registered));
    before = PyLong_FromLongLong(computed);
    if (marks == NULL || before == NULL || !lane_set_ll(request, s_computed, computed + scheduled)) {
        goto done;
    }
    PyObject *call[2] = {request, before};
    count = Lane_register(lane, call, 2);
    if (lane_set(request, s_computed, before) < 0) {
        Py_CLEAR(count);
    }
    if (count == NULL || count == Py_None) {
        goto done;
    }
    int same = PyObject_RichCompareBool(marks, registered, Py_EQ);
    if (same < 0 || lane_set(request, same ? s_commit_at : s_published, same ? commit_at : marks) < 0) {
        Py_CLEAR(count);
    }
done:
    Py_XDECREF(registered);
    Py_XDECREF(commit_at);
    Py_XDECREF(marks);
    Py_XDECREF(before);
    return count;
}

/* publish(request) -> commit.Registrar.publish for `request`'s chunk just scheduled (what
 * it completes registered now, ALLOC-VIS-2), or None (nothing done) where the general path
 * must publish. */
PyObject *
Lane_publish(Lane *lane, PyObject *request)
{
    long long computed, scheduled;
    if (!lane_get_ll(request, s_computed, &computed) ||
        !lane_get_ll(request, s_scheduled, &scheduled)) {
        return NULL;
    }
    return publish(lane, request, computed, scheduled);
}

/* KVCacheManager._launch: the chunk runs in `step`; under same-pass visibility the blocks
 * it completes are published now (ALLOC-VIS-2). 0 on error. */
int
lane_launch(Lane *lane, PyObject *rid, PyObject *request, PyObject *step, PyObject *in_flight)
{
    if (PyDict_SetItem(in_flight, rid, step) < 0) {
        return 0;
    }
    if (!lane->same_pass) {
        return 1;
    }
    long long computed, scheduled, commit_at;
    if (!lane_get_ll(request, s_computed, &computed) ||
        !lane_get_ll(request, s_scheduled, &scheduled) ||
        !lane_get_bound(request, s_commit_at, &commit_at)) {
        return 0;
    }
    if (computed + scheduled < commit_at) {
        return 1;
    }
    PyObject *count = lane->registers ? publish(lane, request, computed, scheduled)
                                      : Py_NewRef(Py_None);
    if (count == Py_None) {
        Py_DECREF(count);
        count = PyObject_CallMethodObjArgs(lane->commits, s_publish, lane->pool, rid, request, NULL);
    }
    long long published = count == NULL ? -1 : PyLong_AsLongLong(count);
    Py_XDECREF(count);
    if (published == -1 && PyErr_Occurred()) {
        return 0;
    }
    lane->published += published;
    return 1;
}


/* The chunks in flight that end with step `step` (None: every one) and leave `in_flight`:
 * the whole dict's keys, the dict rebound empty on the core, or those scheduled in `step`
 * or earlier, deleted from it. NULL on error. */
static PyObject *
take_ending(PyObject *core, PyObject *in_flight, PyObject *step, int every)
{
    if (every) {
        PyObject *ending = PyDict_Keys(in_flight);
        PyObject *empty = ending ? PyDict_New() : NULL;
        int rebound = empty != NULL && lane_set(core, s_in_flight, empty) == 0;
        Py_XDECREF(empty);
        if (!rebound) {
            Py_XDECREF(ending);
            return NULL;
        }
        return ending;
    }
    PyObject *ending = PyList_New(0);
    PyObject *rid, *started;
    Py_ssize_t at = 0;
    while (ending != NULL && PyDict_Next(in_flight, &at, &rid, &started)) {
        int earlier = PyObject_RichCompareBool(started, step, Py_LE);
        if (earlier < 0 || (earlier && PyList_Append(ending, rid) < 0)) {
            Py_CLEAR(ending);
        }
    }
    for (Py_ssize_t k = 0; ending != NULL && k < PyList_GET_SIZE(ending); k++) {
        if (PyDict_DelItem(in_flight, PyList_GET_ITEM(ending, k)) < 0) {
            Py_CLEAR(ending);
        }
    }
    return ending;
}

/* One committing request's registration, as the core's _register makes it: through
 * Lane_register where the lane registers for the core, else (or where that declines) the
 * core's own method. How many blocks; -1 on error. */
static long long
register_one(Lane *lane, PyObject *core, int lane_registers, PyObject *entry)
{
    PyObject *rid = PyTuple_GET_ITEM(entry, 0), *request = PyTuple_GET_ITEM(entry, 1);
    PyObject *answer = NULL;
    if (lane_registers) {
        PyObject *args[2] = {request, PyTuple_GET_ITEM(entry, 2)};
        answer = Lane_register(lane, args, 2);
        if (answer == Py_None) {
            Py_CLEAR(answer);
        } else if (answer == NULL) {
            return -1;
        }
    }
    if (answer == NULL) {
        answer = PyObject_CallMethodObjArgs(core, s_register, rid, request,
                                            PyTuple_GET_ITEM(entry, 2), NULL);
        if (answer == NULL) {
            return -1;
        }
    }
    long long count = PyLong_AsLongLong(answer);
    Py_DECREF(answer);
    return count == -1 && PyErr_Occurred() ? -1 : count;
}

/* end_step(core, step) -> KVCacheManager.end_step(step) for a core whose decode lane this
 * is and that copies nothing (`_tails` None, no `unit U`): how many blocks became hittable,
 * or None (nothing done) where the definition must answer, an invalid step included (it
 * says why). The definition's steps, in its order: the same-pass publications taken, the
 * ending chunks leave `_in_flight` and count as computed (Lane_end_chunks), then the
 * requests that may commit register in request-id order. Its last step, giving back the
 * blocks those requests' chunks copied from, has nothing to do here: only `unit U` (Tails)
 * gives a request copy sources. */
PyObject *
Lane_end_step(Lane *lane, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "end_step(core, step)");
        return NULL;
    }
    PyObject *core = args[0], *step = args[1];
    PyObject *current = lane_get(core, s_step);
    PyObject *tails = current ? PyObject_GetAttr(core, s_tails) : NULL;
    PyObject *in_flight = tails ? lane_get(core, s_in_flight) : NULL;
    PyObject *requests = in_flight ? PyObject_GetAttr(core, s_requests) : NULL;
    PyObject *flag = requests ? PyObject_GetAttr(core, s_lane_registers) : NULL;
    PyObject *published = flag ? PyObject_GetAttr(core, s_published_in_step) : NULL;
    PyObject *ending = NULL, *committing = NULL, *answer = NULL;
    if (published == NULL) {
        goto done;
    }
    long long now, number = -1, already;
    int valid = tails == Py_None && PyDict_CheckExact(in_flight) && PyDict_CheckExact(requests) &&
                PyBool_Check(flag) && count_of(current, &now) && count_of(published, &already);
    if (valid && step != Py_None) { /* else _check_step raises (or the general path serves) */
        valid = count_of(step, &number) && number <= now;
    }
    if (!valid) {
        answer = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *none_yet = PyLong_FromLong(0);
    int reset = none_yet != NULL && PyObject_SetAttr(core, s_published_in_step, none_yet) == 0;
    Py_XDECREF(none_yet);
    if (!reset) {
        goto done;
    }
    long long registered = already + lane->published;
    lane->published = 0;
    ending = take_ending(core, in_flight, step, step == Py_None || number == now);
    PyObject *call[2] = {ending, requests};
    committing = ending ? Lane_end_chunks(lane, call, 2) : NULL;
    if (committing == NULL || PyList_Sort(committing) < 0) { /* rids are distinct: by rid */
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(committing);
    for (Py_ssize_t k = 0; k < count; k++) {
        long long added = register_one(lane, core, flag == Py_True,
                                       PyList_GET_ITEM(committing, k));
        if (added < 0) {
            goto done;
        }
        registered += added;
    }
    answer = PyLong_FromLongLong(registered);
done:
    Py_XDECREF(current);
    Py_XDECREF(tails);
    Py_XDECREF(in_flight);
    Py_XDECREF(requests);
    Py_XDECREF(flag);
    Py_XDECREF(published);
    Py_XDECREF(ending);
    Py_XDECREF(committing);
    return answer;
}
