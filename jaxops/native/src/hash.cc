// The hash-table walks (jaxops/hashtable/_walks/probe.py) as sequential loops with prefetching.
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
// Find, Rows and FindRows split their keys among XLA's intra-op threads (parallel.h), First
// its keys by hash; Place decides in index order and runs on one thread.
// Place marks the slots it hands out with PENDING in the table's flags (aliased: the flags
// buffer is updated in place, O(batch)); the caller overwrites every placed slot's flags,
// as it does after the xla walk, whose scratch covers the same slots.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common.h"
#include "parallel.h"

namespace jaxops {
namespace {

constexpr uint8_t kEvicted = 0x8;
constexpr uint8_t kPending = 0x80;
constexpr int kAhead = 16;  // keys prefetched ahead of the one walking
constexpr int kRowsAhead = 32;  // rows prefetched ahead of the one copied (measured: 16 slower)
constexpr int64_t kGrain = 2048;  // keys per thread at least (fewer: not worth a thread)

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
// A line read once and not again soon (a row copied out): into L1, kept out of the outer
// caches (measured on find's rows: 1-5 % faster than prefetch()).
inline void prefetch_once(const void* p) { __builtin_prefetch(p, 0, 0); }
// A line about to be written (its read for ownership starts early; measured on find's
// slots, written in region order: 0.3 ms of 5.5 for 1M keys).
inline void prefetch_for_write(void* p) { __builtin_prefetch(p, 1, 1); }

#if defined(__x86_64__)
#define JAXOPS_AVX2 __attribute__((target("avx2")))
JAXOPS_AVX2 inline __m256i rotl8(__m256i x, int r) {
  return _mm256_or_si256(_mm256_slli_epi32(x, r), _mm256_srli_epi32(x, 32 - r));
}
JAXOPS_AVX2 inline __m256i mix8(__m256i h, __m256i k) {  // mix() in 8 lanes
  k = _mm256_mullo_epi32(rotl8(_mm256_mullo_epi32(k, _mm256_set1_epi32(0xCC9E2D51u)), 15),
                         _mm256_set1_epi32(0x1B873593));
  h = rotl8(_mm256_xor_si256(h, k), 13);
  return _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(h, 2), h),
                          _mm256_set1_epi32(0xE6546B64u));
}
// x mod d in 4 lanes (x: uint32 bits), in doubles. Exact: x < 2^32, so x * inv is within
// 2^-19 of x / d, its truncation at most one off floor(x / d), which the two corrections
// undo; every other step is exact in a double.
JAXOPS_AVX2 inline __m128i mod4(__m128i x, __m256d d, __m256d inv) {
  const __m256d xd = _mm256_add_pd(_mm256_cvtepi32_pd(_mm_xor_si128(x, _mm_set1_epi32(INT32_MIN))),
                                   _mm256_set1_pd(2147483648.0));
  const __m256d q = _mm256_round_pd(_mm256_mul_pd(xd, inv), _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_sub_pd(xd, _mm256_mul_pd(q, d));
  r = _mm256_add_pd(r, _mm256_and_pd(_mm256_cmp_pd(r, _mm256_setzero_pd(), _CMP_LT_OQ), d));
  r = _mm256_sub_pd(r, _mm256_and_pd(_mm256_cmp_pd(r, d, _CMP_GE_OQ), d));
  return _mm256_cvttpd_epi32(r);
}
// homes of keys [0, n) 8 at a time; returns how many it did (a multiple of 8)
JAXOPS_AVX2 int64_t home_slots_avx2(const uint32_t* lo, const uint32_t* hi, int64_t n,
                                    uint32_t size, uint32_t* out) {
  const __m256d d = _mm256_set1_pd(size), inv = _mm256_set1_pd(size ? 1.0 / size : 0.0);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i h = mix8(mix8(_mm256_setzero_si256(), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + i))),
                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + i)));
    h = _mm256_xor_si256(h, _mm256_set1_epi32(8));
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 16)), _mm256_set1_epi32(0x85EBCA6Bu));
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 13)), _mm256_set1_epi32(0xC2B2AE35u));
    h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
    if (size == 0) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
      continue;
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), mod4(_mm256_castsi256_si128(h), d, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 4), mod4(_mm256_extracti128_si256(h, 1), d, inv));
  }
  return i;
}
#endif

