// The per-image walk of the native NMS kernels (nms.cc): box decoding and the two overlap
// tests, the candidates in priority order, the greedy walk with its limits, and the images
// run on XLA's threads. What it decides, and why it equals the xla kernels, is in nms.cc.
#ifndef JAXOPS_NATIVE_NMS_WALK_H_
#define JAXOPS_NATIVE_NMS_WALK_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common.h"
#include "parallel.h"
#include "radix_sort.h"

namespace jaxops {
namespace nms {

enum Reorder : int { kNone = 0, kMinMax = 1, kTensorRT = 2 };

// One decoded box: decode_boxes of jaxops/ops/nms/iou.py (centre boxes, then each axis'
// edges in order) and its area.
template <typename F>
struct Box {
  F lo0, lo1, hi0, hi1, area;

  static F trt_area(F lo0, F lo1, F hi0, F hi1) {  // BoxCorner::area
    const F h = hi0 - lo0, w = hi1 - lo1;
    return (h <= F(0)) | (w <= F(0)) ? F(0) : h * w;
  }
  static void trt_reorder(F& lo, F& hi) {  // BoxCorner::reorder: an arithmetic swap
    if (lo > hi) {
      const F d = lo - hi, new_hi = d + hi;
      lo = new_hi - d, hi = new_hi;
    }
  }
  static Box decode(const F* b, bool center, Reorder reorder) {
    F p0 = b[0], p1 = b[1], q0 = b[2], q1 = b[3];
    if (center) {
      const F h0 = q0 / F(2), h1 = q1 / F(2);
      const F c0 = p0, c1 = p1;
      p0 = c0 - h0, p1 = c1 - h1, q0 = c0 + h0, q1 = c1 + h1;
    }
    if (reorder == kTensorRT) {
      trt_reorder(p0, q0), trt_reorder(p1, q1);
      return {p0, p1, q0, q1, trt_area(p0, p1, q0, q1)};
    }
    if (reorder == kMinMax) {
      const F a0 = nan_min(p0, q0), b0 = nan_max(p0, q0);
      const F a1 = nan_min(p1, q1), b1 = nan_max(p1, q1);
      p0 = a0, q0 = b0, p1 = a1, q1 = b1;
    }
    return {p0, p1, q0, q1, (q0 - p0) * (q1 - p1)};
  }
  bool has_nan() const { return (lo0 != lo0) | (lo1 != lo1) | (hi0 != hi0) | (hi1 != hi1); }
};

// The kept boxes of one group, contiguous for the inner loops.
template <typename F>
struct Kept {
  std::vector<F> k0, k1, k2, k3, ka;
  size_t size() const { return k0.size(); }
  void clear() { for (auto* v : {&k0, &k1, &k2, &k3, &ka}) v->clear(); }
  void push(const Box<F>& x) {
    k0.push_back(x.lo0), k1.push_back(x.lo1), k2.push_back(x.hi0), k3.push_back(x.hi1);
    ka.push_back(x.area);
  }
};

// Whether any kept box suppresses the candidate (ONNX / torchvision): no early exit, so the
// loop vectorises. jnp.minimum(a, b) is `b < a ? b : a` whenever b is not NaN (a NaN a is
// returned as it is), and jnp.maximum(d, 0) is always `0 > d ? 0 : d`; so when the
// candidate's edges (the b's) are not NaN (kCandidateNaN false), the plain selects decide
// exactly as jnp does, in fewer instructions.
template <typename F, bool kCandidateNaN>
bool onnx_any(const Kept<F>& k, const Box<F>& x, F t) {
  const auto lo = [](F a, F b) { return kCandidateNaN ? nan_min(a, b) : (b < a ? b : a); };
  const auto hi = [](F a, F b) { return kCandidateNaN ? nan_max(a, b) : (b > a ? b : a); };
  const F *k0 = k.k0.data(), *k1 = k.k1.data(), *k2 = k.k2.data(), *k3 = k.k3.data();
  const F* ka = k.ka.data();
  int hit = 0;
  for (size_t j = 0, m = k.size(); j < m; ++j) {
    const F d0 = lo(k2[j], x.hi0) - hi(k0[j], x.lo0);
    const F d1 = lo(k3[j], x.hi1) - hi(k1[j], x.lo1);
    const F inter = (F(0) > d0 ? F(0) : d0) * (F(0) > d1 ? F(0) : d1);
    hit |= inter / (ka[j] + x.area - inter) > t;
  }
  return hit != 0;
}

// TensorRT's IOU(candidate, kept) >= t (core/tensorrt_boxes.py, operation for operation).
template <typename F>
bool trt_any(const Kept<F>& k, const Box<F>& x, F t) {
  const F *k0 = k.k0.data(), *k1 = k.k1.data(), *k2 = k.k2.data(), *k3 = k.k3.data();
  const F* ka = k.ka.data();
  int hit = 0;
  for (size_t j = 0, m = k.size(); j < m; ++j) {
    const F lo0 = x.lo0 > k0[j] ? x.lo0 : k0[j], lo1 = x.lo1 > k1[j] ? x.lo1 : k1[j];
    const F hi0 = x.hi0 < k2[j] ? x.hi0 : k2[j], hi1 = x.hi1 < k3[j] ? x.hi1 : k3[j];
    const F inter = Box<F>::trt_area(lo0, lo1, hi0, hi1);
    const F uni = x.area + ka[j] - inter;
    const bool zero = (inter <= F(0)) | (uni <= F(0));
    const F iou = zero ? F(0) : inter / (zero ? F(1) : uni);
    hit |= iou >= t;
  }
  return hit != 0;
}

// A candidate in a block: float32 keys and the element share one 64-bit word (one compare,
// half the memory); float64 keys need a pair.
struct Candidate {
  uint64_t key;  // increasing = decreasing priority
  int64_t index;
  bool operator<(const Candidate& o) const {
    return key != o.key ? key < o.key : index < o.index;
  }
};
template <typename F>
struct Item {
  using T = Candidate;
  static T make(uint64_t key, int64_t i) { return {key, i}; }
  static int64_t index(const T& t) { return t.index; }
};
struct Packed {  // a float32 candidate: key << 32 | element
  uint64_t bits;
  bool operator<(Packed o) const { return bits < o.bits; }
};
// The radix key of a packed candidate (radix_sort.h): its key alone. Candidates gathered
// in element order and sorted stably by it are in (key, element) order.
inline uint32_t key_of(Packed p) { return static_cast<uint32_t>(p.bits >> 32); }
template <>
struct Item<float> {
  using T = Packed;
  static T make(uint64_t key, int64_t i) { return {key << 32 | static_cast<uint64_t>(i)}; }
  static int64_t index(T t) { return static_cast<int64_t>(t.bits & 0xffffffffull); }
};

// A float32 block in element order is ordered by a radix sort of its keys (stable: ties
// stay in element order), with no compares to mispredict: wide digits from kRadixFrom
// candidates on (case A's 6,700 an image: 0.17 ms an image with std::sort, ~0.05 with the
// radix sort, one thread), 8-bit digits from kSmallRadixFrom (case B's ~230 an image: its
// median time ratio to ONNX Runtime in one process went from 0.77-0.78 to 0.67-0.69).
constexpr int64_t kRadixFrom = 1024, kSmallRadixFrom = 64;

// Orders block[pos, end) by (key, element); `whole`: the range is the whole block, in
// element order.
template <typename F>
void order_block(std::vector<typename Item<F>::T>& block, std::vector<typename Item<F>::T>& spare,
                 int64_t pos, int64_t end, bool whole) {
  if constexpr (sizeof(F) == 4) {
    if (whole && end - pos >= kSmallRadixFrom) {
      spare.resize(block.size());
      const Packed* sorted = end - pos >= kRadixFrom
          ? radix_sort(block.data(), spare.data(), block.size())
          : radix_sort<SmallRadix>(block.data(), spare.data(), block.size());
      if (sorted != block.data()) block.swap(spare);
      return;
    }
  }
  std::sort(block.begin() + pos, block.begin() + end);
}

// Scratch space of one image, reused across the images a thread runs.
template <typename F>
struct Workspace {
  using Key = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;  // see candidate_key
  std::vector<Key> sample;                   // a sample of the keys, sorted
  std::vector<typename Item<F>::T> block;    // the candidates, ordered as visited
  std::vector<typename Item<F>::T> spare;    // order_block's scratch
  std::vector<Kept<F>> groups;               // kept boxes by (dense) group
  std::unordered_map<int32_t, int32_t> dense;  // group id -> slot (arbitrary ids)
  std::vector<int64_t> kept;                 // kept elements, by priority
  std::vector<int64_t> class_start;          // ONNX rows: where each class's rows go

