/* libascendcl.so stand-in: init, devices, streams, memory, error injection. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl_double.h"

static int g_initialized;
static int g_device = -1;
static int g_device_refs;
static char g_err[512];

/* ---- error injection: JAXOPS_DOUBLE_FAIL="name=code,name@n=code" --------------- */
#define MAX_CALLS 64
static char g_spec[1024];
static struct { char name[64]; long calls; } g_counts[MAX_CALLS];
static int g_ncounts;

static long bump(const char *call) {
    for (int i = 0; i < g_ncounts; i++)
        if (strcmp(g_counts[i].name, call) == 0) return ++g_counts[i].calls;
    if (g_ncounts == MAX_CALLS) return 0;
    snprintf(g_counts[g_ncounts].name, sizeof g_counts[0].name, "%s", call);
    g_counts[g_ncounts].calls = 1;
    return g_counts[g_ncounts++].calls;
}

EXPORT int double_should_fail(const char *call, int *code) {
    const char *spec = getenv("JAXOPS_DOUBLE_FAIL");
    if (spec == NULL) spec = "";
    if (strncmp(spec, g_spec, sizeof g_spec) != 0) {  /* a new spec restarts the counts */
        snprintf(g_spec, sizeof g_spec, "%s", spec);
        g_ncounts = 0;
    }
    long n = bump(call);
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (eq == NULL) continue;
        *eq = '\0';
        char *at = strchr(item, '@');
        long nth = 0;
        if (at) { *at = '\0'; nth = strtol(at + 1, NULL, 10); }
        if (strcmp(item, call) == 0 && (nth == 0 || nth == n)) {
            *code = (int)strtol(eq + 1, NULL, 10);
            double_set_error("%s: injected failure %d (JAXOPS_DOUBLE_FAIL)", call, *code);
            return 1;
        }
    }
    return 0;
}

#define INJECT(call)                                   \
    do {                                               \
        int injected_;                                 \
        if (double_should_fail(call, &injected_)) return injected_; \
    } while (0)

EXPORT void double_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
}

EXPORT const char *aclGetRecentErrMsg(void) { return g_err[0] ? g_err : NULL; }

/* ---- init and devices ----------------------------------------------------------- */
EXPORT aclError aclInit(const char *config_path) {
    (void)config_path;
    INJECT("aclInit");
    if (g_initialized) return ACL_ERROR_REPEAT_INITIALIZE;
    g_initialized = 1;
    return ACL_SUCCESS;
}

EXPORT aclError aclFinalize(void) {
    INJECT("aclFinalize");
    if (!g_initialized) return ACL_ERROR_UNINITIALIZE;
    g_initialized = 0;
    return ACL_SUCCESS;
}

static uint32_t device_count(void) {
    const char *env = getenv("JAXOPS_DOUBLE_DEVICES");
    return env ? (uint32_t)strtoul(env, NULL, 10) : 1u;
}

EXPORT aclError aclrtGetDeviceCount(uint32_t *count) {
    INJECT("aclrtGetDeviceCount");
    if (!g_initialized) return ACL_ERROR_UNINITIALIZE;
    if (count == NULL) return ACL_ERROR_INVALID_PARAM;
    *count = device_count();
    return ACL_SUCCESS;
}