// out[i] = murmur(lo[i], hi[i]) % size (size 0: the hash itself): eight keys at a time
// where the CPU has AVX2 (checked at run time; the same numbers either way,
// test_native_hash compares them with the xla walks').
void home_slots(const uint32_t* lo, const uint32_t* hi, int64_t n, uint32_t size, uint32_t* out) {
  int64_t done = 0;
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) done = home_slots_avx2(lo, hi, n, size, out);
#endif
  if (size == 0) {
    for (int64_t i = done; i < n; ++i) out[i] = murmur(lo[i], hi[i]);
    return;
  }
  const ModBy mod(size);
  for (int64_t i = done; i < n; ++i) out[i] = mod(murmur(lo[i], hi[i]));
}

inline int64_t wrap(int64_t s, int64_t size) { return s >= size ? s - size : s; }

// One key's walk from `home`, at most `limit` slots (the key's window: no key lies
// farther from its home): the first slot that is empty or holds the key (lo, hi) stops it.
// Returns the slots passed before the stop (`limit`: nothing stopped it); *slot is the
// stopping slot where it holds the key (its tombstone too), else -1; with `reuse`, *reuse is
// the distance of the first tombstone (EVICTED) passed before the stop, untouched if none.
// Sixteen slots are tested at once (SSE2) wherever they lie before the table's end and
// within the limit: their flag bytes in one load, the low key words four at a time up to
// the first empty slot or the key, and the high word only where the low one matched. So a
// walk through a full window reads it in sixteen-slot steps and a short walk reads what it
// did before.
inline int64_t walk_key(const uint32_t* klo, const uint32_t* khi, const uint8_t* fl,
                        int64_t size, int64_t limit, int64_t home, uint32_t lo, uint32_t hi,
                        int32_t* slot, int32_t* reuse = nullptr) {
  *slot = -1;
  int64_t d = 0;
  while (d < limit) {
    const int64_t s = wrap(home + d, size);
#if defined(__x86_64__)
    if (s + 16 <= size && d + 16 <= limit) {
      const __m128i f = _mm_loadu_si128(reinterpret_cast<const __m128i*>(fl + s));
      const uint32_t empty =
          static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(f, _mm_setzero_si128())));
      const int upto = empty ? __builtin_ctz(empty) : 16;  // slots before the first empty one
      const __m128i want = _mm_set1_epi32(static_cast<int>(lo));
      int at = upto;  // the stop (16: none here)
      for (int q = 0; 4 * q < upto && at == upto; ++q) {
        const __m128i words = _mm_loadu_si128(reinterpret_cast<const __m128i*>(klo + s + 4 * q));
        uint32_t match = static_cast<uint32_t>(
                             _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(words, want)))) &
                         ((((1u << upto) - 1) >> (4 * q)) & 0xF);
        for (; match; match &= match - 1) {
          if (khi[s + 4 * q + __builtin_ctz(match)] == hi) {
            at = 4 * q + __builtin_ctz(match);
            *slot = static_cast<int32_t>(s + at);
            break;
          }
        }
      }
      if (reuse != nullptr && *reuse < 0) {
        const __m128i ev = _mm_set1_epi8(static_cast<char>(kEvicted));
        const uint32_t tomb = static_cast<uint32_t>(_mm_movemask_epi8(
                                  _mm_cmpeq_epi8(_mm_and_si128(f, ev), ev))) & ((1u << at) - 1);
        if (tomb) *reuse = static_cast<int32_t>(d + __builtin_ctz(tomb));
      }
      if (at < 16) return d + at;
      d += 16;
      continue;
    }
#endif
    const uint8_t f = fl[s];
    if (f == 0) return d;  // empty: the key is absent
    if (klo[s] == lo && khi[s] == hi) {
      *slot = static_cast<int32_t>(s);
      return d;
    }
    if ((f & kEvicted) && reuse != nullptr && *reuse < 0) *reuse = static_cast<int32_t>(d);
    ++d;
  }
  return d;
}

// The live slot of key (lo, hi) walking from `home` (-1: absent, or a tombstone holds it).
inline int32_t live_slot(const uint32_t* klo, const uint32_t* khi, const uint8_t* fl,
                         int64_t size, int64_t limit, int64_t home, uint32_t lo, uint32_t hi) {
  int32_t s;
  walk_key(klo, khi, fl, size, limit, home, lo, hi, &s);
  return s >= 0 && !(fl[s] & kEvicted) ? s : -1;
}

// A batch's keys, bucketed by the region of the table their home slot falls in.
struct HomeEntry {
  uint32_t lo, hi, home, index;
};

