// The aclnn two-phase dispatch as an XLA FFI handler: the Ascend route without Python.
//
// One handler serves every aclnn kernel jaxops maps (jaxops/backends/ascend_ops.py). XLA
// hands it the input buffers and the max-shape output buffers; the attributes name the
// CANN runtime libraries (the paths the ascend backend's detection loaded), the kernel
// (`aclnn` = "Nonzero" -> aclnnNonzeroGetWorkspaceSize / aclnnNonzero) and its
// GetWorkspaceSize argument list (`kinds`: 0 input tensor, 1 output tensor, 2 bool,
// 3 int64; `dtypes`: the aclDataType of each tensor; `scalars`: the bool/int64 values).
//
// The steps are those of jaxops.backends.aclnn.Runtime.dispatch: bind the thread to the
// device, create a stream, copy the inputs to device memory, wrap every tensor in an ND
// aclTensor, call aclnn<Op>GetWorkspaceSize, mark the executor repeatable (so it is ours
// to destroy on every path), allocate the workspace, call aclnn<Op>, synchronise, then read
// each output's refreshed view shape (aclGetViewShape: the runtime has decoded the kernel's
// OP_OUTSHAPE words) and copy that many elements back as the row-major prefix of XLA's
// buffer (the wire layout), zeros after it. The last result holds the shapes, one slot of
// 9 int32 words per output: [rank, d0, ..., d7]. Every resource is released in reverse
// order on every path; a non-zero status fails the call with "AclError: <call> failed
// with aclError <code>[: <aclGetRecentErrMsg>]", the message of the callback route.
//
// GetWorkspaceSize functions differ in arity and types. Every argument jaxops passes is of
// integer class (a pointer, bool, int64), which the x86-64 SysV and AArch64 procedure-call
// standards pass alike, one 64-bit register or stack slot each; so the call goes through a
// function type of N uint64 arguments. A signature with a floating-point scalar is not
// served here (the Python side keeps such kernels on the callback route).
#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common.h"

#if !defined(__linux__) || !(defined(__x86_64__) || defined(__aarch64__))
#error "the aclnn handler passes integer-class arguments by the x86-64 / AArch64 Linux ABI"
#endif