EXPORT aclError aclrtSetDevice(int32_t device) {
    INJECT("aclrtSetDevice");
    if (!g_initialized) return ACL_ERROR_UNINITIALIZE;
    if (device < 0 || (uint32_t)device >= device_count()) {
        double_set_error("aclrtSetDevice: invalid device id %d", device);
        return ACL_ERROR_INVALID_PARAM;
    }
    g_device = device;
    g_device_refs++;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtResetDevice(int32_t device) {
    INJECT("aclrtResetDevice");
    if (device != g_device || g_device_refs == 0) return ACL_ERROR_INVALID_PARAM;
    if (--g_device_refs == 0) g_device = -1;
    return ACL_SUCCESS;
}

/* ---- "device" memory: host blocks, tracked so misuse is caught ------------------ */
typedef struct Block { char *ptr; size_t size; struct Block *next; } Block;
static Block *g_blocks;
static long g_live_allocs;

EXPORT int double_is_device(const void *ptr, size_t nbytes) {
    const char *p = (const char *)ptr;
    for (Block *b = g_blocks; b; b = b->next)
        if (p >= b->ptr && p + nbytes <= b->ptr + b->size) return 1;
    return 0;
}

EXPORT aclError aclrtMalloc(void **dev_ptr, size_t size, int policy) {
    (void)policy;
    INJECT("aclrtMalloc");
    if (g_device < 0) return ACL_ERROR_RT_PARAM_INVALID;  /* no device set */
    if (dev_ptr == NULL || size == 0) return ACL_ERROR_INVALID_PARAM;
    Block *b = malloc(sizeof *b);
    b->ptr = calloc(1, size);
    b->size = size;
    b->next = g_blocks;
    g_blocks = b;
    g_live_allocs++;
    *dev_ptr = b->ptr;
    return ACL_SUCCESS;
}

EXPORT aclError aclrtFree(void *dev_ptr) {
    INJECT("aclrtFree");
    for (Block **link = &g_blocks; *link; link = &(*link)->next) {
        if ((*link)->ptr == dev_ptr) {
            Block *b = *link;
            *link = b->next;
            free(b->ptr);
            free(b);
            g_live_allocs--;
            return ACL_SUCCESS;
        }
    }
    double_set_error("aclrtFree: %p is not a live allocation", dev_ptr);
    return ACL_ERROR_INVALID_PARAM;
}

EXPORT aclError aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
    INJECT("aclrtMemcpy");
    if (count > dest_max) return ACL_ERROR_INVALID_PARAM;
    int dst_dev = kind == ACL_MEMCPY_HOST_TO_DEVICE || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    int src_dev = kind == ACL_MEMCPY_DEVICE_TO_HOST || kind == ACL_MEMCPY_DEVICE_TO_DEVICE;
    if ((dst_dev && !double_is_device(dst, count)) || (src_dev && !double_is_device(src, count))) {
        double_set_error("aclrtMemcpy: device range of %zu bytes is not inside a live allocation",
                         count);
        return ACL_ERROR_INVALID_PARAM;
    }
    memcpy(dst, src, count);
    return ACL_SUCCESS;
}

/* ---- streams: kernels queue here and run on synchronisation --------------------- */
typedef struct Task { double_task_fn run; void *ctx; struct Task *next; } Task;
typedef struct Stream { Task *head, *tail; } Stream;
static long g_live_streams;

EXPORT aclError aclrtCreateStream(aclrtStream *stream) {
    INJECT("aclrtCreateStream");
    if (g_device < 0) return ACL_ERROR_RT_PARAM_INVALID;
    if (stream == NULL) return ACL_ERROR_INVALID_PARAM;
    *stream = calloc(1, sizeof(Stream));
    g_live_streams++;
    return ACL_SUCCESS;
}

EXPORT aclError double_enqueue(aclrtStream stream, double_task_fn run, void *ctx) {
    if (stream == NULL) return ACL_ERROR_INVALID_PARAM;
    Stream *s = stream;
    Task *t = calloc(1, sizeof *t);
    t->run = run;
    t->ctx = ctx;
    if (s->tail) s->tail->next = t; else s->head = t;
    s->tail = t;
    return ACL_SUCCESS;
}

static aclError drain(Stream *s, int run) {
    aclError first = ACL_SUCCESS;
    while (s->head) {
        Task *t = s->head;
        s->head = t->next;
        if (run && first == ACL_SUCCESS) first = t->run(t->ctx);
        free(t->ctx);
        free(t);
    }
    s->tail = NULL;
    return first;
}

EXPORT aclError aclrtSynchronizeStream(aclrtStream stream) {
    INJECT("aclrtSynchronizeStream");
    if (stream == NULL) return ACL_ERROR_INVALID_PARAM;
    return drain(stream, 1);
}

EXPORT aclError aclrtDestroyStream(aclrtStream stream) {
    INJECT("aclrtDestroyStream");
    if (stream == NULL) return ACL_ERROR_INVALID_PARAM;
    drain(stream, 0);  /* unsynchronised work is dropped */
    free(stream);
    g_live_streams--;
    return ACL_SUCCESS;
}

/* ---- test hooks ------------------------------------------------------------------ */
EXPORT long jaxopsDoubleLiveAllocs(void) { return g_live_allocs; }
EXPORT long jaxopsDoubleLiveStreams(void) { return g_live_streams; }
EXPORT long jaxopsDoubleDeviceRefs(void) { return g_device_refs; }
