// The hash-table walks (jaxops/ops/hashtable/probe.py) as sequential loops with prefetching.
//
// Each handler decides exactly what its xla walk decides (the xla walks are data-parallel
// rounds that reproduce a sequential loop; here the loop runs as written):
//   JaxopsHashFind   find_slots: each key walks from its home slot to its key or an empty
//                    slot (slot, distance, flags, first other tombstone passed);
//   JaxopsHashFirst  first_occurrences: the first pending index holding the same key;
//   JaxopsHashPlace  place_new_keys: distinct absent keys placed in ascending index order,
//                    each in the first reusable slot not taken by a lower index;
//   JaxopsHashRows   gather: rows of the slots, a default row where the slot is -1;
//   JaxopsHashFindRows  find: the two above in one pass (live slots and their rows).
// Place marks the slots it hands out with PENDING in the table's flags (aliased: the flags
// buffer is updated in place, O(batch)); the caller overwrites every placed slot's flags,
// as it does after the xla walk, whose scratch covers the same slots.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"

namespace jaxops {
namespace {

constexpr uint8_t kEvicted = 0x8;
constexpr uint8_t kPending = 0x80;
constexpr int kAhead = 16;  // keys prefetched ahead of the one walking

inline uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

inline uint32_t mix(uint32_t h, uint32_t k) {
  k = rotl(k * 0xCC9E2D51u, 15) * 0x1B873593u;
  return rotl(h ^ k, 13) * 5u + 0xE6546B64u;
}

// murmur.py's murmur3_x86_32 of the 8 bytes lo (LE) then hi (LE).
inline uint32_t murmur(uint32_t lo, uint32_t hi, uint32_t seed = 0) {
  uint32_t h = mix(mix(seed, lo), hi) ^ 8u;
  h = (h ^ (h >> 16)) * 0x85EBCA6Bu;
  h = (h ^ (h >> 13)) * 0xC2B2AE35u;
  return h ^ (h >> 16);
}

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 1); }

inline int64_t wrap(int64_t s, int64_t size) { return s >= size ? s - size : s; }

ffi::Error HashFind(ffi::Buffer<ffi::U32> key_lo, ffi::Buffer<ffi::U32> key_hi,
                    ffi::Buffer<ffi::U8> flags, ffi::Buffer<ffi::U32> lo, ffi::Buffer<ffi::U32> hi,
                    ffi::Buffer<ffi::PRED> active, ffi::Result<ffi::Buffer<ffi::S32>> slot,
                    ffi::Result<ffi::Buffer<ffi::S32>> dist,
                    ffi::Result<ffi::Buffer<ffi::U8>> found_flags,
                    ffi::Result<ffi::Buffer<ffi::S32>> reuse) {
  const int64_t size = flags.element_count(), n = lo.element_count();
  if (key_lo.element_count() != size || key_hi.element_count() != size ||
      hi.element_count() != n || active.element_count() != n || slot->element_count() != n)
    return bad("HashFind: table arrays [bucket_size] and key arrays [N] expected");
  const uint32_t* klo = key_lo.typed_data();
  const uint32_t* khi = key_hi.typed_data();
  const uint8_t* fl = flags.typed_data();
  const uint32_t* ql = lo.typed_data();
  const uint32_t* qh = hi.typed_data();
  const bool* on = active.typed_data();
  int32_t* out_slot = slot->typed_data();
  int32_t* out_dist = dist->typed_data();
  uint8_t* out_flags = found_flags->typed_data();
  int32_t* out_reuse = reuse->typed_data();
  const uint32_t usize = static_cast<uint32_t>(size);
  // Homes of the next kAhead keys, computed once, their cache lines requested early.
  std::vector<uint32_t> ring(kAhead);
  auto ask = [&](int64_t j) {
    const uint32_t h = murmur(ql[j], qh[j]) % usize;
    ring[j % kAhead] = h;
    prefetch(fl + h);
    prefetch(klo + h);
    prefetch(khi + h);
  };
  for (int64_t j = 0; j < std::min<int64_t>(kAhead, n); ++j) ask(j);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t home = ring[i % kAhead];
    if (i + kAhead < n) ask(i + kAhead);
    int32_t s_out = -1, d_out = 0, r_out = static_cast<int32_t>(size);
    uint8_t f_out = 0;
    if (on[i]) {
      const uint32_t want_lo = ql[i], want_hi = qh[i];
      int64_t d = 0;
      for (; d < size; ++d) {
        const int64_t s = wrap(home + d, size);
        const uint8_t f = fl[s];
        if (f == 0) break;  // empty: the key is absent
        if (klo[s] == want_lo && khi[s] == want_hi) {
          s_out = static_cast<int32_t>(s);
          f_out = f;
          break;
        }
        if ((f & kEvicted) && r_out == size) r_out = static_cast<int32_t>(d);
      }
      d_out = static_cast<int32_t>(d);
    }
    out_slot[i] = s_out;
    out_dist[i] = d_out;
    out_flags[i] = f_out;
    out_reuse[i] = r_out;
  }
  return ffi::Error::Success();
}