  static Workspace& of_thread() {
    thread_local Workspace ws;
    return ws;
  }
  void release_if_large() {
    if (block.capacity() > (size_t{1} << 16) || spare.capacity() > (size_t{1} << 16) ||
        groups.size() > (size_t{1} << 12))
      *this = Workspace();
  }
};

// The priority key of a score, ~ordered_bits in the score's width (increasing = decreasing
// score), or none (all bits set, above every real key: the largest is +inf's) when the
// score is NaN or does not pass the threshold. `st`: ordered_bits of the threshold,
// already rounded to F. Written as selects and masks (it vectorises).
template <typename F, typename U>
inline U candidate_key(const F* score, bool has_st, bool inclusive, U st, U cleared) {
  static_assert(sizeof(F) == sizeof(U), "a key has the score's width");
  using S = std::make_signed_t<U>;
  constexpr U sign = U{1} << (8 * sizeof(U) - 1), none = ~U{0};
  const U inf = sizeof(F) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
  U u;
  std::memcpy(&u, score, sizeof(U));
  const U mag = u & ~sign;
  const U z = mag == 0 ? U{0} : u;                                  // -0.0 -> +0.0
  const U ordered = z ^ (static_cast<U>(static_cast<S>(z) >> (8 * sizeof(U) - 1)) | sign);
  const bool pass = inclusive ? ordered >= st : ordered > st;
  const bool ok = (mag <= inf) & (!has_st | pass);                   // NaN: no candidate
  return ok ? U(~ordered & ~cleared) : none;
}

// Whether gather_candidates serves: a threshold at or above +0.0 (strictly above it for
// TensorRT's >=), which a score's bits, read as a signed integer, can be tested against.
template <typename U>
bool prefilters(bool has_st, bool inclusive, uint64_t st_key) {
  constexpr U sign = U{1} << (8 * sizeof(U) - 1);
  return has_st && (inclusive ? U(st_key) > sign : U(st_key) >= sign);
}

// push(j) for every j in [0, n) whose score bits b have b - low - 1 < span (unsigned), in
// order: a mask of 16 lanes at a time, then a push per set lane; most groups of 16 hold
// none. One pass: a pushed score's cache line is still at hand (a first pass finding the
// groups and a second gathering them missed it twice on case A's 2.7 MB an image).
template <typename U, typename Bits, typename Push>
inline void each_passing(const Bits* raw, int64_t n, U low, U span, const Push& push) {
  int64_t at = 0;
  for (; at + 16 <= n; at += 16) {
    uint32_t lanes = 0;
    for (int j = 0; j < 16; ++j) lanes |= uint32_t(U(raw[at + j] - low - 1) < span) << j;
    for (; lanes; lanes &= lanes - 1) push(at + __builtin_ctz(lanes));
  }
  for (; at < n; ++at)
    if (U(raw[at] - low - 1) < span) push(at);
}
using Bits32 [[gnu::may_alias]] = uint32_t;  // float scores read as their bits
using Bits64 [[gnu::may_alias]] = uint64_t;
#if defined(__x86_64__)
// each_passing of float32 bits with AVX2 (chosen at run time): the mask of 16 lanes from
// two compares of 8, as x - low - 1 < span unsigned <=> (x - low - 1) ^ min < span ^ min
// signed (GCC leaves the plain loop's mask scalar: case A 0.49 ms an image against 0.38
// here, B 0.44 against 0.27 ms in all, one thread, measured here).
template <typename Push>
__attribute__((target("avx2"))) void each_passing_avx2(const Bits32* raw, int64_t n,
                                                       uint32_t low, uint32_t span,
                                                       const Push& push) {
  const __m256i base = _mm256_set1_epi32(static_cast<int32_t>(low + 1));
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);
  const __m256i limit = _mm256_set1_epi32(static_cast<int32_t>(span ^ 0x80000000u));
  int64_t at = 0;
  for (; at + 16 <= n; at += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw + at));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(raw + at + 8));
    const __m256i in_a = _mm256_cmpgt_epi32(limit, _mm256_xor_si256(_mm256_sub_epi32(a, base), flip));
    const __m256i in_b = _mm256_cmpgt_epi32(limit, _mm256_xor_si256(_mm256_sub_epi32(b, base), flip));
    uint32_t lanes = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(in_a))) |
                     static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(in_b))) << 8;
    for (; lanes; lanes &= lanes - 1) push(at + __builtin_ctz(lanes));
  }
  each_passing<uint32_t>(raw + at, n - at, low, span, [&](int64_t j) { push(at + j); });
}
#endif
template <typename Push>
void each_passing_of(const Bits32* raw, int64_t n, uint32_t low, uint32_t span,
                     const Push& push) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return each_passing_avx2(raw, n, low, span, push);
