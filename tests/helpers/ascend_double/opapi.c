/* libopapi.so stand-in: aclnnNonzero, aclnnMaskedSelect, aclnnUnique2 (two-phase API).
 *
 * Phase 1 (…GetWorkspaceSize) validates like the real op_api layer and builds an
 * executor; phase 2 queues the kernel on the stream. The kernel runs at stream sync,
 * writes its outputs as a contiguous row-major prefix of each max-shape buffer and its
 * output shapes as uint64 words with the 0x80000000 rank flag into the workspace (the
 * OP_OUTSHAPE tensor), from which nnopbase refreshes each output's view shape. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "acl_double.h"

#define INJECT(call)                                                \
    do {                                                            \
        int injected_;                                              \
        if (double_should_fail(call, &injected_)) return injected_; \
    } while (0)

/* ---- element access ------------------------------------------------------------- */
static double half_to_double(uint16_t h) {
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v = exp == 0 ? ldexp(mant, -24) : exp == 31 ? (mant ? NAN : INFINITY)
                                                       : ldexp(mant | 0x400, exp - 25);
    return (h & 0x8000) ? -v : v;
}

static int is_float(int dtype) {
    return dtype == ACL_FLOAT || dtype == ACL_FLOAT16 || dtype == ACL_BF16 || dtype == ACL_DOUBLE;
}
static int is_unsigned(int dtype) {
    return dtype == ACL_UINT8 || dtype == ACL_UINT16 || dtype == ACL_UINT32 ||
           dtype == ACL_UINT64 || dtype == ACL_BOOL;
}

static double load_f64(const void *base, int64_t i, int dtype) {
    switch (dtype) {
        case ACL_FLOAT: return ((const float *)base)[i];
        case ACL_DOUBLE: return ((const double *)base)[i];
        case ACL_FLOAT16: return half_to_double(((const uint16_t *)base)[i]);
        case ACL_BF16: {
            uint32_t bits = (uint32_t)((const uint16_t *)base)[i] << 16;
            float f;
            memcpy(&f, &bits, sizeof f);
            return f;
        }
        default: return 0.0;
    }
}

static int64_t load_i64(const void *base, int64_t i, int dtype) {
    switch (dtype) {
        case ACL_INT8: return ((const int8_t *)base)[i];
        case ACL_INT16: return ((const int16_t *)base)[i];
        case ACL_INT32: return ((const int32_t *)base)[i];
        case ACL_INT64: return ((const int64_t *)base)[i];
        default: return 0;
    }
}

static uint64_t load_u64(const void *base, int64_t i, int dtype) {
    switch (dtype) {
        case ACL_UINT8: case ACL_BOOL: return ((const uint8_t *)base)[i];
        case ACL_UINT16: return ((const uint16_t *)base)[i];
        case ACL_UINT32: return ((const uint32_t *)base)[i];
        case ACL_UINT64: return ((const uint64_t *)base)[i];
        default: return 0;
    }
}

static int is_nonzero(const void *base, int64_t i, int dtype) {
    if (is_float(dtype)) return load_f64(base, i, dtype) != 0.0;  /* NaN counts, -0.0 not */
    return is_unsigned(dtype) ? load_u64(base, i, dtype) != 0 : load_i64(base, i, dtype) != 0;
}

/* ---- shared checks -------------------------------------------------------------- */
static int contiguous_nd(const aclTensor *t) {
    int64_t stride = 1;
    for (int64_t k = (int64_t)t->ndim - 1; k >= 0; k--) {
        if (t->view[k] > 1 && t->strides[k] != stride) return 0;
        stride *= t->view[k];
    }
    return t->format == ACL_FORMAT_ND && t->offset == 0;
}

static int dtype_in(int dtype, const int *list, int n) {
    for (int i = 0; i < n; i++)
        if (list[i] == dtype) return 1;
    return 0;
}

/* The buffer behind a tensor at its creation shape must be live device memory. */
static int check_buffer(const aclTensor *t, int64_t elements, const char *call) {
    if (!double_is_tensor(t)) {
        double_set_error("%s: a tensor was destroyed before the stream was synchronised", call);
        return 0;
    }
    size_t nbytes = (size_t)elements * double_itemsize(t->dtype);
    if (nbytes && !double_is_device(t->data, nbytes)) {
        double_set_error("%s: tensor data is not live device memory", call);
        return 0;
    }
    return 1;
}

static aclnnStatus finish_phase1(double_task_fn run, const void *ctx, size_t size,
                                 uint64_t workspace_words, uint64_t *workspace_size,
                                 aclOpExecutor **executor) {
    /* the workspace holds the OP_OUTSHAPE tensor plus scratch, like the real kernels */
    *workspace_size = workspace_words * sizeof(uint64_t) + 256;
    *executor = double_executor_new(run, ctx, size, *workspace_size);
    return ACL_SUCCESS;
}