namespace jaxops {
namespace {

constexpr int kFormatNd = 2;
constexpr int kMallocHugeFirst = 0;
constexpr int kHostToDevice = 1, kDeviceToHost = 2;
constexpr int kAclInt64 = 9;
constexpr int kMaxDims = 8, kSlotWords = 9;
constexpr size_t kMaxPhase1Args = 16;
enum Kind : int64_t { kInput = 0, kOutput = 1, kBool = 2, kInt64 = 3 };

// aclDataType -> bytes per element (acl/acl_base.h); 0: not a type the handler moves.
size_t acl_itemsize(int64_t dtype) {
  switch (dtype) {
    case 2: case 4: case 12: return 1;                  // INT8, UINT8, BOOL
    case 1: case 6: case 7: case 27: return 2;          // FLOAT16, INT16, UINT16, BF16
    case 0: case 3: case 8: return 4;                   // FLOAT, INT32, UINT32
    case 9: case 10: case 11: return 8;                 // INT64, UINT64, DOUBLE
    default: return 0;
  }
}

// The runtime functions, resolved once per set of library paths.
struct Api {
  int (*set_device)(int32_t);
  int (*reset_device)(int32_t);
  int (*create_stream)(void**);
  int (*destroy_stream)(void*);
  int (*synchronize_stream)(void*);
  int (*malloc)(void**, size_t, int);
  int (*free)(void*);
  int (*memcpy)(void*, size_t, const void*, size_t, int);
  const char* (*recent_error)();  // optional
  void* (*create_tensor)(const int64_t*, uint64_t, int, const int64_t*, int64_t, int,
                         const int64_t*, uint64_t, void*);
  int (*destroy_tensor)(const void*);
  int (*get_view_shape)(const void*, int64_t**, uint64_t*);
  int (*set_repeatable)(void*);
  int (*destroy_executor)(void*);
  void* opapi;
};

std::string acl_error(const Api& api, std::string_view call, int code) {
  std::string message = "AclError: " + std::string(call) + " failed with aclError " +
                        std::to_string(code);
  const char* recent = api.recent_error ? api.recent_error() : nullptr;
  if (recent != nullptr && recent[0] != '\0') message += std::string(": ") + recent;
  return message;
}

template <typename F>
bool resolve(void* lib, const char* name, F* out, std::string* missing) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (*out == nullptr && missing->empty()) *missing = name;
  return *out != nullptr;
}

// dlopen of a library the ascend backend already loaded returns its handle (same file,
// RTLD_GLOBAL as ctypes loaded it); handles are kept for the life of the process.
ffi::ErrorOr<const Api*> load_api(std::string_view ascendcl, std::string_view nnopbase,
                                  std::string_view opapi) {
  static std::mutex lock;
  static std::map<std::string, Api> loaded;
  std::string key = std::string(ascendcl) + '\n' + std::string(nnopbase) + '\n' + std::string(opapi);
  std::lock_guard<std::mutex> guard(lock);
  auto found = loaded.find(key);
  if (found != loaded.end()) return &found->second;
  void* libs[3];
  std::string_view paths[3] = {ascendcl, nnopbase, opapi};
  for (int k = 0; k < 3; ++k) {
    libs[k] = dlopen(std::string(paths[k]).c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (libs[k] == nullptr)
      return ffi::Unexpected(ffi::Error::Internal("jaxops aclnn: cannot load " +
                                                  std::string(paths[k]) + ": " + dlerror()));
  }
  Api api{};
  std::string missing;
  resolve(libs[0], "aclrtSetDevice", &api.set_device, &missing);
  resolve(libs[0], "aclrtResetDevice", &api.reset_device, &missing);
  resolve(libs[0], "aclrtCreateStream", &api.create_stream, &missing);
  resolve(libs[0], "aclrtDestroyStream", &api.destroy_stream, &missing);
  resolve(libs[0], "aclrtSynchronizeStream", &api.synchronize_stream, &missing);
  resolve(libs[0], "aclrtMalloc", &api.malloc, &missing);
  resolve(libs[0], "aclrtFree", &api.free, &missing);
  resolve(libs[0], "aclrtMemcpy", &api.memcpy, &missing);
  resolve(libs[1], "aclCreateTensor", &api.create_tensor, &missing);
  resolve(libs[1], "aclDestroyTensor", &api.destroy_tensor, &missing);
  resolve(libs[1], "aclGetViewShape", &api.get_view_shape, &missing);
  resolve(libs[1], "aclSetAclOpExecutorRepeatable", &api.set_repeatable, &missing);
  resolve(libs[1], "aclDestroyAclOpExecutor", &api.destroy_executor, &missing);
  if (!missing.empty())
    return ffi::Unexpected(ffi::Error::Internal("jaxops aclnn: the CANN runtime does not export " +
                                                missing));
  std::string optional;
  resolve(libs[0], "aclGetRecentErrMsg", &api.recent_error, &optional);
  api.opapi = libs[2];
  return &loaded.emplace(std::move(key), api).first->second;
}

// GetWorkspaceSize through a function type of n uint64 arguments (see the file comment).
template <size_t... I>
int call_integer_args(void* fn, const uint64_t* a, std::index_sequence<I...>) {
  using F = int (*)(decltype((void)I, uint64_t{})...);
  return reinterpret_cast<F>(fn)(a[I]...);
}
template <size_t N>
int call_n(void* fn, const uint64_t* a) { return call_integer_args(fn, a, std::make_index_sequence<N>{}); }
template <size_t... N>
constexpr auto call_table(std::index_sequence<N...>) {
  return std::array<int (*)(void*, const uint64_t*), sizeof...(N)>{&call_n<N>...};
}

// Resources of one dispatch, released in reverse order on every path. A release that
// fails after success is the error; after an error it is appended to that error's message.
class Resources {
 public:
  explicit Resources(const Api& api) : api_(api) {}
  void release(const char* call, std::function<int()> fn) { releases_.emplace_back(call, std::move(fn)); }
  std::string finish(std::string error) {
    for (auto it = releases_.rbegin(); it != releases_.rend(); ++it) {
      const int code = it->second();
      if (code == 0) continue;
      const std::string failed = acl_error(api_, it->first, code);
      error = error.empty() ? failed
                            : error + " (while releasing resources after this error: " + failed + ")";
    }
    releases_.clear();
    return error;
  }

 private:
  const Api& api_;
  std::vector<std::pair<const char*, std::function<int()>>> releases_;
};

// One tensor argument: its XLA buffer, aclDataType and device copy.
struct Tensor {
  ffi::AnyBuffer buffer;
  int64_t dtype;
  bool output;
  void* device = nullptr;
  void* handle = nullptr;
  size_t nbytes() const { return buffer.element_count() * acl_itemsize(dtype); }
};

#define ACL_CHECK(call, expr)                                 \
  do {                                                        \
    const int code_ = (expr);                                 \
    if (code_ != 0) return acl_error(api, call, code_);       \
  } while (0)

// Device memory, tensors, the two phases, the sync and the read-back; "" on success.
std::string run(const Api& api, Resources& res, int32_t device, std::string_view aclnn,
                ffi::Span<const int64_t> kinds, ffi::Span<const int64_t> scalars,
                std::vector<Tensor>& tensors, int32_t* shapes) {
  ACL_CHECK("aclrtSetDevice", api.set_device(device));
  res.release("aclrtResetDevice", [&api, device] { return api.reset_device(device); });
  void* stream = nullptr;
  ACL_CHECK("aclrtCreateStream", api.create_stream(&stream));
  res.release("aclrtDestroyStream", [&api, stream] { return api.destroy_stream(stream); });
  std::vector<uint64_t> args;
  size_t t = 0, s = 0;
  for (int64_t kind : kinds) {
    if (kind == kBool || kind == kInt64) {
      args.push_back(static_cast<uint64_t>(scalars[s++]));
      continue;
    }
    Tensor& x = tensors[t++];
    const size_t nbytes = x.nbytes();
    ACL_CHECK("aclrtMalloc", api.malloc(&x.device, std::max<size_t>(nbytes, 1), kMallocHugeFirst));
    void* ptr = x.device;
    res.release("aclrtFree", [&api, ptr] { return api.free(ptr); });
    if (!x.output && nbytes)
      ACL_CHECK("aclrtMemcpy", api.memcpy(x.device, nbytes, x.buffer.untyped_data(), nbytes, kHostToDevice));
    auto dims = x.buffer.dimensions();
    std::vector<int64_t> shape(dims.begin(), dims.end()), strides(shape.size() + 1, 1);
    for (size_t k = shape.size(); k-- > 0;) strides[k] = strides[k + 1] * shape[k];
    shape.push_back(0);  // a valid pointer for rank 0
    x.handle = api.create_tensor(shape.data(), dims.size(), static_cast<int>(x.dtype), strides.data() + 1,
                                 0, kFormatNd, shape.data(), dims.size(), x.device);
    if (x.handle == nullptr) {
      std::string message = acl_error(api, "aclCreateTensor", -1);
      return message.replace(message.find("failed with aclError -1"), 23, "returned NULL");
    }
    void* handle = x.handle;
    res.release("aclDestroyTensor", [&api, handle] { return api.destroy_tensor(handle); });
    args.push_back(reinterpret_cast<uint64_t>(x.handle));
  }
  const std::string phase1 = "aclnn" + std::string(aclnn) + "GetWorkspaceSize";
  const std::string phase2 = "aclnn" + std::string(aclnn);
  void* get_size = dlsym(api.opapi, phase1.c_str());
  auto launch = reinterpret_cast<int (*)(void*, uint64_t, void*, void*)>(dlsym(api.opapi, phase2.c_str()));
  if (get_size == nullptr || launch == nullptr)
    return "jaxops aclnn: libopapi does not export " + (get_size ? phase2 : phase1);
  uint64_t workspace_size = 0;
  void* executor = nullptr;
  args.push_back(reinterpret_cast<uint64_t>(&workspace_size));
  args.push_back(reinterpret_cast<uint64_t>(&executor));
  static constexpr auto table = call_table(std::make_index_sequence<kMaxPhase1Args + 1>{});
  ACL_CHECK(phase1.c_str(), table[args.size()](get_size, args.data()));
  // Ours to destroy on every path (see the Python route); registered before marking.
  res.release("aclDestroyAclOpExecutor", [&api, executor] { return api.destroy_executor(executor); });
  ACL_CHECK("aclSetAclOpExecutorRepeatable", api.set_repeatable(executor));
  void* workspace = nullptr;
  if (workspace_size) {
    ACL_CHECK("aclrtMalloc", api.malloc(&workspace, workspace_size, kMallocHugeFirst));
    res.release("aclrtFree", [&api, workspace] { return api.free(workspace); });
  }
  ACL_CHECK(phase2.c_str(), launch(workspace, workspace_size, executor, stream));
  ACL_CHECK("aclrtSynchronizeStream", api.synchronize_stream(stream));
  int32_t* slot = shapes;
  for (Tensor& x : tensors) {
    if (!x.output) continue;
    int64_t* view = nullptr;
    uint64_t rank = 0;
    ACL_CHECK("aclGetViewShape", api.get_view_shape(x.handle, &view, &rank));
    // aclGetViewShape's dims are the caller's to release (see jaxops/backends/acl.py).
    std::vector<int64_t> dims(view, view + rank);
    std::free(view);
    const size_t max_rank = x.buffer.dimensions().size();
    int64_t count = 1;
    for (int64_t d : dims) count *= d;
    if (rank != max_rank || count < 0 || static_cast<size_t>(count) > x.buffer.element_count())
      return "jaxops aclnn: " + phase2 + " refreshed an output of max shape rank " +
             std::to_string(max_rank) + " to rank " + std::to_string(rank) + ", " +
             std::to_string(count) + " elements (more than the buffer, or another rank)";
    std::memset(slot, 0, sizeof(int32_t) * kSlotWords);
    slot[0] = static_cast<int32_t>(rank);
    for (uint64_t k = 0; k < rank; ++k) slot[1 + k] = static_cast<int32_t>(dims[k]);
    slot += kSlotWords;
    const size_t item = acl_itemsize(x.dtype), width = ffi::ByteWidth(x.buffer.element_type());
    const size_t valid = static_cast<size_t>(count) * item;
    char* host = static_cast<char*>(x.buffer.untyped_data());
    if (item == width) {
      if (valid) ACL_CHECK("aclrtMemcpy", api.memcpy(host, valid, x.device, valid, kDeviceToHost));
      std::memset(host + valid, 0, x.buffer.size_bytes() - valid);
      continue;
    }
    // An int64 index output of the kernel, int32 in JAX (x64 off): narrowed exactly.
    std::vector<int64_t> wide(static_cast<size_t>(count));
    if (valid) ACL_CHECK("aclrtMemcpy", api.memcpy(wide.data(), valid, x.device, valid, kDeviceToHost));
    int32_t* narrow = static_cast<int32_t*>(x.buffer.untyped_data());
    for (size_t i = 0; i < wide.size(); ++i) {
      if (wide[i] != static_cast<int32_t>(wide[i]))
        return "jaxops aclnn: " + phase2 + " wrote " + std::to_string(wide[i]) +
               " into an int64 output JAX holds as int32 (enable jax_enable_x64)";
      narrow[i] = static_cast<int32_t>(wide[i]);
    }
    std::memset(narrow + wide.size(), 0, x.buffer.size_bytes() - wide.size() * 4);
  }
  return "";
}

ffi::Error Aclnn(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view ascendcl,
                 std::string_view nnopbase, std::string_view opapi, std::string_view aclnn,
                 ffi::Span<const int64_t> kinds, ffi::Span<const int64_t> dtypes,
                 ffi::Span<const int64_t> scalars, int64_t device) {
  // The attributes come from jaxops' own lowering; these checks keep a mismatch from
  // reading past an array.
  size_t n_in = 0, n_out = 0, n_scalar = 0;
  for (int64_t kind : kinds) {
    if (kind == kInput) ++n_in;
    else if (kind == kOutput) ++n_out;
    else if (kind == kBool || kind == kInt64) ++n_scalar;
    else return bad("aclnn: unknown argument kind " + std::to_string(kind));
  }
  if (n_in != args.size() || n_out + 1 != rets.size() || n_scalar > scalars.size() ||
      n_in + n_out != dtypes.size() || kinds.size() + 2 > kMaxPhase1Args)
    return bad("aclnn: attributes do not match the call's buffers");
  auto shapes = rets.get<ffi::Buffer<ffi::S32>>(n_out);
  if (!shapes.has_value() || (*shapes)->element_count() != n_out * kSlotWords)
    return bad("aclnn: the last result must be int32 [outputs, 9]");
  std::vector<Tensor> tensors;
  size_t a = 0, r = 0;
  for (int64_t kind : kinds) {
    if (kind != kInput && kind != kOutput) continue;
    const int64_t dtype = dtypes[tensors.size()];
    std::optional<ffi::AnyBuffer> buffer;
    if (kind == kInput) {
      auto arg = args.get<ffi::AnyBuffer>(a++);
      if (!arg.has_value()) return arg.error();
      buffer = *arg;
    } else {
      auto ret = rets.get<ffi::AnyBuffer>(r++);
      if (!ret.has_value()) return ret.error();
      buffer = **ret;
    }
    const size_t item = acl_itemsize(dtype), width = ffi::ByteWidth(buffer->element_type());
    const bool narrowed = kind == kOutput && dtype == kAclInt64 && buffer->element_type() == ffi::S32;
    if (item == 0 || (item != width && !narrowed) || buffer->dimensions().size() > kMaxDims)
      return bad("aclnn: aclDataType " + std::to_string(dtype) + " does not fit its buffer");
    tensors.push_back(Tensor{*buffer, dtype, kind == kOutput});
  }
  auto api = load_api(ascendcl, nnopbase, opapi);
  if (!api.has_value()) return api.error();
  static std::mutex dispatch_lock;  // the runtime's streams and executors are not ours to share
  std::lock_guard<std::mutex> guard(dispatch_lock);
  Resources res(**api);
  std::string error = run(**api, res, static_cast<int32_t>(device), aclnn, kinds, scalars, tensors,
                          (*shapes)->typed_data());
  error = res.finish(std::move(error));
  return error.empty() ? ffi::Error::Success() : ffi::Error::Internal(error);
}

}  // namespace
}  // namespace jaxops

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsAclnn, jaxops::Aclnn,
                              xla::ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("ascendcl")
                                  .Attr<std::string_view>("nnopbase")
                                  .Attr<std::string_view>("opapi")
                                  .Attr<std::string_view>("aclnn")
                                  .Attr<xla::ffi::Span<const int64_t>>("kinds")
                                  .Attr<xla::ffi::Span<const int64_t>>("dtypes")
                                  .Attr<xla::ffi::Span<const int64_t>>("scalars")
                                  .Attr<int64_t>("device"));
