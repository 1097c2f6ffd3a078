/* libnnopbase.so stand-in: aclTensor, aclOpExecutor and the output-shape refresh. */
#include <stdlib.h>
#include <string.h>

#include "acl_double.h"

static long g_live_tensors;
typedef struct Live { const aclTensor *t; struct Live *next; } Live;
static Live *g_tensors;

EXPORT int double_is_tensor(const aclTensor *t) {
    for (Live *l = g_tensors; l; l = l->next)
        if (l->t == t) return 1;
    return 0;
}
static long g_live_executors;
static uint64_t g_last_outshape[OUTSHAPE_SLOT_WORDS];

EXPORT size_t double_itemsize(int dtype) {
    switch (dtype) {
        case ACL_INT8: case ACL_UINT8: case ACL_BOOL: return 1;
        case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16: return 2;
        case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: return 4;
        case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: return 8;
        default: return 0;
    }
}

EXPORT int64_t double_numel(const aclTensor *t) {
    int64_t n = 1;
    for (uint64_t k = 0; k < t->ndim; k++) n *= t->view[k];
    return n;
}

EXPORT aclTensor *aclCreateTensor(const int64_t *view_dims, uint64_t view_dims_num, int dtype,
                                  const int64_t *stride, int64_t offset, int format,
                                  const int64_t *storage_dims, uint64_t storage_dims_num,
                                  void *tensor_data) {
    int code;
    if (double_should_fail("aclCreateTensor", &code)) return NULL;
    if (view_dims_num > MAX_DIMS || storage_dims_num > MAX_DIMS || double_itemsize(dtype) == 0) {
        double_set_error("aclCreateTensor: rank %lu or dtype %d not supported",
                         (unsigned long)view_dims_num, dtype);
        return NULL;
    }
    aclTensor *t = calloc(1, sizeof *t);
    t->ndim = view_dims_num;
    t->storage_ndim = storage_dims_num;
    for (uint64_t k = 0; k < view_dims_num; k++) {
        t->view[k] = view_dims[k];
        t->strides[k] = stride ? stride[k] : 0;
    }
    for (uint64_t k = 0; k < storage_dims_num; k++) t->storage[k] = storage_dims[k];
    t->offset = offset;
    t->dtype = dtype;
    t->format = format;
    t->data = tensor_data;
    Live *l = malloc(sizeof *l);
    l->t = t;
    l->next = g_tensors;
    g_tensors = l;
    g_live_tensors++;
    return t;
}

EXPORT aclnnStatus aclDestroyTensor(const aclTensor *tensor) {
    int code;
    if (double_should_fail("aclDestroyTensor", &code)) return code;
    if (tensor == NULL) return ACLNN_ERR_PARAM_NULLPTR;
    for (Live **link = &g_tensors; *link; link = &(*link)->next) {
        if ((*link)->t == tensor) {
            Live *l = *link;
            *link = l->next;
            free(l);
            free((void *)tensor);
            g_live_tensors--;
            return ACL_SUCCESS;
        }
    }
    return ACLNN_ERR_PARAM_INVALID;  /* not a live tensor: double destroy */
    return ACL_SUCCESS;
}

/* The caller releases *view_dims (the real API documents delete[]; this double uses
 * malloc, which is what libstdc++'s operator new[] calls for trivially destructible
 * element types, so free() is the matching release from C or ctypes). */
EXPORT aclnnStatus aclGetViewShape(const aclTensor *tensor, int64_t **view_dims,
                                   uint64_t *view_dims_num) {
    int code;
    if (double_should_fail("aclGetViewShape", &code)) return code;
    if (tensor == NULL || view_dims == NULL || view_dims_num == NULL)
        return ACLNN_ERR_PARAM_NULLPTR;
    *view_dims = malloc(sizeof(int64_t) * (tensor->ndim ? tensor->ndim : 1));
    memcpy(*view_dims, tensor->view, sizeof(int64_t) * tensor->ndim);
    *view_dims_num = tensor->ndim;
    return ACL_SUCCESS;
}

/* ---- executors ------------------------------------------------------------------- */
EXPORT aclOpExecutor *double_executor_new(double_task_fn run, const void *ctx, size_t ctx_size,
                                          uint64_t workspace_size) {
    aclOpExecutor *e = calloc(1, sizeof *e);
    e->run = run;
    e->ctx = malloc(ctx_size);
    memcpy(e->ctx, ctx, ctx_size);
    e->ctx_size = ctx_size;
    e->workspace_size = workspace_size;
    g_live_executors++;
    return e;
}

static void executor_free(aclOpExecutor *e) {
    free(e->ctx);
    free(e);
    g_live_executors--;
}

EXPORT aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor) {
    int code;
    if (double_should_fail("aclSetAclOpExecutorRepeatable", &code)) return code;
    if (executor == NULL) return ACLNN_ERR_INNER_NULLPTR;
    executor->repeatable = 1;
    return ACL_SUCCESS;
}

EXPORT aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor) {
    int code;
    if (double_should_fail("aclDestroyAclOpExecutor", &code)) return code;
    if (executor == NULL) return ACLNN_ERR_INNER_NULLPTR;
    executor_free(executor);
    return ACL_SUCCESS;
}

/* The second phase of every aclnn op (CommonOpExecutorRun): check the workspace, queue
 * the kernel on the stream, and release a non-repeatable executor. */
EXPORT aclnnStatus double_executor_launch(aclOpExecutor *e, void *workspace,
                                          uint64_t workspace_size, aclrtStream stream,
                                          const char *call) {
    int code;
    if (double_should_fail(call, &code)) return code;
    if (e == NULL) return ACLNN_ERR_PARAM_NULLPTR;
    if (workspace_size < e->workspace_size ||
        (e->workspace_size && !double_is_device(workspace, e->workspace_size))) {
        double_set_error("%s: workspace of %lu bytes needed", call,
                         (unsigned long)e->workspace_size);
        return ACLNN_ERR_PARAM_INVALID;
    }
    void *task_ctx = malloc(e->ctx_size);
    memcpy(task_ctx, e->ctx, e->ctx_size);
    ((TaskHeader *)task_ctx)->workspace = workspace;
    aclError ret = double_enqueue(stream, e->run, task_ctx);
    if (ret != ACL_SUCCESS) free(task_ctx);
    if (!e->repeatable) executor_free(e);
    return ret == ACL_SUCCESS ? ACL_SUCCESS : ACLNN_ERR_RUNTIME_ERROR;
}

/* opbase's output-shape refresh: the kernel wrote [rank | flag, d0, ...] as uint64
 * words; the flag bit is masked off and the output's view shape becomes the dims. */
EXPORT void double_refresh_view_shape(aclTensor *tensor, const uint64_t *words) {
    memcpy(g_last_outshape, words, sizeof g_last_outshape);
    uint64_t rank = words[0] & ~OUTSHAPE_UINT64_FLAG;
    if (rank > MAX_DIMS) rank = MAX_DIMS;
    tensor->ndim = rank;
    for (uint64_t k = 0; k < rank; k++) tensor->view[k] = (int64_t)words[1 + k];
}

/* ---- test hooks ------------------------------------------------------------------ */
EXPORT long jaxopsDoubleLiveTensors(void) { return g_live_tensors; }
EXPORT long jaxopsDoubleLiveExecutors(void) { return g_live_executors; }
EXPORT void jaxopsDoubleLastOutshape(uint64_t *out) {
    memcpy(out, g_last_outshape, sizeof g_last_outshape);
}