// Calls visit(entry) for every key of the batch (lo, hi: [n]) in the order of its home
// slot in a table of `size` slots (slot_bytes each in the arrays the walks read), and
// ahead(entry) kAhead keys before; the keys are split among XLA's intra-op threads. The
// table's key and flag lines (klo, khi, fl) are prefetched ahead. So a batch's walks read
// the table nearly in address order, each line once for the several keys it serves,
// instead of three random lines a key.
//
// How: (1) each part (a stretch of the batch) hashes its keys (eight at a time) and puts
// them in its bucket of their home region (regions of about 128 KB of table, at most
// 1024: each bucket a write stream); (2) each thread takes a run of whole regions (each
// table line is read by one thread), puts each region's keys in the order of their home's
// cache line (a counting sort in cache) and visits them. Buckets have room for an even
// share of the batch plus eight standard deviations, so one pass places hashed keys; keys
// that crowd a region (repeats of a key, say) overflow it, and the buckets are then
// counted and laid end to end. O(batch) scratch. Throws std::bad_alloc.
// Worth it where a key writes little: find_rows writes one slot, at a random place. Find
// (HashFind) writes four outputs a key and walks in input order: visiting in home order
// made it 1.3-1.4x slower (measured, 1M keys, empty and half-full 2M-slot tables).
template <typename Ahead, typename Visit>
void walk_in_home_order(ffi::ThreadPool& pool, const uint32_t* klo, const uint32_t* khi,
                        const uint8_t* fl, int64_t size, int64_t slot_bytes, const uint32_t* ql,
                        const uint32_t* qh, int64_t n, const Ahead& ahead, const Visit& visit) {
  const int64_t region_slots = std::max<int64_t>(256, (int64_t{1} << 17) / slot_bytes);
  int shift = 0;
  while ((int64_t{1} << shift) < region_slots || ((size - 1) >> shift) >= 1024 ||
         (((size - 1) >> shift) + 1) * 64 > n + 64)
    if (++shift >= 31) break;
  const int64_t regions = ((size - 1) >> shift) + 1;
  auto region = [&](uint32_t h) { return static_cast<int64_t>(h >> shift); };
  const int64_t parts = parts_for(pool, n, kGrain);
  auto key_range = [&](int64_t p) { return std::make_pair(n * p / parts, n * (p + 1) / parts); };
  const int64_t buckets = parts * regions;  // bucket p * regions + r: part p's keys of region r
  std::vector<int64_t> start(buckets), room(buckets), filled(buckets);
  // fn(i, home) for each key i of part p in order, hashed 256 at a time; stops when fn
  // returns false
  auto each_home = [&](int64_t p, auto&& fn) {
    uint32_t homes[256];
    for (auto [i, end] = key_range(p); i < end; i += 256) {
      const int64_t m = std::min<int64_t>(256, end - i);
      home_slots(ql + i, qh + i, m, static_cast<uint32_t>(size), homes);
      for (int64_t j = 0; j < m; ++j)
        if (!fn(i + j, homes[j])) return;
    }
  };
  // Fills every bucket from its start, up to its room; false if some bucket ran out.
  auto fill_buckets = [&](HomeEntry* to) {
    std::vector<char> full(parts, 0);
    run_parts(pool, parts, [&](int64_t p) {
      int64_t* count = filled.data() + p * regions;
      const int64_t* at = start.data() + p * regions;
      const int64_t* cap = room.data() + p * regions;
      std::fill(count, count + regions, 0);
      each_home(p, [&](int64_t i, uint32_t home) {
        const int64_t r = region(home);
        if (count[r] == cap[r]) {
          full[p] = 1;
          return false;
        }
        to[at[r] + count[r]++] = HomeEntry{ql[i], qh[i], home, static_cast<uint32_t>(i)};
        return true;
      });
    });
    return std::find(full.begin(), full.end(), 1) == full.end();
  };
  const int64_t share = (n / parts + regions - 1) / regions;
  const int64_t cap = share + 8 * static_cast<int64_t>(std::sqrt(static_cast<double>(share))) + 16;
  std::unique_ptr<Scratch<HomeEntry>> bucketed(new Scratch<HomeEntry>(buckets * cap));
  for (int64_t b = 0; b < buckets; ++b) start[b] = b * cap, room[b] = cap;
  if (!fill_buckets(bucketed->get())) {
    run_parts(pool, parts, [&](int64_t p) {  // the room each bucket needs: its count
      int64_t* count = room.data() + p * regions;
      std::fill(count, count + regions, 0);
      each_home(p, [&](int64_t, uint32_t home) {
        ++count[region(home)];
        return true;
      });
    });
    for (int64_t b = 0, sum = 0; b < buckets; ++b) start[b] = sum, sum += room[b];
    bucketed.reset();
    bucketed.reset(new Scratch<HomeEntry>(n));
    fill_buckets(bucketed->get());
  }
  const HomeEntry* entries = bucketed->get();
  std::vector<int64_t> region_start(regions + 1, 0);  // keys of regions before r, all parts
  for (int64_t r = 0; r < regions; ++r) {
    region_start[r + 1] = region_start[r];
    for (int64_t p = 0; p < parts; ++p) region_start[r + 1] += filled[p * regions + r];
  }
  run_parts(pool, parts, [&](int64_t p) {
    // whole regions: from the region holding key n p / parts (in region order) on
    auto first_of = [&](int64_t part) {
      return std::lower_bound(region_start.begin(), region_start.end(), n * part / parts) -
             region_start.begin();
    };
    const int64_t last = p + 1 == parts ? regions : first_of(p + 1);
    const int64_t lines = std::max<int64_t>((int64_t{1} << shift) / 16, 1);
    std::vector<HomeEntry> local;
    std::vector<uint32_t> at_line(lines + 1);
    for (int64_t r = first_of(p); r < last; ++r) {
      const int64_t count = region_start[r + 1] - region_start[r];
      if (count == 0) continue;
      local.resize(count);
      std::fill(at_line.begin(), at_line.end(), 0);
      const int64_t base = r << shift;
      auto line = [&](const HomeEntry& e) { return (e.home - base) >> 4; };
      for (int64_t q = 0; q < parts; ++q) {
        const HomeEntry* from = entries + start[q * regions + r];
        for (int64_t k = 0; k < filled[q * regions + r]; ++k) ++at_line[line(from[k]) + 1];
      }
      for (int64_t l = 0; l < lines; ++l) at_line[l + 1] += at_line[l];
      for (int64_t q = 0; q < parts; ++q) {
        const HomeEntry* from = entries + start[q * regions + r];
        for (int64_t k = 0; k < filled[q * regions + r]; ++k) local[at_line[line(from[k])]++] = from[k];
      }
      for (int64_t k = 0; k < count; ++k) {
        if (k + kAhead < count) {
          const HomeEntry& next = local[k + kAhead];
          prefetch(fl + next.home);
          prefetch(klo + next.home);
          prefetch(khi + next.home);
          ahead(next);
        }
        visit(local[k]);
      }
    }
  });
}

