// Shared pieces of the jaxops native kernels: float environment, NaN-propagating min/max,
// order-preserving integer keys of floats, and dtype dispatch of index outputs.
#ifndef JAXOPS_NATIVE_COMMON_H_
#define JAXOPS_NATIVE_COMMON_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace jaxops {

namespace ffi = xla::ffi;

// XLA:CPU runs its kernels with denormals-are-zero and flush-to-zero set (measured:
// jit(x != 0) is False for 1e-45f, 1e-45f * 1e30f is 0). The xla kernels therefore decide
// every float predicate and order on the integer bits (jaxops/core/float_bits.py: "is it
// zero", score thresholds, priority keys), and so do the native ones (ordered_bits below,
// the nonzero masks of compaction.cc): those decisions hold in any float mode. Only float
// arithmetic the xla kernels do in floats (the IoU of NMS) runs under this mode, so that
// it rounds and flushes as XLA's does, whatever the caller's mode.
class XlaFloatMode {
 public:
#if defined(__x86_64__) || defined(_M_X64)
  XlaFloatMode() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // FTZ | DAZ
  ~XlaFloatMode() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#endif
};

// jnp.minimum / jnp.maximum: NaN in either operand gives NaN.
// Written as selects so that loops over them vectorise.
template <typename F>
inline F nan_min(F a, F b) { const F m = b < a ? b : a; return a != a ? a : (b != b ? b : m); }
template <typename F>
inline F nan_max(F a, F b) { const F m = b > a ? b : a; return a != a ? a : (b != b ? b : m); }

// float_bits.ordered_bits: an unsigned key (of the float's width) whose integer order is
// the float order with -0.0 == +0.0 and every NaN (any sign, any payload) the largest key,
// one above +inf. A subnormal is the value it is, whatever the float mode.
template <typename U>
inline U ordered_bits_of(U u, U inf) {
  constexpr U sign = U{1} << (8 * sizeof(U) - 1);
  const U mag = u & ~sign;
  if (mag == 0) u = 0;                          // -0.0 -> +0.0
  const U key = (u & sign) ? U(~u) : U(u | sign);  // negatives order backwards
  return mag > inf ? U(~U{0}) : key;
}
inline uint32_t ordered_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return ordered_bits_of<uint32_t>(u, 0x7f800000u);
}
inline uint64_t ordered_bits(double f) {
  uint64_t u;
  std::memcpy(&u, &f, 8);
  return ordered_bits_of<uint64_t>(u, 0x7ff0000000000000ull);
}

// A large output XLA hands us is fresh malloc memory: untouched 4 KB pages, each faulting
// on its first write (a 64 MB output: 16K faults, most of the call, measured here). numpy
// madvises its large arrays into transparent huge pages; the same advice before the first
// write gives the output 2 MB pages. Only changes how the pages are backed.
inline void advise_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

// Scratch blocks kept between kernel calls. A block of 1 MB or more that the kernel frees
// is kept here (up to kKeptBytes in all, the oldest freed first beyond that) and handed to
// the next kernel asking for about as much (its size up to twice the request). Without it
// every call's scratch is fresh memory from the OS: each page faults and is zeroed by the
// kernel on its first write (measured: 2.5 us a 4 KB fault here; hash find's 20 MB of
// scratch for 1M keys cost 1-2.5K faults a call). jaxops_native_release_scratch frees them
// (jaxops.native.release_scratch). Thread-safe: kernels run concurrently on XLA's threads.
class ScratchCache {
 public:
  static constexpr size_t kKeptBytes = size_t{256} << 20;
  static constexpr size_t kCachedFrom = size_t{1} << 20;

  static ScratchCache& instance();
  // A kept block of `bytes` to 2 * `bytes` (the smallest such), or nullptr; *got: its size.
  void* take(size_t bytes, size_t* got);
  // Keeps the block (freeing the oldest kept ones beyond kKeptBytes). Never throws.
  void give(void* data, size_t bytes) noexcept;
  // Frees every kept block; returns how many bytes that gave back.
  size_t release();

 private:
  struct Block {
    void* data;
    size_t bytes;
  };
  std::mutex mu_;
  std::vector<Block> blocks_;
  size_t kept_ = 0;
};

// Scratch memory for a kernel: n items of T, uninitialised, given back with the object.
// Blocks of 1 MB or more come from and go back to the ScratchCache (their pages stay
// mapped between calls), in multiples of 2 MB with the huge-page advice before their first
// write (see advise_huge_pages: a 4 MB buffer of 4 KB pages is a thousand faults).
template <typename T>
class Scratch {
 public:
  explicit Scratch(size_t n) {
    constexpr size_t kHuge = size_t{2} << 20;
    bytes_ = std::max<size_t>(n * sizeof(T), 64);
    if (bytes_ >= ScratchCache::kCachedFrom) {
      bytes_ = (bytes_ + kHuge - 1) / kHuge * kHuge;
      size_t got = 0;
      data_ = static_cast<T*>(ScratchCache::instance().take(bytes_, &got));
      if (data_ != nullptr) {
        bytes_ = got;
        return;
      }
    }
    const size_t align = bytes_ >= ScratchCache::kCachedFrom ? kHuge : 64;
    data_ = static_cast<T*>(std::aligned_alloc(align, (bytes_ + align - 1) / align * align));
    if (data_ == nullptr) throw std::bad_alloc();
    advise_huge_pages(data_, bytes_);
  }
  ~Scratch() {
    if (bytes_ >= ScratchCache::kCachedFrom && bytes_ <= ScratchCache::kKeptBytes)
      ScratchCache::instance().give(data_, bytes_);
    else
      std::free(data_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return data_; }

 private:
  T* data_;
  size_t bytes_;
};

inline ffi::Error bad(const std::string& what) {
  return ffi::Error::InvalidArgument("jaxops native: " + what);
}

// Runs fn, turning a failed allocation into an error (no exception crosses the FFI).
template <typename Fn>
ffi::Error guarded(const std::string& op, Fn fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "jaxops native: " + op + ": out of memory");
  }
}

inline int64_t product(ffi::Span<const int64_t> dims, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= dims[i];
  return p;
}

}  // namespace jaxops

#endif  // JAXOPS_NATIVE_COMMON_H_
