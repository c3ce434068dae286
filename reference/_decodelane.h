/* kvcert.reference._decodelane's shared declarations: the lane object, the interned
 * attribute names, the arithmetic and the attribute access of its eight sources
 * (_decodelane.c: the type and module; _decodelane_step.c: a decode step, planned;
 * _decodelane_alloc.c: a plan carried out on the pool, and an admission's first chunk;
 * _decodelane_commit.c: registering what a step completed, and a step's end;
 * _decodelane_dropin.c: the vLLM drop-in's calls for a decode chunk and a step's end;
 * _decodelane_handout.c: the blocks such a chunk hands vLLM; _decodelane_dropin_type.c:
 * the drop-in's type; _decodelane_wrap.c: the drop-in's _wrap). */
#ifndef KVCERT_DECODELANE_H
#define KVCERT_DECODELANE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* PyMember_SetOne (3.11 keeps it here) */
#include <limits.h>
#include <stdint.h>
#include <string.h>

/* STATE: a state (Mamba) group; a lane holding one (`has_state`) plans a decode step's
 * table changes for it too (its running state's blocks, tables.TablePlanner.changes), but
 * leaves every registration, and `reserve`'s allocation, to the Python code */
enum { FULL = 0, WINDOW = 1, CHUNKED = 2, STATE = 3 };

/* The largest count a plan may hold: past it a step is the general path's (it answers
 * Waiting without listing positions). */
#define MAX_PLAN ((long long)1 << 40)

typedef struct {
    PyObject_HEAD
    Py_ssize_t groups;
    int has_state; /* some group is STATE */
    int *kind;
    long long *size; /* block size */
    long long *span; /* window or chunk; 0 for full attention */
    /* state groups: the positions a decode chunk holds for its drafts' states (ALLOC-SPEC-1,
     * GroupConfig.speculative_blocks), and whether the group keeps a state at every boundary
     * (mode all: no running state, its positions held as full attention's are) */
    long long *spare;
    int *every_state;
    long long limit; /* max_model_len, or -1 */
    PyObject *pool;  /* num_free, num_registered */
    PyObject *counts;
    PyObject *links;
    PyObject *keys; /* forget_run(blocks, evictions, shadowed) */
    PyObject *evictions;
    PyObject *dead_evictions;
    PyObject *no_blocks;   /* what a step allocating nothing returns */
    PyObject *token_limit; /* no bound: the Python side's TOKEN_LIMIT */
    /* registration (commit.Registrar): per group the tokens its keys cover past a block and
     * the computed tokens it waits for past one; attention commits whole units of `unit` */
    long long *key_lookahead;
    long long *commit_delay;
    long long unit;
    /* the answer: requests.Scheduled, a frozen dataclass with slots, filled through the
     * member descriptors of its fields (what its generated __init__ sets) */
    PyTypeObject *scheduled;
    PyMemberDef *fields[5];
    PyObject *quiet_steps; /* the manager's answers of quiet steps, per token count */
    PyObject *decode_step; /* quiet_steps[1], the usual one, or NULL */
    /* same-pass visibility (ALLOC-VIS-2): a launch publishes the blocks its chunk completes,
     * registered here where `registers`, else by commit.Registrar.publish (`commits`); the
     * count is kept for the manager's end_step (take_published) */
    int same_pass;
    int registers;
    PyObject *commits;
    long long published;
    /* scratch, grown as needed: released (group, position, block) and wanted positions */
    long long *released;
    Py_ssize_t released_cap;
    long long *wanted;
    Py_ssize_t wanted_cap;
} Lane;


/* interned attribute and method names (made once, at import) */
extern PyObject *s_checkpoints, *s_computed, *s_scheduled, *s_lookahead, *s_decoding, *s_tokens,
    *s_tables, *s_held_from, *s_quiet_end, *s_quiet_state, *s_quiet_slots, *s_quiet_slots_floor,
    *s_num_free, *s_num_registered, *s_forget_run, *s_extend, *s_unique_chains, *s_chains,
    *s_registered, *s_commit_at, *s_size, *s_digests, *s_stream, *s_fed, *s_state, *s_records,
    *s_boundaries, *s_bind_run, *s_pipelined, *s_published, *s_publish, *s_fromlist, *s_take,
    *s_step, *s_in_flight, *s_tails, *s_requests, *s_lane_registers, *s_published_in_step,
    *s_register;

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

static inline long long
cdiv(long long a, long long b)
{
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}