ffi::Error HashFind(ffi::Buffer<ffi::U32> key_lo, ffi::Buffer<ffi::U32> key_hi,
                    ffi::Buffer<ffi::U8> flags, ffi::Buffer<ffi::U32> lo, ffi::Buffer<ffi::U32> hi,
                    ffi::Buffer<ffi::PRED> active, ffi::Result<ffi::Buffer<ffi::S32>> slot,
                    ffi::Result<ffi::Buffer<ffi::S32>> dist,
                    ffi::Result<ffi::Buffer<ffi::U8>> found_flags,
                    ffi::Result<ffi::Buffer<ffi::S32>> reuse, int64_t limit,
                    ffi::ThreadPool pool) {
  const int64_t size = flags.element_count(), n = lo.element_count();
  limit = std::min(limit, size);
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
  for (auto* result : {slot->untyped_data(), dist->untyped_data(), reuse->untyped_data()})
    advise_huge_pages(result, n * sizeof(int32_t));
  const ModBy mod(static_cast<uint32_t>(size));
  // Each key's walk is its own: the keys are split among XLA's intra-op threads.
  auto walk = [&](int64_t begin, int64_t end) {
    uint32_t ring[kAhead];  // homes of the next kAhead keys, their lines requested early
    auto ask = [&](int64_t j) {
      const uint32_t h = mod(murmur(ql[j], qh[j]));
      ring[j % kAhead] = h;
      prefetch(fl + h);
      prefetch(klo + h);
      prefetch(khi + h);
    };
    for (int64_t j = begin; j < std::min<int64_t>(begin + kAhead, end); ++j) ask(j);
    for (int64_t i = begin; i < end; ++i) {
      const int64_t home = ring[i % kAhead];
      if (i + kAhead < end) ask(i + kAhead);
      int32_t s_out = -1, d_out = 0, r_out = -1;
      uint8_t f_out = 0;
      if (on[i]) {
        d_out = static_cast<int32_t>(
            walk_key(klo, khi, fl, size, limit, home, ql[i], qh[i], &s_out, &r_out));
        if (s_out >= 0) f_out = fl[s_out];
      }
      if (r_out < 0) r_out = static_cast<int32_t>(size);
      out_slot[i] = s_out;
      out_dist[i] = d_out;
      out_flags[i] = f_out;
      out_reuse[i] = r_out;
    }
  };
  parallel_for(pool, n, kGrain, walk);
  return ffi::Error::Success();
}