ffi::Error HashFirst(ffi::Buffer<ffi::U32> lo, ffi::Buffer<ffi::U32> hi,
                     ffi::Buffer<ffi::PRED> pending, ffi::Result<ffi::Buffer<ffi::S32>> first) {
  const int64_t n = lo.element_count();
  if (hi.element_count() != n || pending.element_count() != n || first->element_count() != n)
    return bad("HashFirst: key arrays [N] expected");
  const uint32_t* ql = lo.typed_data();
  const uint32_t* qh = hi.typed_data();
  const bool* on = pending.typed_data();
  int32_t* out = first->typed_data();
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  Scratch<int32_t> seen(cap);  // open addressing over batch indices; -1: free
  std::fill(seen.get(), seen.get() + cap, -1);
  int32_t* tab = seen.get();
  const uint64_t mask = static_cast<uint64_t>(cap - 1);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<int32_t>(i);
    if (!on[i]) continue;
    const uint32_t a = ql[i], b = qh[i];
    for (uint64_t p = murmur(a, b) & mask;; p = (p + 1) & mask) {
      const int32_t j = tab[p];
      if (j < 0) {
        tab[p] = static_cast<int32_t>(i);
        break;
      }
      if (ql[j] == a && qh[j] == b) {
        out[i] = j;
        break;
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error HashPlace(ffi::Buffer<ffi::U8> flags_in, ffi::Buffer<ffi::S32> home,
                     ffi::Buffer<ffi::S32> start, ffi::Buffer<ffi::PRED> pending,
                     ffi::Buffer<ffi::S32> own, ffi::Result<ffi::Buffer<ffi::S32>> slot_of,
                     ffi::Result<ffi::Buffer<ffi::U8>> flags) {
  const int64_t size = flags->element_count(), n = home.element_count();
  if (flags_in.element_count() != size || start.element_count() != n ||
      pending.element_count() != n || own.element_count() != n || slot_of->element_count() != n)
    return bad("HashPlace: flags [bucket_size] and key arrays [N] expected");
  uint8_t* fl = flags->typed_data();
  if (flags_in.typed_data() != fl)  // not aliased (XLA could not donate): work on a copy
    std::memcpy(fl, flags_in.typed_data(), size);
  const int32_t* hm = home.typed_data();
  const int32_t* st = start.typed_data();
  const int32_t* ow = own.typed_data();
  const bool* on = pending.typed_data();
  int32_t* out = slot_of->typed_data();
  // Reusable: free or a tombstone (EVICTED), and not handed out yet (PENDING).
  auto claim = [&](int64_t s) {
    const uint8_t f = fl[s];
    if ((f & kPending) || !(f == 0 || (f & kEvicted))) return false;
    fl[s] = f | kPending;
    return true;
  };
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && on[i + kAhead]) prefetch(fl + wrap(int64_t{hm[i + kAhead]} + st[i + kAhead], size));
    out[i] = -1;
    if (!on[i]) continue;
    if (ow[i] >= 0 && claim(wrap(int64_t{hm[i]} + ow[i], size))) {
      out[i] = static_cast<int32_t>(wrap(int64_t{hm[i]} + ow[i], size));
      continue;
    }
    for (int64_t d = st[i]; d < size; ++d) {
      const int64_t s = wrap(int64_t{hm[i]} + d, size);
      if (claim(s)) {
        out[i] = static_cast<int32_t>(s);
        break;
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error HashRows(ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::S32> slots,
                    ffi::Result<ffi::Buffer<ffi::F32>> rows, float f) {
  auto vd = values.dimensions();
  if (vd.size() != 2 || rows->element_count() != slots.element_count() * vd[1])
    return bad("HashRows: values [rows, dim], slots [N], rows [N, dim] expected");
  const int64_t count = vd[0], dim = vd[1], n = slots.element_count();
  const float* v = values.typed_data();
  const int32_t* s = slots.typed_data();
  float* out = rows->typed_data();
  advise_huge_pages(out, rows->size_bytes());
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n && s[i + kAhead] >= 0 && s[i + kAhead] < count)
      prefetch(v + int64_t{s[i + kAhead]} * dim);
    const int32_t at = s[i];
    if (at >= 0 && at < count)
      std::memcpy(out + i * dim, v + int64_t{at} * dim, dim * sizeof(float));
    else
      std::fill(out + i * dim, out + (i + 1) * dim, f);
  }
  return ffi::Error::Success();
}

// find_slots + gather in one pass: the live slot of each key (-1: absent or a tombstone)
// and its row (fill where -1). Three stages a key apart by kAhead: hash and request the
// key's table lines; walk it (its lines arrived) and request its row; copy the row.
ffi::Error HashFindRows(ffi::Buffer<ffi::U32> key_lo, ffi::Buffer<ffi::U32> key_hi,
                        ffi::Buffer<ffi::U8> flags, ffi::Buffer<ffi::F32> values,
                        ffi::Buffer<ffi::U32> lo, ffi::Buffer<ffi::U32> hi,
                        ffi::Result<ffi::Buffer<ffi::S32>> slot,
                        ffi::Result<ffi::Buffer<ffi::F32>> rows, float fill) {
  const int64_t size = flags.element_count(), n = lo.element_count();
  auto vd = values.dimensions();
  if (key_lo.element_count() != size || key_hi.element_count() != size || vd.size() != 2 ||
      vd[0] != size || hi.element_count() != n || slot->element_count() != n ||
      rows->element_count() != n * vd[1])
    return bad("HashFindRows: table arrays [bucket_size], values [bucket_size, dim], keys [N]");
  const int64_t dim = vd[1];
  const uint32_t* klo = key_lo.typed_data();
  const uint32_t* khi = key_hi.typed_data();
  const uint8_t* fl = flags.typed_data();
  const float* v = values.typed_data();
  const uint32_t* ql = lo.typed_data();
  const uint32_t* qh = hi.typed_data();
  int32_t* out_slot = slot->typed_data();
  float* out = rows->typed_data();
  advise_huge_pages(out, rows->size_bytes());
  const uint32_t usize = static_cast<uint32_t>(size);
  std::vector<uint32_t> homes(kAhead);
  auto ask = [&](int64_t j) {
    const uint32_t h = murmur(ql[j], qh[j]) % usize;
    homes[j % kAhead] = h;
    prefetch(fl + h);
    prefetch(klo + h);
    prefetch(khi + h);
  };
  auto walk = [&](int64_t j) {
    const int64_t home = homes[j % kAhead];
    int32_t found = -1;
    for (int64_t d = 0; d < size; ++d) {
      const int64_t s = wrap(home + d, size);
      const uint8_t f = fl[s];
      if (f == 0) break;
      if (klo[s] == ql[j] && khi[s] == qh[j]) {
        if (!(f & kEvicted)) found = static_cast<int32_t>(s);
        break;
      }
    }
    out_slot[j] = found;
    if (found >= 0) prefetch(v + int64_t{found} * dim);
  };
  for (int64_t j = 0; j < std::min<int64_t>(kAhead, n); ++j) ask(j);
  for (int64_t i = -kAhead; i < n; ++i) {
    const int64_t j = i + kAhead;  // walked now; i: copied now
    if (j < n) {
      walk(j);
      if (j + kAhead < n) ask(j + kAhead);
    }
    if (i < 0) continue;
    const int32_t at = out_slot[i];
    if (at >= 0)
      std::memcpy(out + i * dim, v + int64_t{at} * dim, dim * sizeof(float));
    else
      std::fill(out + i * dim, out + (i + 1) * dim, fill);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxops

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsHashFind, jaxops::HashFind,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U8>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::U8>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsHashFirst, jaxops::HashFirst,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsHashPlace, jaxops::HashPlace,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U8>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::U8>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsHashRows, jaxops::HashRows,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Attr<float>("fill"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsHashFindRows, jaxops::HashFindRows,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U8>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Attr<float>("fill"));
