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
// Candidates are popped from a heap, as ONNX Runtime does, so an early stop never sorts the
// boxes it does not reach.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "common.h"

namespace jaxops {
namespace {

template <typename F>
struct Boxes {
  std::vector<F> lo0, lo1, hi0, hi1, area;

  // decode_boxes of jaxops/ops/iou.py: centre boxes, then each axis' edges in order.
  void decode(const F* b, int64_t n, bool center, bool reorder) {
    for (auto* v : {&lo0, &lo1, &hi0, &hi1, &area}) v->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      F p0 = b[4 * i], p1 = b[4 * i + 1], q0 = b[4 * i + 2], q1 = b[4 * i + 3];
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
      lo0[i] = p0, lo1[i] = p1, hi0[i] = q0, hi1[i] = q1, area[i] = (q0 - p0) * (q1 - p1);
    }
  }
};

struct Candidate {
  uint64_t key;  // increasing = decreasing priority
  int64_t index;
  bool operator>(const Candidate& o) const {
    return key != o.key ? key > o.key : index > o.index;
  }
};

// A heap entry: float32 keys and the index share one 64-bit word (one compare, half the
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
template <typename F>
using Heap = std::vector<typename Item<F>::T>;

// Whether any kept box (j < m) suppresses the candidate; no early exit, so the loop
// vectorises (kept boxes are few: at most the per-class limit).
template <typename F, bool kGrouped>
inline bool any_suppresses(const F* k0, const F* k1, const F* k2, const F* k3, const F* ka,
                           const int32_t* kg, size_t m, F lo0, F lo1, F hi0, F hi1, F a,
                           int32_t g, F iou_t) {
  int hit = 0;
  for (size_t j = 0; j < m; ++j) {
    const F d0 = nan_min(k2[j], hi0) - nan_max(k0[j], lo0);
    const F d1 = nan_min(k3[j], hi1) - nan_max(k1[j], lo1);
    const F inter = nan_max(d0, F(0)) * nan_max(d1, F(0));
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

// One problem: indices of the kept boxes, best first. `groups` (optional): a box only
// suppresses boxes of its own group. `st_key`: ordered_bits of the score threshold, rounded
// to F by the caller as float_bits.greater rounds it.
template <typename F>
void greedy(const Boxes<F>& bx, const F* scores, const int32_t* groups, int64_t n, int64_t limit,
            F iou_t, bool has_st, uint64_t st_key, uint64_t cleared_bits, Heap<F>& heap,
            std::vector<int64_t>& kept) {
  using I = Item<F>;
  using T = typename I::T;
  heap.clear();
  kept.clear();
  if (limit <= 0) return;
  const uint64_t nan_key = sizeof(F) == 4 ? 0xffffffffull : ~0ull;  // every NaN's key
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t k = ordered_bits(scores[i]);
    if (k == nan_key || (has_st && !(k > st_key))) continue;
    heap.push_back(I::make(priority_key<F>(k, cleared_bits), i));
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<T>());
  std::vector<F> k0, k1, k2, k3, ka;  // the kept boxes, contiguous for the inner loop
  std::vector<int32_t> kg;
  while (!heap.empty() && static_cast<int64_t>(kept.size()) < limit) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<T>());
    const int64_t c = I::index(heap.back());
    heap.pop_back();
    const F lo0 = bx.lo0[c], lo1 = bx.lo1[c], hi0 = bx.hi0[c], hi1 = bx.hi1[c], a = bx.area[c];
    const bool suppressed =
        groups == nullptr
            ? any_suppresses<F, false>(k0.data(), k1.data(), k2.data(), k3.data(), ka.data(),
                                       nullptr, k0.size(), lo0, lo1, hi0, hi1, a, 0, iou_t)
            : any_suppresses<F, true>(k0.data(), k1.data(), k2.data(), k3.data(), ka.data(),
                                      kg.data(), k0.size(), lo0, lo1, hi0, hi1, a, groups[c],
                                      iou_t);
    if (suppressed) continue;
    kept.push_back(c);
    k0.push_back(lo0), k1.push_back(lo1), k2.push_back(hi0), k3.push_back(hi1), ka.push_back(a);
    if (groups != nullptr) kg.push_back(groups[c]);
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
  Boxes<F> bx;
  Heap<F> heap;
  std::vector<int64_t> kept;
  std::vector<Row> rows;
  std::vector<F> row_scores;
  const uint64_t cleared = cleared_bits<F>(N, exact);
  for (int64_t v = 0; v < batch; ++v) {
    rows.clear();
    row_scores.clear();
    for (int64_t b = 0; b < B; ++b) {
      bx.decode(boxes + (v * B + b) * N * 4, N, center, !center);
      for (int64_t c = 0; c < C; ++c) {
        const F* s = scores + ((v * B + b) * C + c) * N;
        greedy<F>(bx, s, nullptr, N, limit, iou_t, has_st, st_key, cleared, heap, kept);
        for (int64_t i : kept) rows.push_back({b, c, i}), row_scores.push_back(s[i]);
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
  return ffi::Error::Success();
}

template <typename F, typename Idx>
ffi::Error batched_nms(const F* boxes, const F* scores, const int32_t* groups, Idx* out,
                       int32_t* count, int64_t batch, int64_t N, int64_t capacity, F iou_t,
                       bool has_st, uint64_t st_key, bool exact) {
  Boxes<F> bx;
  Heap<F> heap;
  std::vector<int64_t> kept;
  const uint64_t cleared = cleared_bits<F>(N, exact);
  for (int64_t v = 0; v < batch; ++v) {
    bx.decode(boxes + v * N * 4, N, false, true);
    greedy<F>(bx, scores + v * N, groups + v * N, N, capacity, iou_t, has_st, st_key, cleared,
              heap, kept);
    Idx* o = out + v * capacity;
    for (int64_t r = 0; r < capacity; ++r)
      o[r] = r < static_cast<int64_t>(kept.size()) ? Idx(kept[r]) : Idx(-1);
    count[v] = static_cast<int32_t>(kept.size());
  }
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