// Keys of one value hash alike, so they fall in one part (by the hash's top bits): each
// part finds its keys' first occurrences on its own thread, walking its pending indices in
// ascending order through its own open-addressing table.
ffi::Error HashFirst(ffi::Buffer<ffi::U32> lo, ffi::Buffer<ffi::U32> hi,
                     ffi::Buffer<ffi::PRED> pending, ffi::Result<ffi::Buffer<ffi::S32>> first,
                     ffi::ThreadPool pool) {
  const int64_t n = lo.element_count();
  if (hi.element_count() != n || pending.element_count() != n || first->element_count() != n)
    return bad("HashFirst: key arrays [N] expected");
  const uint32_t* ql = lo.typed_data();
  const uint32_t* qh = hi.typed_data();
  const bool* on = pending.typed_data();
  int32_t* out = first->typed_data();
  advise_huge_pages(out, first->size_bytes());
  return guarded("HashFirst", [&] {
    Scratch<uint32_t> hashes(n);
    parallel_for(pool, n, kGrain, [&](int64_t begin, int64_t end) {
      home_slots(ql + begin, qh + begin, end - begin, 0, hashes.get() + begin);
      for (int64_t i = begin; i < end; ++i) out[i] = static_cast<int32_t>(i);
    });
    const int64_t parts = parts_for(pool, n, kGrain);
    const auto part_of = [&](uint32_t h) { return static_cast<int64_t>((uint64_t{h} * parts) >> 32); };
    std::vector<int64_t> start(parts + 1, 0);
    for (int64_t i = 0; i < n; ++i) start[part_of(hashes.get()[i]) + 1] += on[i];
    for (int64_t p = 0; p < parts; ++p) start[p + 1] += start[p];
    Scratch<int32_t> order(start[parts]);  // the pending indices by part, ascending in each
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i)
      if (on[i]) order.get()[next[part_of(hashes.get()[i])]++] = static_cast<int32_t>(i);
    run_parts(pool, parts, [&](int64_t p) {
      const int32_t* idx = order.get() + start[p];
      const int64_t m = start[p + 1] - start[p];
      int64_t cap = 16;
      while (cap < 2 * m) cap <<= 1;
      Scratch<int32_t> seen(cap);  // open addressing over batch indices; -1: free
      int32_t* tab = seen.get();
      std::fill(tab, tab + cap, -1);
      const uint64_t mask = static_cast<uint64_t>(cap - 1);
      for (int64_t k = 0; k < m; ++k) {
        if (k + kAhead < m) prefetch(tab + (hashes.get()[idx[k + kAhead]] & mask));
        const int32_t i = idx[k];
        const uint32_t a = ql[i], b = qh[i];
        for (uint64_t q = hashes.get()[i] & mask;; q = (q + 1) & mask) {
          const int32_t j = tab[q];
          if (j < 0) {
            tab[q] = i;
            break;
          }
          if (ql[j] == a && qh[j] == b) {
            out[i] = j;
            break;
          }
        }
      }
    });
    return ffi::Error::Success();
  });
}

ffi::Error HashPlace(ffi::Buffer<ffi::U8> flags_in, ffi::Buffer<ffi::S32> home,
                     ffi::Buffer<ffi::S32> start, ffi::Buffer<ffi::PRED> pending,
                     ffi::Buffer<ffi::S32> own, ffi::Result<ffi::Buffer<ffi::S32>> slot_of,
                     ffi::Result<ffi::Buffer<ffi::U8>> flags, int64_t limit) {
  const int64_t size = flags->element_count(), n = home.element_count();
  limit = std::min(limit, size);
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
  advise_huge_pages(out, slot_of->size_bytes());
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
    for (int64_t d = st[i]; d < limit; ++d) {
      const int64_t s = wrap(int64_t{hm[i]} + d, size);
      if (claim(s)) {
        out[i] = static_cast<int32_t>(s);
        break;
      }
    }
  }
  return ffi::Error::Success();
}

