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

// a % d for a fixed d without a division (Lemire's fastmod; exact for every 32-bit a, d).
class ModBy {
 public:
  explicit ModBy(uint32_t d) : m_(~uint64_t{0} / d + 1), d_(d) {}
  uint32_t operator()(uint32_t a) const {
    return static_cast<uint32_t>((static_cast<unsigned __int128>(m_ * a) * d_) >> 64);
  }

 private:
  uint64_t m_;
  uint32_t d_;
};

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
  const ModBy mod(static_cast<uint32_t>(size));
  // Homes of the next kAhead keys, computed once, their cache lines requested early.
  std::vector<uint32_t> ring(kAhead);
  auto ask = [&](int64_t j) {
    const uint32_t h = mod(murmur(ql[j], qh[j]));
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
  return guarded("HashFirst", [&] {
    Scratch<int32_t> seen(cap);  // open addressing over batch indices; -1: free
    std::fill(seen.get(), seen.get() + cap, -1);
    int32_t* tab = seen.get();
    const uint64_t mask = static_cast<uint64_t>(cap - 1);
    std::vector<uint32_t> ring(kAhead);  // hashes of the next kAhead keys, lines asked for
    auto ask = [&](int64_t j) {
      ring[j % kAhead] = murmur(ql[j], qh[j]);
      prefetch(tab + (ring[j % kAhead] & mask));
    };
    for (int64_t j = 0; j < std::min<int64_t>(kAhead, n); ++j) ask(j);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t hash = ring[i % kAhead];
      if (i + kAhead < n) ask(i + kAhead);
      out[i] = static_cast<int32_t>(i);
      if (!on[i]) continue;
      const uint32_t a = ql[i], b = qh[i];
      for (uint64_t p = hash & mask;; p = (p + 1) & mask) {
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
  });
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

// find_slots + gather in one call: the live slot of each key (-1: absent or a tombstone)
// and its row (fill where -1). Keys are walked in the order of their home slots (a
// counting sort by home region, O(batch) scratch), so the table's key and flag lines are
// read nearly in address order, each once for the several keys it serves, instead of
// three random cache lines per key; then the rows are copied in input order, as a dense
// gather does (one random line read per key, prefetched ahead).
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
  const ModBy mod(static_cast<uint32_t>(size));
  // Regions of about 128 KB of table stay in cache while their keys are walked; at most 1024 of them, so the sort writes to few enough places at once
  // (each a different page: more would miss the TLB on every write).
  const int64_t region_slots = std::max<int64_t>(256, (int64_t{1} << 17) / (4 * dim + 9));
  int shift = 0;
  while ((int64_t{1} << shift) < region_slots || ((size - 1) >> shift) >= 1024 ||
         (((size - 1) >> shift) + 1) * 64 > n + 64)
    if (++shift >= 31) break;
  const int64_t regions = ((size - 1) >> shift) + 1;
  auto region = [&](uint32_t h) { return static_cast<int64_t>(h >> shift); };
  struct Entry {
    uint32_t lo, hi, home, index;
  };
  return guarded("HashFindRows", [&] {
    Scratch<uint32_t> homes(n);
    Scratch<Entry> sorted(n);  // the keys in region order, read in sequence below
    std::vector<int64_t> start(regions + 1, 0);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t h = mod(murmur(ql[i], qh[i]));
      homes.get()[i] = h;
      ++start[region(h) + 1];
    }
    for (int64_t r = 0; r < regions; ++r) start[r + 1] += start[r];
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t h = homes.get()[i];
      sorted.get()[start[region(h)]++] = Entry{ql[i], qh[i], h, static_cast<uint32_t>(i)};
    }
    for (int64_t k = 0; k < n; ++k) {  // the walks, in region order: slots only
      const Entry e = sorted.get()[k];
      int32_t found = -1;
      for (int64_t d = 0; d < size; ++d) {
        const int64_t s = wrap(int64_t{e.home} + d, size);
        const uint8_t f = fl[s];
        if (f == 0) break;  // empty: absent
        if (klo[s] == e.lo && khi[s] == e.hi) {
          if (!(f & kEvicted)) found = static_cast<int32_t>(s);
          break;
        }
      }
      out_slot[e.index] = found;
    }
    // The rows, in input order (written in sequence; the rows read kAhead keys ahead).
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n && out_slot[i + kAhead] >= 0)
        prefetch(v + int64_t{out_slot[i + kAhead]} * dim);
      const int32_t at = out_slot[i];
      float* row = out + i * dim;
      if (at >= 0) {
        const float* from = v + int64_t{at} * dim;
        for (int64_t c = 0; c < dim; ++c) row[c] = from[c];  // short rows: no memcpy call
      } else {
        std::fill(row, row + dim, fill);
      }
    }
    return ffi::Error::Success();
  });
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
