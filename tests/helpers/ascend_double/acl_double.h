/*
 * A test double of the CANN runtime: the minimal ABI jaxops' Ascend shim uses.
 *
 * Three shared libraries stand in for the toolkit's lib64:
 *   libascendcl.so  (ascendcl.c)  aclInit, devices, streams, "device" memory on the host
 *   libnnopbase.so  (nnopbase.c)  aclTensor, aclOpExecutor, the output-shape refresh
 *   libopapi.so     (opapi.c)     aclnnNonzero, aclnnMaskedSelect, aclnnUnique2
 * Signatures follow the public CANN headers (acl/acl_rt.h, aclnn/acl_meta.h,
 * aclnnop/aclnn_nonzero.h, aclnn_masked_select.h, aclnn_unique2.h).
 *
 * Beyond the ABI the double is strict where the real runtime would corrupt memory
 * silently: every device pointer handed to memcpy or a kernel must lie inside a live
 * aclrtMalloc block, and kernels only run when their stream is synchronised. It also
 * counts live allocations, streams, tensors and executors (jaxopsDoubleLive*), and
 * fails on demand: JAXOPS_DOUBLE_FAIL="name=code[,name@n=code...]" makes call `name`
 * (its n-th call after the variable last changed, default every call) return `code`.
 * JAXOPS_DOUBLE_DEVICES sets the device count (default 1).
 */
#ifndef JAXOPS_ACL_DOUBLE_H_
#define JAXOPS_ACL_DOUBLE_H_

#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

typedef int aclError;
typedef int aclnnStatus;
typedef void *aclrtStream;

enum {
    ACL_SUCCESS = 0,
    ACL_ERROR_INVALID_PARAM = 100000,
    ACL_ERROR_UNINITIALIZE = 100001,
    ACL_ERROR_REPEAT_INITIALIZE = 100002,
    ACL_ERROR_RT_PARAM_INVALID = 107000,
    ACL_ERROR_RT_MEMORY_ALLOCATION = 207001,
    ACLNN_ERR_PARAM_NULLPTR = 161001,
    ACLNN_ERR_PARAM_INVALID = 161002,
    ACLNN_ERR_RUNTIME_ERROR = 361001,
    ACLNN_ERR_INNER_NULLPTR = 561103,
    ACL_ERROR_RT_AICORE_EXCEPTION = 507015,
};

typedef enum {
    ACL_FLOAT = 0, ACL_FLOAT16 = 1, ACL_INT8 = 2, ACL_INT32 = 3, ACL_UINT8 = 4,
    ACL_INT16 = 6, ACL_UINT16 = 7, ACL_UINT32 = 8, ACL_INT64 = 9, ACL_UINT64 = 10,
    ACL_DOUBLE = 11, ACL_BOOL = 12, ACL_BF16 = 27,
} aclDataType;

enum { ACL_FORMAT_ND = 2 };
enum { ACL_MEMCPY_HOST_TO_HOST = 0, ACL_MEMCPY_HOST_TO_DEVICE = 1,
       ACL_MEMCPY_DEVICE_TO_HOST = 2, ACL_MEMCPY_DEVICE_TO_DEVICE = 3 };

#define MAX_DIMS 8
/* The rank word of a 64-bit shape tensor carries bit 31 ("uint64 data"), as the arch35
 * NonZero kernel writes it (NON_ZERO_OUTSHAPE_DIM_BASE = 0x80000002 for rank 2). */
#define OUTSHAPE_UINT64_FLAG 0x80000000ULL
#define OUTSHAPE_SLOT_WORDS 9

typedef struct aclTensor {
    int64_t view[MAX_DIMS];
    uint64_t ndim;
    int64_t strides[MAX_DIMS];
    int64_t offset;
    int64_t storage[MAX_DIMS];
    uint64_t storage_ndim;
    int dtype;
    int format;
    void *data;
} aclTensor;

/* An op's queued work: run(ctx) executes on stream sync; ctx is freed afterwards.
 * Every op context struct begins with a TaskHeader; the launch fills in the workspace. */
typedef aclError (*double_task_fn)(void *ctx);
typedef struct { void *workspace; } TaskHeader;

typedef struct aclOpExecutor {
    double_task_fn run;
    void *ctx;          /* owned by the executor until enqueued */
    size_t ctx_size;
    uint64_t workspace_size;
    int repeatable;
} aclOpExecutor;

/* ascendcl.c */
int double_should_fail(const char *call, int *code);
void double_set_error(const char *fmt, ...);
int double_is_device(const void *ptr, size_t nbytes);
aclError double_enqueue(aclrtStream stream, double_task_fn run, void *ctx);

/* nnopbase.c */
aclOpExecutor *double_executor_new(double_task_fn run, const void *ctx, size_t ctx_size,
                                   uint64_t workspace_size);
aclnnStatus double_executor_launch(aclOpExecutor *executor, void *workspace,
                                   uint64_t workspace_size, aclrtStream stream,
                                   const char *call);
void double_refresh_view_shape(aclTensor *tensor, const uint64_t *words);
int double_is_tensor(const aclTensor *t);
int64_t double_numel(const aclTensor *t);
size_t double_itemsize(int dtype);

#endif
