// Greedy non-maximum suppression (ONNX NonMaxSuppression, torchvision batched_nms), decided
// bit for bit as the xla kernels of jaxops/ops/nms.py decide it:
//
// - candidates: scores that are not NaN and, with a threshold, strictly greater than it,
//   decided on ordered_bits (score_candidates / float_bits.greater): a subnormal score is
//   above a zero one and a zero threshold, -0.0 == +0.0, NaN never passes;
// - priority: decreasing ordered_bits of the score, ties (+0.0 and -0.0 alike) to the lower
//   box index; the high-performance ranking of float32 scores compares the keys with their
//   low ceil(log2 N) bits cleared (see priority_order in jaxops/ops/nms/tiled.py);
// - a candidate is kept unless a kept box (of its group) has inter / union > threshold,
//   computed in the score's float type with jnp's NaN-propagating min / max, under XLA's
//   float mode (XlaFloatMode): the xla kernels compute the IoU in floats under FTZ / DAZ;
// - at most `limit` boxes are kept per problem (early stop).
//
// Candidates are ranked a block at a time (see greedy), so an early stop never sorts the
// boxes it does not reach, and a box is decoded only when its candidate is reached.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.h"

namespace jaxops {
namespace {

// One decoded box: decode_boxes of jaxops/ops/iou.py (centre boxes, then each axis' edges
// in order) and its area. Decoded only when its candidate is reached, as ONNX Runtime does.
template <typename F>
struct Box {
  F lo0, lo1, hi0, hi1, area;

  static Box decode(const F* b, bool center, bool reorder) {
    F p0 = b[0], p1 = b[1], q0 = b[2], q1 = b[3];
    if (center) {
      const F h0 = q0 / F(2), h1 = q1 / F(2);
      const F c0 = p0, c1 = p1;
      p0 = c0 - h0, p1 = c1 - h1, q0 = c0 + h0, q1 = c1 + h1;
    }
    if (reorder) {
      const F a0 = nan_min(p0, q0), b0 = nan_max(p0, q0);
      const F a1 = nan_min(p1, q1), b1 = nan_max(p1, q1);
      p0 = a0, q0 = b0, p1 = a1, q1 = b1;
    }
    return {p0, p1, q0, q1, (q0 - p0) * (q1 - p1)};
  }
};

struct Candidate {
  uint64_t key;  // increasing = decreasing priority
  int64_t index;
  bool operator<(const Candidate& o) const {
    return key != o.key ? key < o.key : index < o.index;
  }
};

// A candidate: float32 keys and the index share one 64-bit word (one compare, half the
// memory of a Candidate); float64 keys need a Candidate.
template <typename F>
struct Item {
  using T = Candidate;
  static T make(uint64_t key, int64_t i) { return {key, i}; }
  static int64_t index(const T& t) { return t.index; }
};
template <>
struct Item<float> {
  using T = uint64_t;
  static T make(uint64_t key, int64_t i) { return key << 32 | static_cast<uint64_t>(i); }
  static int64_t index(T t) { return static_cast<int64_t>(t & 0xffffffffull); }
};

// Scratch space of one problem, reused across the problems of a call.
template <typename F>
struct Workspace {
  using Key = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;  // see candidate_keys
  std::vector<Key> keys, sample;             // every score's key; a sample of them, sorted
  std::vector<typename Item<F>::T> block;    // the candidates being visited
  std::vector<F> k0, k1, k2, k3, ka;  // the kept boxes, contiguous for the inner loop
  std::vector<int32_t> kg;
  std::vector<int64_t> kept;