#endif
  each_passing<uint32_t>(raw, n, low, span, push);
}
template <typename Push>
void each_passing_of(const Bits64* raw, int64_t n, uint64_t low, uint64_t span,
                     const Push& push) {
  each_passing<uint64_t>(raw, n, low, span, push);
}

// Every candidate of the n scores as a block item (key, element), in element order, for a
// threshold that prefilters (see prefilters): such a threshold passes exactly the scores
// whose bits lie in (the threshold's bits, +inf's], so only those get their keys computed.
template <typename F, typename U = typename Workspace<F>::Key>
void gather_candidates(const F* scores, int64_t n, bool inclusive, uint64_t st_key,
                       uint64_t cleared_bits, std::vector<typename Item<F>::T>& block) {
  using S = std::make_signed_t<U>;
  constexpr U none = ~U{0}, sign = U{1} << (8 * sizeof(U) - 1);
  const U st = static_cast<U>(st_key), cleared = static_cast<U>(cleared_bits);
  const S inf = sizeof(F) == 4 ? S(0x7f800000) : S(0x7ff0000000000000ll);
  // low < bits <= inf (signed) <=> bits - low - 1 < inf - low (unsigned); st & ~sign: the
  // threshold's own bits (a positive float's ordered bits are its bits with the sign set)
  const U low = U(static_cast<S>(st & ~sign) - (inclusive ? 1 : 0)), span = U(inf) - low;
  block.clear();
  const auto push = [&](int64_t j) {
    const U k = candidate_key<F, U>(scores + j, true, inclusive, st, cleared);
    if (k != none) block.push_back(Item<F>::make(k, j));
  };
  if constexpr (sizeof(U) == 4)
    each_passing_of(reinterpret_cast<const Bits32*>(scores), n, low, span, push);
  else
    each_passing_of(reinterpret_cast<const Bits64*>(scores), n, low, span, push);
}