static void write_slot(uint64_t *words, const int64_t *dims, uint64_t rank) {
    memset(words, 0, OUTSHAPE_SLOT_WORDS * sizeof(uint64_t));
    words[0] = OUTSHAPE_UINT64_FLAG | rank;
    for (uint64_t k = 0; k < rank; k++) words[1 + k] = (uint64_t)dims[k];
}

/* ---- aclnnNonzero ----------------------------------------------------------------- */
static const int NONZERO_DTYPES[] = {ACL_FLOAT, ACL_FLOAT16, ACL_DOUBLE, ACL_INT32, ACL_INT64,
                                     ACL_INT16, ACL_INT8, ACL_UINT8, ACL_BOOL, ACL_BF16};
typedef struct { TaskHeader h; aclTensor *self, *out; int64_t max_rows; } NonzeroCtx;

static aclError nonzero_run(void *p) {
    NonzeroCtx *c = p;
    const aclTensor *x = c->self;
    int64_t n = double_numel(x), d = (int64_t)x->ndim;
    if (!check_buffer(x, n, "aclnnNonzero") || !check_buffer(c->out, c->max_rows * d, "aclnnNonzero"))
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    int64_t *out = c->out->data, rows = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!is_nonzero(x->data, i, x->dtype)) continue;
        for (int64_t k = d - 1, rem = i; k >= 0; k--) {
            out[rows * d + k] = rem % x->view[k];
            rem /= x->view[k];
        }
        rows++;
    }
    /* arch35 NonZero: shape words [0x80000002, N, D] (transposed output) */
    int64_t dims[2] = {rows, d};
    write_slot(c->h.workspace, dims, 2);
    double_refresh_view_shape(c->out, c->h.workspace);
    return ACL_SUCCESS;
}

EXPORT aclnnStatus aclnnNonzeroGetWorkspaceSize(const aclTensor *self, aclTensor *out,
                                                uint64_t *workspace_size, aclOpExecutor **executor) {
    INJECT("aclnnNonzeroGetWorkspaceSize");
    if (!self || !out || !workspace_size || !executor) return ACLNN_ERR_PARAM_NULLPTR;
    if (!dtype_in(self->dtype, NONZERO_DTYPES, sizeof NONZERO_DTYPES / sizeof(int)) ||
        out->dtype != ACL_INT64 || !contiguous_nd(self) || !contiguous_nd(out) || out->ndim != 2 ||
        out->view[0] < double_numel(self) || out->view[1] != (int64_t)self->ndim) {
        double_set_error("aclnnNonzero: self dtype %d / out [%ld, %ld] (INT64 [numel, ndim] needed)",
                         self->dtype, (long)out->view[0], (long)out->view[1]);
        return ACLNN_ERR_PARAM_INVALID;
    }
    NonzeroCtx ctx = {{NULL}, (aclTensor *)self, out, out->view[0]};
    return finish_phase1(nonzero_run, &ctx, sizeof ctx, OUTSHAPE_SLOT_WORDS, workspace_size, executor);
}

EXPORT aclnnStatus aclnnNonzero(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                aclrtStream stream) {
    return double_executor_launch(executor, workspace, workspace_size, stream, "aclnnNonzero");
}

/* ---- aclnnMaskedSelect ------------------------------------------------------------ */
static const int SELECT_DTYPES[] = {ACL_FLOAT, ACL_FLOAT16, ACL_DOUBLE, ACL_INT32, ACL_INT64,
                                    ACL_INT16, ACL_INT8, ACL_UINT8, ACL_BOOL, ACL_BF16};
typedef struct {
    TaskHeader h;
    aclTensor *self, *mask, *out;
    int64_t shape[MAX_DIMS];  /* the broadcast shape */
    uint64_t ndim;
} MaskedSelectCtx;

/* numpy broadcasting of two shapes; 0 when they do not broadcast */
static int broadcast(const aclTensor *a, const aclTensor *b, int64_t *shape, uint64_t *ndim) {
    *ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (uint64_t k = 0; k < *ndim; k++) {
        int64_t da = k < *ndim - a->ndim ? 1 : a->view[k - (*ndim - a->ndim)];
        int64_t db = k < *ndim - b->ndim ? 1 : b->view[k - (*ndim - b->ndim)];
        if (da != db && da != 1 && db != 1) return 0;
        shape[k] = da == 1 ? db : da;
    }
    return 1;
}