  // Kept between the calls of a thread (no allocation in the steady state), unless large.
  static Workspace& of_thread() {
    thread_local Workspace ws;
    return ws;
  }
  void release_if_large() {
    if (keys.capacity() > (size_t{1} << 16)) *this = Workspace();
  }
};

// Whether any kept box (j < m) suppresses the candidate; no early exit, so the loop
// vectorises (kept boxes are few: at most the per-class limit). jnp.minimum(a, b) is
// `b < a ? b : a` whenever b is not NaN (a NaN a is returned as it is), and
// jnp.maximum(d, 0) is always `0 > d ? 0 : d`; so when the candidate's edges (the b's) are
// not NaN (kCandidateNaN false), the plain selects decide exactly as jnp does, in fewer
// instructions.
template <typename F, bool kGrouped, bool kCandidateNaN>
inline bool any_suppresses(const F* k0, const F* k1, const F* k2, const F* k3, const F* ka,
                           const int32_t* kg, size_t m, F lo0, F lo1, F hi0, F hi1, F a,
                           int32_t g, F iou_t) {
  const auto lo = [](F x, F y) { return kCandidateNaN ? nan_min(x, y) : (y < x ? y : x); };
  const auto hi = [](F x, F y) { return kCandidateNaN ? nan_max(x, y) : (y > x ? y : x); };
  int hit = 0;
  for (size_t j = 0; j < m; ++j) {
    const F d0 = lo(k2[j], hi0) - hi(k0[j], lo0);
    const F d1 = lo(k3[j], hi1) - hi(k1[j], lo1);
    const F inter = (F(0) > d0 ? F(0) : d0) * (F(0) > d1 ? F(0) : d1);
    const bool s = inter / (ka[j] + a - inter) > iou_t;
    hit |= kGrouped ? (s & (kg[j] == g)) : s;
  }
  return hit != 0;
}

// The priority key of a score from its ordered_bits (see the file comment): ~ordered_bits
// in the score's width, increasing = decreasing score, as priority_order sorts.
template <typename F>
inline uint64_t priority_key(uint64_t ordered, uint64_t cleared_bits) {
  const uint64_t width_mask = sizeof(F) == 4 ? 0xffffffffull : ~0ull;
  return (~ordered & width_mask) & ~cleared_bits;
}

// Keeps candidate box c unless a kept box (of its group) suppresses it.
template <typename F>
void visit(const F* boxes, bool center, bool reorder, const int32_t* groups, int64_t c, F iou_t,
           Workspace<F>& ws) {
  const Box<F> x = Box<F>::decode(boxes + 4 * c, center, reorder);
  const bool nan = (x.lo0 != x.lo0) | (x.lo1 != x.lo1) | (x.hi0 != x.hi0) | (x.hi1 != x.hi1);
  const auto suppresses = [&](auto grouped, auto candidate_nan) {
    return any_suppresses<F, decltype(grouped)::value, decltype(candidate_nan)::value>(
        ws.k0.data(), ws.k1.data(), ws.k2.data(), ws.k3.data(), ws.ka.data(), ws.kg.data(),
        ws.k0.size(), x.lo0, x.lo1, x.hi0, x.hi1, x.area, groups ? groups[c] : 0, iou_t);
  };
  using Yes = std::true_type;
  using No = std::false_type;
  const bool suppressed = groups == nullptr ? (nan ? suppresses(No{}, Yes{}) : suppresses(No{}, No{}))
                                            : (nan ? suppresses(Yes{}, Yes{}) : suppresses(Yes{}, No{}));
  if (suppressed) return;
  ws.kept.push_back(c);
  ws.k0.push_back(x.lo0), ws.k1.push_back(x.lo1), ws.k2.push_back(x.hi0);
  ws.k3.push_back(x.hi1), ws.ka.push_back(x.area);
  if (groups != nullptr) ws.kg.push_back(groups[c]);
}

// The priority key of each score (see priority_key) in the score's width, or none (all
// bits set, above every real key: the largest is +inf's, ~ordered_bits(+inf) in the width)
// when the score is NaN or, with a threshold, not strictly above it. Real keys are also
// never 0 (that is a NaN's). `st_key`: ordered_bits of the score threshold, rounded to F by
// the caller as float_bits.greater rounds it. One branch-free pass (it vectorises).
template <typename F, typename U = typename Workspace<F>::Key>
void candidate_keys(const F* scores, int64_t n, bool has_st, uint64_t st_key,
                    uint64_t cleared_bits, U* keys) {
  static_assert(sizeof(F) == sizeof(U), "a key has the score's width");
  using S = std::make_signed_t<U>;
  constexpr U sign = U{1} << (8 * sizeof(U) - 1), none = ~U{0};
  const U inf = sizeof(F) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
  const U st = static_cast<U>(st_key), cleared = static_cast<U>(cleared_bits);
  for (int64_t i = 0; i < n; ++i) {  // ordered_bits_of, written as selects and masks
    U u;
    std::memcpy(&u, scores + i, sizeof(U));
    const U mag = u & ~sign;
    const U z = mag == 0 ? U{0} : u;                                // -0.0 -> +0.0
    const U ordered = z ^ (static_cast<U>(static_cast<S>(z) >> (8 * sizeof(U) - 1)) | sign);
    const bool ok = (mag <= inf) & (!has_st | (ordered > st));     // NaN: no candidate
    keys[i] = ok ? U(~ordered & ~cleared) : none;
  }
}

// One problem: indices of the kept boxes (into ws.kept), best first. Box i is at
// boxes[4 * i]; `groups` (optional): a box only suppresses boxes of its own group.
//
// The candidates are ranked a block at a time, so that an early stop orders only about
// `limit` of them: the keys of a fixed sample of the scores give a key bound `hi` above
// about `want` candidates; one pass over the keys gathers the candidates with keys in
// (lo, hi], which are sorted and visited; only when they run out before `limit` boxes are
// kept does the next block (lo = hi, four times as many) follow. The blocks partition the
// candidates by key, so they are visited exactly in priority order.
template <typename F>
void greedy(const F* boxes, bool center, bool reorder, const F* scores, const int32_t* groups,
            int64_t n, int64_t limit, F iou_t, bool has_st, uint64_t st_key,
            uint64_t cleared_bits, Workspace<F>& ws) {
  using I = Item<F>;
  using U = typename Workspace<F>::Key;
  ws.kept.clear();
  for (auto* v : {&ws.k0, &ws.k1, &ws.k2, &ws.k3, &ws.ka}) v->clear();
  ws.kg.clear();
  if (limit <= 0 || n == 0) return;
  ws.keys.resize(n);
  const U* keys = ws.keys.data();
  candidate_keys<F>(scores, n, has_st, st_key, cleared_bits, ws.keys.data());
  const int64_t samples = std::min<int64_t>(n, 256);  // 256: positions j * n / 256
  auto& sample = ws.sample;
  sample.resize(samples);
  for (int64_t j = 0; j < samples; ++j) sample[j] = keys[samples == n ? j : (j * n) >> 8];
  std::sort(sample.begin(), sample.end());
  constexpr U kLast = ~U{0} - 1;  // a bound at or above every real key
  auto& block = ws.block;
  U lo = 0;  // below every real key
  for (int64_t want = std::max<int64_t>(limit + limit / 2, 32);
       static_cast<int64_t>(ws.kept.size()) < limit && lo != kLast; want *= 4) {
    const int64_t rank = want * samples / n + want * samples / (4 * n) + 2;  // 1.25x, +2
    U hi = rank < samples ? std::min(sample[rank], kLast) : kLast;
    if (hi <= lo) hi = kLast;
    block.clear();
    const U span = hi - lo;  // k in (lo, hi] <=> k - lo - 1 < span (unsigned)
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {  // a vectorised test of 8 keys skips most of them
      bool any = false;
      for (int j = 0; j < 8; ++j) any |= U(keys[i + j] - lo - 1) < span;
      if (!any) continue;
      for (int64_t j = i; j < i + 8; ++j)
        if (U(keys[j] - lo - 1) < span) block.push_back(I::make(keys[j], j));
    }
    for (; i < n; ++i)
      if (U(keys[i] - lo - 1) < span) block.push_back(I::make(keys[i], i));
    std::sort(block.begin(), block.end());
    lo = hi;
    for (const auto& item : block) {
      if (static_cast<int64_t>(ws.kept.size()) >= limit) break;
      visit(boxes, center, reorder, groups, I::index(item), iou_t, ws);
    }
  }
}

// The bits the high-performance ranking ignores (float32, up to 2**15 boxes), else none.
template <typename F>
uint64_t cleared_bits(int64_t n, bool exact) {
  if (exact || sizeof(F) != 4 || n > (int64_t{1} << 15)) return 0;
  int bits = 1;
  while ((int64_t{1} << bits) < n) ++bits;  // max(1, (n - 1).bit_length())
  return (uint64_t{1} << bits) - 1;
}

struct Row { int64_t batch, cls, box; };

// Limits rows (problem-major) to the `capacity` best scores when there are more, ties
// (+0.0 and -0.0 alike) to the earlier row, keeping their order (_keep_top_scoring of the
// xla kernel: lax.top_k of the scores' ordered_bits).
template <typename F>
void keep_top_scoring(std::vector<Row>& rows, const std::vector<F>& row_scores, int64_t capacity) {
  if (static_cast<int64_t>(rows.size()) <= capacity) return;
  std::vector<std::pair<uint64_t, int64_t>> order(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    order[r] = {priority_key<F>(ordered_bits(row_scores[r]), 0), static_cast<int64_t>(r)};
  std::nth_element(order.begin(), order.begin() + capacity, order.end());
  order.resize(capacity);
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  std::vector<Row> best;
  best.reserve(capacity);
  for (const auto& o : order) best.push_back(rows[o.second]);
  rows.swap(best);
}

template <typename F, typename Idx>
ffi::Error onnx_nms(const F* boxes, const F* scores, Idx* out, int32_t* total, int64_t batch,
                    int64_t B, int64_t C, int64_t N, int64_t capacity, int64_t limit, F iou_t,
                    bool has_st, uint64_t st_key, bool center, bool exact) {
  Workspace<F>& ws = Workspace<F>::of_thread();
  std::vector<Row> rows;
  std::vector<F> row_scores;
  const uint64_t cleared = cleared_bits<F>(N, exact);
  for (int64_t v = 0; v < batch; ++v) {
    rows.clear();
    row_scores.clear();
    for (int64_t b = 0; b < B; ++b) {
      const F* bb = boxes + (v * B + b) * N * 4;
      for (int64_t c = 0; c < C; ++c) {
        const F* s = scores + ((v * B + b) * C + c) * N;
        greedy<F>(bb, center, !center, s, nullptr, N, limit, iou_t, has_st, st_key, cleared, ws);
        for (int64_t i : ws.kept) rows.push_back({b, c, i}), row_scores.push_back(s[i]);
      }
    }
    total[v] = static_cast<int32_t>(rows.size());
    keep_top_scoring(rows, row_scores, capacity);
    Idx* o = out + v * capacity * 3;
    for (int64_t r = 0; r < capacity; ++r) {
      const bool ok = r < static_cast<int64_t>(rows.size());
      o[3 * r] = ok ? Idx(rows[r].batch) : Idx(-1);
      o[3 * r + 1] = ok ? Idx(rows[r].cls) : Idx(-1);
      o[3 * r + 2] = ok ? Idx(rows[r].box) : Idx(-1);
    }
  }
  ws.release_if_large();
  return ffi::Error::Success();
}

template <typename F, typename Idx>
ffi::Error batched_nms(const F* boxes, const F* scores, const int32_t* groups, Idx* out,
                       int32_t* count, int64_t batch, int64_t N, int64_t capacity, F iou_t,
                       bool has_st, uint64_t st_key, bool exact) {
  Workspace<F>& ws = Workspace<F>::of_thread();
  const std::vector<int64_t>& kept = ws.kept;
  const uint64_t cleared = cleared_bits<F>(N, exact);
  for (int64_t v = 0; v < batch; ++v) {
    greedy<F>(boxes + v * N * 4, false, true, scores + v * N, groups + v * N, N, capacity, iou_t,
              has_st, st_key, cleared, ws);
    Idx* o = out + v * capacity;
    for (int64_t r = 0; r < capacity; ++r)
      o[r] = r < static_cast<int64_t>(kept.size()) ? Idx(kept[r]) : Idx(-1);
    count[v] = static_cast<int32_t>(kept.size());
  }
  ws.release_if_large();
  return ffi::Error::Success();
}

// Dispatches on the float type of the boxes and the index type of the output.
template <typename Fn>
ffi::Error dispatch(ffi::DataType f, ffi::DataType idx, Fn fn) {
  auto with_idx = [&](auto ftag) -> ffi::Error {
    if (idx == ffi::DataType::S32) return fn(ftag, int32_t{});
    if (idx == ffi::DataType::S64) return fn(ftag, int64_t{});
    return bad("NMS: index output must be int32 or int64");
  };
  if (f == ffi::DataType::F32) return with_idx(float{});
  if (f == ffi::DataType::F64) return with_idx(double{});
  return bad("NMS: boxes and scores must be float32 or float64");
}

ffi::Error OnnxNms(ffi::AnyBuffer boxes, ffi::AnyBuffer scores, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::Buffer<ffi::S32>> total, int64_t limit, double iou_threshold,
                   bool has_score_threshold, int64_t score_key, bool center, bool exact) {
  XlaFloatMode mode;
  auto sd = scores.dimensions();
  if (sd.size() < 3 || boxes.element_type() != scores.element_type())
    return bad("NonMaxSuppression: scores must be [..., B, C, N], boxes of the same dtype");
  const int64_t B = sd[sd.size() - 3], C = sd[sd.size() - 2], N = sd[sd.size() - 1];
  const int64_t batch = total->element_count();
  const int64_t capacity = batch ? static_cast<int64_t>(out->element_count()) / (3 * batch) : 0;
  return dispatch(scores.element_type(), out->element_type(), [&](auto f, auto i) {
    using F = decltype(f);
    using Idx = decltype(i);
    return onnx_nms<F, Idx>(static_cast<const F*>(boxes.untyped_data()),
                            static_cast<const F*>(scores.untyped_data()),
                            static_cast<Idx*>(out->untyped_data()), total->typed_data(), batch,
                            B, C, N, capacity, limit, F(iou_threshold), has_score_threshold,
                            static_cast<uint64_t>(score_key), center, exact);
  });
}

ffi::Error BatchedNms(ffi::AnyBuffer boxes, ffi::AnyBuffer scores, ffi::Buffer<ffi::S32> groups,
                      ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::S32>> count,
                      double iou_threshold, bool has_score_threshold, int64_t score_key,
                      bool exact) {
  XlaFloatMode mode;
  auto sd = scores.dimensions();
  if (sd.size() < 1 || boxes.element_type() != scores.element_type())
    return bad("BatchedNMS: scores must be [..., N], boxes of the same dtype");
  const int64_t N = sd[sd.size() - 1], batch = count->element_count();
  const int64_t capacity = batch ? static_cast<int64_t>(out->element_count()) / batch : 0;
  return dispatch(scores.element_type(), out->element_type(), [&](auto f, auto i) {
    using F = decltype(f);
    using Idx = decltype(i);
    return batched_nms<F, Idx>(static_cast<const F*>(boxes.untyped_data()),
                               static_cast<const F*>(scores.untyped_data()), groups.typed_data(),
                               static_cast<Idx*>(out->untyped_data()), count->typed_data(), batch,
                               N, capacity, F(iou_threshold), has_score_threshold,
                               static_cast<uint64_t>(score_key), exact);
  });
}

}  // namespace
}  // namespace jaxops

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsOnnxNms, jaxops::OnnxNms,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Attr<int64_t>("limit")
                                  .Attr<double>("iou_threshold")
                                  .Attr<bool>("has_score_threshold")
                                  .Attr<int64_t>("score_key")
                                  .Attr<bool>("center")
                                  .Attr<bool>("exact"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsBatchedNms, jaxops::BatchedNms,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Attr<double>("iou_threshold")
                                  .Attr<bool>("has_score_threshold")
                                  .Attr<int64_t>("score_key")
                                  .Attr<bool>("exact"));