// The bits the high-performance ranking ignores (float32, up to 2**15 boxes), else none.
template <typename F>
uint64_t cleared_bits(int64_t n, bool exact) {
  if (exact || sizeof(F) != 4 || n > (int64_t{1} << 15)) return 0;
  int bits = 1;
  while ((int64_t{1} << bits) < n) ++bits;  // max(1, (n - 1).bit_length())
  return (uint64_t{1} << bits) - 1;
}

// What one image's walk needs to know.
struct Rules {
  bool has_st, inclusive_st;  // a score threshold; TensorRT's `>=`
  uint64_t st_key, cleared;   // the threshold's ordered_bits; high-performance bits
  int64_t capacity;           // candidates walked at most (pre_nms_top_k)
  int64_t per_group, total;   // kept at most per group, per image
  bool center;
  Reorder reorder;
  bool inclusive_iou;         // TensorRT's IoU >= t
};

// One image: ws.kept = the kept elements by priority; returns the candidates that passed.
// box_of(e): the element's 4 coordinates; group_of(e): its group, in [0, groups), or any
// int32 id when `groups` is 0 (then given a slot of ws.groups on first sight).
template <typename F, typename BoxOf, typename GroupOf>
int64_t walk(const F* scores, int64_t m, int64_t groups, const Rules& r, F iou_t, BoxOf box_of,
             GroupOf group_of, Workspace<F>& ws) {
  using I = Item<F>;
  ws.kept.clear();
  if (static_cast<int64_t>(ws.groups.size()) < groups) ws.groups.resize(groups);
  for (int64_t g = 0; g < groups; ++g) ws.groups[g].clear();
  ws.dense.clear();
  if (m == 0) return 0;
  using U = typename Workspace<F>::Key;
  auto& block = ws.block;
  const bool gathered = prefilters<U>(r.has_st, r.inclusive_st, r.st_key);
  Scratch<U> scratch(gathered ? 1 : m);  // every key, when there is no prefilter
  U* const keys = scratch.get();
  int64_t count = 0;
  if (gathered) {
    gather_candidates<F>(scores, m, r.inclusive_st, r.st_key, r.cleared, block);
    count = static_cast<int64_t>(block.size());
  } else {
    for (int64_t i = 0; i < m; ++i) {  // a loop that vectorises
      keys[i] = candidate_key<F, U>(scores + i, r.has_st, r.inclusive_st, U(r.st_key),
                                    U(r.cleared));
      count += keys[i] != ~U{0};
    }
  }
  const int64_t limit = std::min(r.total, r.capacity);
  if (limit <= 0 || r.per_group <= 0 || count == 0) return count;
  int64_t visited = 0;
  const auto visit = [&](int64_t e) {  // false: stop the walk
    ++visited;
    int32_t g = group_of(e);
    if (groups == 0) {  // an arbitrary id: its slot, made on first sight
      const auto [it, fresh] = ws.dense.emplace(g, static_cast<int32_t>(ws.dense.size()));
      g = it->second;
      if (fresh && static_cast<int64_t>(ws.groups.size()) <= g) ws.groups.resize(g + 1);
      if (fresh) ws.groups[g].clear();
    }
    Kept<F>& kept = ws.groups[g];
    if (static_cast<int64_t>(kept.size()) < r.per_group) {
      const Box<F> x = Box<F>::decode(box_of(e), r.center, r.reorder);
      const bool hit = r.inclusive_iou ? trt_any(kept, x, iou_t)
                       : x.has_nan()   ? onnx_any<F, true>(kept, x, iou_t)
                                       : onnx_any<F, false>(kept, x, iou_t);
      if (!hit) kept.push(x), ws.kept.push_back(e);
    }
    return static_cast<int64_t>(ws.kept.size()) < r.total && visited < r.capacity;
  };
  const int64_t first = std::max<int64_t>(limit + limit / 2, 32);
  bool more = true;
  if (gathered) {
    // Every candidate is in the block: ordered a chunk at a time, so that an early stop
    // orders only about what it reaches (the best `chunk` of the rest selected, sorted and
    // visited; only when they run out does the next chunk, four times as many, follow).
    for (int64_t pos = 0, chunk = first; more && pos < count; chunk *= 4) {
      const int64_t end = std::min(count, pos + chunk);
      if (end < count) std::nth_element(block.begin() + pos, block.begin() + end, block.end());
      order_block<F>(block, ws.spare, pos, end, pos == 0 && end == count);
      for (int64_t k = pos; more && k < end; ++k) {
        if (k + 8 < end) __builtin_prefetch(box_of(I::index(block[k + 8])));  // a miss each
        more = visit(I::index(block[k]));
      }
      pos = end;
    }
    return count;
  }
  // Without a prefilter every score has a key: the blocks come from key ranges instead, so
  // an early stop never gathers the candidates it does not reach. The keys of a fixed
  // sample of the scores give a bound `hi` above about `want` candidates; one pass gathers
  // the keys in (lo, hi], which are sorted and visited; only when they run out does the
  // next block (lo = hi, four times as many) follow. The blocks partition the candidates
  // by key, so they are visited exactly in priority order.
  const int64_t samples = count <= first ? 0 : std::min<int64_t>(m, 256);  // j * m / 256
  auto& sample = ws.sample;
  sample.resize(samples);
  for (int64_t j = 0; j < samples; ++j) sample[j] = keys[samples == m ? j : (j * m) >> 8];
  std::sort(sample.begin(), sample.end());
  constexpr U kLast = ~U{0} - 1;  // a bound at or above every real key
  U lo = 0;  // below every real key
  for (int64_t want = first; more && lo != kLast; want *= 4) {
    const int64_t rank = samples ? want * samples / m + want * samples / (4 * m) + 2 : 0;
    U hi = rank < samples ? std::min(sample[rank], kLast) : kLast;  // 1.25x, +2
    if (hi <= lo) hi = kLast;
    block.clear();
    const U span = hi - lo;  // k in (lo, hi] <=> k - lo - 1 < span (unsigned)
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {  // a vectorised test of 8 keys skips most of them
      bool any = false;
      for (int j = 0; j < 8; ++j) any |= U(keys[i + j] - lo - 1) < span;
      if (!any) continue;
      for (int64_t j = i; j < i + 8; ++j)
        if (U(keys[j] - lo - 1) < span) block.push_back(I::make(keys[j], j));
    }
    for (; i < m; ++i)
      if (U(keys[i] - lo - 1) < span) block.push_back(I::make(keys[i], i));
    order_block<F>(block, ws.spare, 0, static_cast<int64_t>(block.size()), true);
    lo = hi;
    for (const auto& item : block)
      if (!(more = visit(I::index(item)))) break;
  }
  return count;
}