/* flat index into t of the broadcast position whose coordinates are coord */
static int64_t broadcast_offset(const aclTensor *t, const int64_t *coord, uint64_t ndim) {
    int64_t off = 0;
    for (uint64_t k = ndim - t->ndim, j = 0; k < ndim; k++, j++)
        off = off * t->view[j] + (t->view[j] == 1 ? 0 : coord[k]);
    return off;
}

static aclError masked_select_run(void *p) {
    MaskedSelectCtx *c = p;
    int64_t total = 1, coord[MAX_DIMS] = {0};
    for (uint64_t k = 0; k < c->ndim; k++) total *= c->shape[k];
    if (!check_buffer(c->self, double_numel(c->self), "aclnnMaskedSelect") ||
        !check_buffer(c->mask, double_numel(c->mask), "aclnnMaskedSelect") ||
        !check_buffer(c->out, total, "aclnnMaskedSelect"))
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    size_t item = double_itemsize(c->self->dtype);
    int64_t kept = 0;
    for (int64_t i = 0; i < total; i++) {
        for (int64_t k = (int64_t)c->ndim - 1, rem = i; k >= 0; k--) {
            coord[k] = rem % c->shape[k];
            rem /= c->shape[k];
        }
        if (!is_nonzero(c->mask->data, broadcast_offset(c->mask, coord, c->ndim), c->mask->dtype))
            continue;
        int64_t src = broadcast_offset(c->self, coord, c->ndim);
        memcpy((char *)c->out->data + kept * item, (const char *)c->self->data + src * item, item);
        kept++;
    }
    write_slot(c->h.workspace, &kept, 1);
    double_refresh_view_shape(c->out, c->h.workspace);
    return ACL_SUCCESS;
}

EXPORT aclnnStatus aclnnMaskedSelectGetWorkspaceSize(const aclTensor *self, const aclTensor *mask,
                                                     aclTensor *out, uint64_t *workspace_size,
                                                     aclOpExecutor **executor) {
    INJECT("aclnnMaskedSelectGetWorkspaceSize");
    if (!self || !mask || !out || !workspace_size || !executor) return ACLNN_ERR_PARAM_NULLPTR;
    MaskedSelectCtx ctx = {{NULL}, (aclTensor *)self, (aclTensor *)mask, out, {0}, 0};
    int ok = broadcast(self, mask, ctx.shape, &ctx.ndim);
    int64_t total = 1;
    for (uint64_t k = 0; k < ctx.ndim; k++) total *= ctx.shape[k];
    if (!ok || !dtype_in(self->dtype, SELECT_DTYPES, sizeof SELECT_DTYPES / sizeof(int)) ||
        (mask->dtype != ACL_BOOL && mask->dtype != ACL_UINT8) || out->dtype != self->dtype ||
        out->ndim != 1 || out->view[0] < total || !contiguous_nd(self) || !contiguous_nd(mask) ||
        !contiguous_nd(out)) {
        double_set_error("aclnnMaskedSelect: invalid shapes or dtypes");
        return ACLNN_ERR_PARAM_INVALID;
    }
    return finish_phase1(masked_select_run, &ctx, sizeof ctx, OUTSHAPE_SLOT_WORDS, workspace_size,
                         executor);
}

EXPORT aclnnStatus aclnnMaskedSelect(void *workspace, uint64_t workspace_size,
                                     aclOpExecutor *executor, aclrtStream stream) {
    return double_executor_launch(executor, workspace, workspace_size, stream, "aclnnMaskedSelect");
}

/* ---- aclnnUnique2 ------------------------------------------------------------------ */
static const int UNIQUE_DTYPES[] = {ACL_BOOL, ACL_FLOAT, ACL_FLOAT16, ACL_DOUBLE, ACL_UINT8,
                                    ACL_INT8, ACL_UINT16, ACL_INT16, ACL_INT32, ACL_UINT32,
                                    ACL_UINT64, ACL_INT64, ACL_BF16};
typedef struct {
    TaskHeader h;
    aclTensor *self, *value, *inverse, *counts;
    int sorted, return_inverse, return_counts;
} Unique2Ctx;

static const aclTensor *g_sort_tensor;  /* qsort has no context argument */

/* ascending, NaN after every number and equal to NaN (grouped as one value) */
static int compare_keys(const aclTensor *t, int64_t a, int64_t b) {
    if (is_float(t->dtype)) {
        double x = load_f64(t->data, a, t->dtype), y = load_f64(t->data, b, t->dtype);
        return isnan(x) ? (isnan(y) ? 0 : 1) : isnan(y) ? -1 : (x > y) - (x < y);
    }
    if (is_unsigned(t->dtype)) {
        uint64_t x = load_u64(t->data, a, t->dtype), y = load_u64(t->data, b, t->dtype);
        return (x > y) - (x < y);
    }
    int64_t x = load_i64(t->data, a, t->dtype), y = load_i64(t->data, b, t->dtype);
    return (x > y) - (x < y);
}