// out[i] = the row of slots[i] (values: [count, dim]), fill where the slot is outside
// [0, count), for i in [0, n): split among XLA's threads, written in sequence, each row
// read kRowsAhead rows ahead (a dense gather's pattern: one random line a row).
void copy_rows(ffi::ThreadPool& pool, const float* v, int64_t count, int64_t dim,
               const int32_t* slots, int64_t n, float fill, float* out) {
  advise_huge_pages(out, n * dim * sizeof(float));
  parallel_for(pool, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kRowsAhead < end && slots[i + kRowsAhead] >= 0 && slots[i + kRowsAhead] < count)
        prefetch_once(v + int64_t{slots[i + kRowsAhead]} * dim);
      const int32_t at = slots[i];
      float* row = out + i * dim;
      if (at >= 0 && at < count) {
        const float* from = v + int64_t{at} * dim;
        for (int64_t c = 0; c < dim; ++c) row[c] = from[c];  // short rows: no memcpy call
      } else {
        std::fill(row, row + dim, fill);
      }
    }
  });
}

ffi::Error HashRows(ffi::Buffer<ffi::F32> values, ffi::Buffer<ffi::S32> slots,
                    ffi::Result<ffi::Buffer<ffi::F32>> rows, float f, ffi::ThreadPool pool) {
  auto vd = values.dimensions();
  if (vd.size() != 2 || rows->element_count() != slots.element_count() * vd[1])
    return bad("HashRows: values [rows, dim], slots [N], rows [N, dim] expected");
  copy_rows(pool, values.typed_data(), vd[0], vd[1], slots.typed_data(), slots.element_count(),
            f, rows->typed_data());
  return ffi::Error::Success();
}

// find_slots + gather in one call: the live slot of each key (-1: absent or a tombstone)
// and its row (fill where -1). Keys are walked in the order of their home slots (bucketed
// by home region, O(batch) scratch, then by cache line within a region), so the table's
// key and flag lines are read in address order, each once for the several keys it
// serves, instead of three random cache lines per key; then the rows are copied in input
// order, as a dense gather does (one random line read per key, prefetched ahead).
// Measured on 1M keys in 2M slots, 2 threads, by pass: buckets 3.3-4.1 ms (the homes and
// sort passes it replaced took 4.2-4.6 in the same process), walks 4.2-6, rows 6.2-10
// (jnp.take of as many rows: 9-15 ms when its output's pages are not fresh). Each pass
// is near this machine's memory bandwidth (2 threads: 18 GB/s read, 9 GB/s copied).
ffi::Error HashFindRows(ffi::Buffer<ffi::U32> key_lo, ffi::Buffer<ffi::U32> key_hi,
                        ffi::Buffer<ffi::U8> flags, ffi::Buffer<ffi::F32> values,
                        ffi::Buffer<ffi::U32> lo, ffi::Buffer<ffi::U32> hi,
                        ffi::Result<ffi::Buffer<ffi::S32>> slot,
                        ffi::Result<ffi::Buffer<ffi::F32>> rows, float fill, int64_t limit,
                        ffi::ThreadPool pool) {
  const int64_t size = flags.element_count(), n = lo.element_count();
  limit = std::min(limit, size);
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
  int32_t* out_slot = slot->typed_data();
  float* out = rows->typed_data();
  advise_huge_pages(out_slot, slot->size_bytes());
  return guarded("HashFindRows", [&] {
    // the live slots, keys in home order (regions sized for the table with its rows)
    walk_in_home_order(
        pool, klo, khi, fl, size, 4 * dim + 9, lo.typed_data(), hi.typed_data(), n,
        [&](const HomeEntry& e) { prefetch_for_write(out_slot + e.index); },  // a random line
        [&](const HomeEntry& e) { out_slot[e.index] = live_slot(klo, khi, fl, size, limit, e.home, e.lo, e.hi); });
    copy_rows(pool, v, size, dim, out_slot, n, fill, out);  // the rows, in input order
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
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Attr<int64_t>("limit")
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsHashFirst, jaxops::HashFirst,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsHashPlace, jaxops::HashPlace,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U8>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::PRED>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::U8>>()
                                  .Attr<int64_t>("limit"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsHashRows, jaxops::HashRows,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Attr<float>("fill")
                                  .Ctx<xla::ffi::ThreadPool>());

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
                                  .Attr<float>("fill")
                                  .Attr<int64_t>("limit")
                                  .Ctx<xla::ffi::ThreadPool>());