static inline long long
floordiv(long long a, long long b)
{
    long long q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}


/* `value` as a C integer when it is an int in 0..MAX_PLAN (what this serves); else 0. */
static inline int
count_of(PyObject *value, long long *out)
{
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow && *out >= 0 && *out <= MAX_PLAN;
}

/* Whether a request's tables and first held positions are lists, one item per group (its
 * tables' items are checked where they are read: plan_step). */
static inline int
lists_per_group(const Lane *lane, PyObject *tables, PyObject *held_from)
{
    return PyList_CheckExact(tables) && PyList_CheckExact(held_from) &&
           PyList_GET_SIZE(tables) == lane->groups && PyList_GET_SIZE(held_from) == lane->groups;
}

/* attribute access through the slots' member descriptors (see _decodelane.c) */
PyObject *lane_get(PyObject *obj, PyObject *name);
int lane_set(PyObject *obj, PyObject *name, PyObject *value);
int lane_get_ll(PyObject *obj, PyObject *name, long long *value);
int lane_set_ll(PyObject *obj, PyObject *name, long long value);
PyObject *lane_append_tokens(PyObject *tokens, PyObject *appended);
int lane_get_bound(PyObject *obj, PyObject *name, long long *value);

/* A table entry's block; -1 on error. */
static inline long long
entry(PyObject *table, Py_ssize_t j)
{
    return PyLong_AsLongLong(PyList_GET_ITEM(table, j));
}

PyObject *Lane_extend(Lane *lane, PyObject *const *args, Py_ssize_t nargs);
PyObject *lane_decode(Lane *lane, PyObject *request, PyObject *rid, PyObject *tokens,
                      long long computed, PyObject *appended, Py_ssize_t count,
                      long long lookahead, PyObject *step, PyObject *in_flight);
int decode_tokens_valid(PyObject *appended, PyObject *budget, Py_ssize_t *count);
int lane_launchable(PyObject *step, PyObject *current);
PyObject *Lane_register(Lane *lane, PyObject *const *args, Py_ssize_t nargs);
PyObject *Lane_end_chunks(Lane *lane, PyObject *const *args, Py_ssize_t nargs);
PyObject *Lane_end_step(Lane *lane, PyObject *const *args, Py_ssize_t nargs);
PyObject *Lane_publish(Lane *lane, PyObject *request);
int lane_launch(Lane *lane, PyObject *rid, PyObject *request, PyObject *step, PyObject *in_flight);
PyObject *make_answer(Lane *lane, long long hit, Py_ssize_t scheduled, PyObject *new_blocks,
                      PyObject *tables);
PyObject *lane_reserve(Lane *lane, PyObject *request, long long computed, long long end,
                       long long lookahead, long long pipelined);
PyObject *Lane_admit(Lane *lane, PyObject *const *args, Py_ssize_t nargs);

/* A step's answer: Scheduled(0, scheduled, new_blocks) (tables None, copies empty). */
static inline PyObject *
make_scheduled(Lane *lane, Py_ssize_t scheduled, PyObject *new_blocks)
{
    return make_answer(lane, 0, scheduled, new_blocks, Py_None);
}

/* A chunk's table changes (_decodelane_step.c plans them, _decodelane_alloc.c carries them
 * out on the pool): the table positions it releases and wants. */
typedef struct {
    Py_ssize_t released;     /* entries in lane->released, three numbers each */
    Py_ssize_t wanted;       /* positions in lane->wanted, group by group */
    Py_ssize_t *per_group;   /* wanted positions per group */
} Plan;

long long first_read(const Lane *lane, Py_ssize_t g, long long computed, long long end);
long long state_table_end(const Lane *lane, Py_ssize_t g, long long end, int decoding);
int plan_step(Lane *lane, PyObject *tables, PyObject *held_from, long long computed,
              long long in_flight, long long end, long long state_end, int decoding, Plan *plan,
              int *fits);
int plan_quiet(Lane *lane, PyObject *request, PyObject *tables, PyObject *held_from,
               long long computed);
PyObject *carry_out(Lane *lane, PyObject *tables, PyObject *held_from, const Plan *plan);

/* the lane's type, and the vLLM drop-in's calls over it (_decodelane_dropin.c) */
extern PyTypeObject LaneType, DropInType;
int dropin_ready(void);
/* the vLLM drop-in's _wrap, a module function (_decodelane_wrap.c) */
PyObject *wrap_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#endif