static int compare_stable(const void *pa, const void *pb) {  /* ties keep input order */
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    int c = compare_keys(g_sort_tensor, a, b);
    return c ? c : (a > b) - (a < b);
}

static aclError unique2_run(void *p) {
    Unique2Ctx *c = p;
    const aclTensor *x = c->self;
    int64_t n = double_numel(x);
    int need_inverse = c->return_inverse || c->return_counts;
    if (!check_buffer(x, n, "aclnnUnique2") || !check_buffer(c->value, n, "aclnnUnique2") ||
        (need_inverse && !check_buffer(c->inverse, n, "aclnnUnique2")) ||
        (c->return_counts && !check_buffer(c->counts, n, "aclnnUnique2")))
        return ACL_ERROR_RT_AICORE_EXCEPTION;
    int64_t *order = malloc(sizeof(int64_t) * (n ? n : 1));
    for (int64_t i = 0; i < n; i++) order[i] = i;
    g_sort_tensor = x;
    qsort(order, (size_t)n, sizeof(int64_t), compare_stable);
    size_t item = double_itemsize(x->dtype);
    int64_t groups = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || compare_keys(x, order[i - 1], order[i]) != 0) {
            /* a new value: its first occurrence in input order represents it */
            memcpy((char *)c->value->data + groups * item,
                   (const char *)x->data + order[i] * item, item);
            if (c->return_counts) ((int64_t *)c->counts->data)[groups] = 0;
            groups++;
        }
        if (need_inverse) ((int64_t *)c->inverse->data)[order[i]] = groups - 1;
        if (c->return_counts) ((int64_t *)c->counts->data)[groups - 1]++;
    }
    free(order);
    /* OP_OUTSHAPE slots: valueOut, inverseOut, countsOut */
    uint64_t *words = c->h.workspace;
    write_slot(words, &groups, 1);
    write_slot(words + OUTSHAPE_SLOT_WORDS, x->view, x->ndim);
    write_slot(words + 2 * OUTSHAPE_SLOT_WORDS, &groups, 1);
    double_refresh_view_shape(c->value, words);
    if (need_inverse) double_refresh_view_shape(c->inverse, words + OUTSHAPE_SLOT_WORDS);
    if (c->return_counts) double_refresh_view_shape(c->counts, words + 2 * OUTSHAPE_SLOT_WORDS);
    return ACL_SUCCESS;
}

static int same_shape(const aclTensor *a, const aclTensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (uint64_t k = 0; k < a->ndim; k++)
        if (a->view[k] != b->view[k]) return 0;
    return 1;
}

EXPORT aclnnStatus aclnnUnique2GetWorkspaceSize(const aclTensor *self, bool sorted,
                                                bool return_inverse, bool return_counts,
                                                aclTensor *value_out, aclTensor *inverse_out,
                                                aclTensor *counts_out, uint64_t *workspace_size,
                                                aclOpExecutor **executor) {
    INJECT("aclnnUnique2GetWorkspaceSize");
    if (!self || !value_out || !inverse_out || !counts_out || !workspace_size || !executor)
        return ACLNN_ERR_PARAM_NULLPTR;
    int64_t n = double_numel(self);
    if (!dtype_in(self->dtype, UNIQUE_DTYPES, sizeof UNIQUE_DTYPES / sizeof(int)) ||
        value_out->dtype != self->dtype || value_out->ndim != 1 || value_out->view[0] != n ||
        !contiguous_nd(self) || !contiguous_nd(value_out) ||
        ((return_inverse || return_counts) &&
         (!same_shape(inverse_out, self) || inverse_out->dtype != ACL_INT64)) ||
        (return_counts && (!same_shape(counts_out, value_out) || counts_out->dtype != ACL_INT64))) {
        double_set_error("aclnnUnique2: invalid shapes or dtypes");
        return ACLNN_ERR_PARAM_INVALID;
    }
    Unique2Ctx ctx = {{NULL}, (aclTensor *)self, value_out, inverse_out, counts_out,
                      sorted, return_inverse, return_counts};
    return finish_phase1(unique2_run, &ctx, sizeof ctx, 3 * OUTSHAPE_SLOT_WORDS, workspace_size,
                         executor);
}

EXPORT aclnnStatus aclnnUnique2(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                aclrtStream stream) {
    return double_executor_launch(executor, workspace, workspace_size, stream, "aclnnUnique2");
}