// The priority key of a score (candidate_key's key, all bits kept) in 64 bits.
template <typename F>
inline uint64_t priority_key(F score) {
  const uint64_t width_mask = sizeof(F) == 4 ? 0xffffffffull : ~0ull;
  return ~ordered_bits(score) & width_mask;
}

// The threshold operands: one value per vmap example (or one for all). Item i of `count`
// (an image, vmap examples outermost) reads the value of its example.
template <typename F>
struct Thresholds {
  const F* iou;
  const F* score;  // nullptr: no score threshold
  int64_t iou_n, score_n;
  static int64_t at(int64_t i, int64_t count, int64_t n) { return n > 1 ? i / (count / n) : 0; }
  F iou_at(int64_t i, int64_t count) const { return iou[at(i, count, iou_n)]; }
  uint64_t score_key(int64_t i, int64_t count) const {
    return score == nullptr ? 0 : ordered_bits(score[at(i, count, score_n)]);
  }
};

// body(i) for every image i in [0, n), claimed one at a time by the calling thread and at
// most one task per other pool thread (run_parts with `helpers`): a task per image would
// mostly wake threads that find nothing left; and contiguous runs of images would leave the
// caller waiting for a whole run when another process holds the thread that started it,
// where claiming one image at a time waits for one image at most.
//
// Below kParallelScores scores in all the calling thread runs every image: waking a pool
// thread costs more than it saves there. Measured here, in one process beside ONNX Runtime
// on two loaded cores (median ratio to ORT): case B (32 images of 20,000 scores) 0.59-0.67
// on one thread, 0.71-0.75 on two; case A (8 x 672,000) 0.48 on one, 0.51-0.60 on two, but
// 2.4 ms at best against 4.1 when a core is free.
constexpr int64_t kParallelScores = int64_t{1} << 21;

template <typename Body>
void each_image(ffi::ThreadPool& pool, int64_t n, int64_t scores_each, const Body& body) {
  const int64_t helpers = n * scores_each < kParallelScores ? 0 :
      std::min<int64_t>(std::max<int64_t>(pool.num_threads(), 1), n) - 1;
  run_parts(pool, n, body, helpers);
}

}  // namespace nms
}  // namespace jaxops

#endif  // JAXOPS_NATIVE_NMS_WALK_H_
