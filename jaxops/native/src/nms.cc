// Greedy non-maximum suppression of the NMS family (ONNX NonMaxSuppression, torchvision
// batched_nms, TensorRT EfficientNMS), decided bit for bit as the xla kernels of
// jaxops/ops/nms/ decide it:
//
// - candidates: scores that are not NaN and, with a threshold, greater than it (strictly,
//   or `>=` for TensorRT), decided on ordered_bits (score_candidates / float_bits.greater):
//   a subnormal score is above a zero one and a zero threshold, -0.0 == +0.0;
// - priority: decreasing ordered_bits of the score, ties (+0.0 and -0.0 alike) to the lower
//   element; the high-performance ranking of float32 scores compares the keys with their
//   low ceil(log2 N) bits cleared (priority_keys in jaxops/ops/nms/candidates.py);
// - the candidate capacity (pre_nms_top_k) keeps the best `capacity` of an image by that
//   priority: walking by priority and stopping after `capacity` candidates is that cut;
// - a candidate is kept unless a kept box of its group suppresses it: ONNX / torchvision
//   `inter / union > t`, with jnp's NaN-propagating min / max, or TensorRT's IoU >= t
//   (core/tensorrt_boxes.py), in the score's float type under XLA's float mode
//   (XlaFloatMode): the xla kernels compute the IoU in floats under FTZ / DAZ;
// - at most `per_group` kept per group and `total` per image, the first by priority.
//
// One image is one walk in priority order over all its groups (a box's fate depends only
// on the higher-scoring boxes of its group, so this equals per-group NMS followed by the
// best `total` overall). The candidates are ranked a block at a time (see walk), so an
// early stop never sorts the candidates it does not reach, and a box is decoded only when
// its candidate is reached. Images run in parallel on XLA's intra-op threads. The walk is
// nms_walk.h; this file is the three operators around it and their FFI handlers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "nms_walk.h"

namespace jaxops {
namespace {

using namespace nms;  // NOLINT: the per-image walk (nms_walk.h)

struct Row { int32_t cls; int64_t box; };

// The -1 padding of an index output: all bits set in every index type, so one memset
// (case B's untuned call pads 192,000 rows: a branch and three stores a row cost 0.1 ms of
// 0.45; non-temporal stores were slower than memset there).
template <typename Idx>
void fill_padding(Idx* from, int64_t count) {
  static_assert(Idx(-1) == Idx(~Idx(0)), "-1 is all bits set");
  if (count > 0) std::memset(from, 0xff, sizeof(Idx) * count);
}

// ONNX NonMaxSuppression over `batch` vmap examples of B images: each image a walk with
// groups = classes, rows by (class, priority); then per example the rows of its images,
// limited to the `capacity` best scores (ties to the earlier row) when more.
template <typename F, typename Idx>
void onnx_nms(ffi::ThreadPool& pool, const F* boxes, const F* scores, const Thresholds<F>& th,
              Idx* out, int32_t* total, int32_t* true_total, int64_t batch, int64_t B, int64_t C,
              int64_t N, int64_t capacity, int64_t per_class, int64_t per_image,
              int64_t pre_nms_top_k, bool has_st, bool center, bool exact) {
  std::vector<std::vector<Row>> rows(batch * B);
  std::vector<int64_t> bound(batch * B);
  const uint64_t cleared = cleared_bits<F>(N, exact);
  each_image(pool, batch * B, C * N, [&](int64_t image) {
    Workspace<F>& ws = Workspace<F>::of_thread();
    const Rules r{has_st, false, th.score_key(image, batch * B), cleared, pre_nms_top_k, per_class, per_image,
                  center, center ? kNone : kMinMax, false};
    const F* bb = boxes + image * N * 4;
    const int64_t count = walk<F>(
        scores + image * C * N, C * N, C, r, th.iou_at(image, batch * B),
        [&](int64_t e) { return bb + 4 * (e % N); },
        [&](int64_t e) { return static_cast<int32_t>(e / N); }, ws);
    auto& mine = rows[image];  // by class, then priority: a counting sort of ws.kept
    auto& start = ws.class_start;
    start.assign(C + 1, 0);
    for (int64_t e : ws.kept) ++start[e / N + 1];
    for (int64_t c = 0; c < C; ++c) start[c + 1] += start[c];
    mine.resize(ws.kept.size());
    for (int64_t e : ws.kept) mine[start[e / N]++] = {static_cast<int32_t>(e / N), e % N};
    const int64_t cut = std::max<int64_t>(count - pre_nms_top_k, 0);
    bound[image] = std::min<int64_t>(static_cast<int64_t>(mine.size()) + cut, per_image);
    // The image's share of its example's output, padded here, where the threads share the
    // work; the rows found are written over it below.
    const int64_t v = image / B, b = image % B, words = capacity * 3;
    fill_padding(out + v * words + words * b / B, words * (b + 1) / B - words * b / B);
    ws.release_if_large();
  });
  for (int64_t v = 0; v < batch; ++v) {
    struct Ref { int64_t b; Row row; };
    std::vector<Ref> all;
    int64_t bounds = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (const Row& row : rows[v * B + b]) all.push_back({b, row});
      bounds += bound[v * B + b];
    }
    const int64_t found = static_cast<int64_t>(all.size());
    total[v] = static_cast<int32_t>(found);
    true_total[v] = static_cast<int32_t>(std::max(found, bounds));
    if (found > capacity) {  // the best `capacity` by score, in row order
      std::vector<std::pair<uint64_t, int64_t>> order(found);
      for (int64_t k = 0; k < found; ++k) {
        const Ref& a = all[k];
        order[k] = {priority_key(scores[((v * B + a.b) * C + a.row.cls) * N + a.row.box]), k};
      }
      std::nth_element(order.begin(), order.begin() + capacity, order.end());
      order.resize(capacity);
      std::sort(order.begin(), order.end(),
                [](const auto& a, const auto& b) { return a.second < b.second; });
      std::vector<Ref> best;
      for (const auto& o : order) best.push_back(all[o.second]);
      all.swap(best);
    }
    Idx* o = out + v * capacity * 3;
    const int64_t rows_found = std::min<int64_t>(static_cast<int64_t>(all.size()), capacity);
    for (int64_t k = 0; k < rows_found; ++k)
      o[3 * k] = Idx(all[k].b), o[3 * k + 1] = Idx(all[k].row.cls), o[3 * k + 2] = Idx(all[k].row.box);
  }
}

// torchvision batched_nms over `batch` vmap examples: kept indices by priority.
template <typename F, typename Idx>
void batched_nms(ffi::ThreadPool& pool, const F* boxes, const F* scores, const int32_t* ids,
                 const Thresholds<F>& th, Idx* out, int32_t* count, int32_t* true_count,
                 int64_t batch, int64_t N, int64_t capacity, int64_t pre_nms_top_k, bool has_st,
                 bool exact) {
  const uint64_t cleared = cleared_bits<F>(N, exact);
  each_image(pool, batch, N, [&](int64_t v) {
    Workspace<F>& ws = Workspace<F>::of_thread();
    const Rules r{has_st, false, th.score_key(v, batch), cleared, pre_nms_top_k, capacity, capacity,
                  false, kMinMax, false};
    const F* bb = boxes + v * N * 4;
    const int32_t* g = ids + v * N;
    const int64_t passed = walk<F>(scores + v * N, N, 0, r, th.iou_at(v, batch),
                                   [&](int64_t e) { return bb + 4 * e; },
                                   [&](int64_t e) { return g[e]; }, ws);
    const int64_t kept = static_cast<int64_t>(ws.kept.size());
    Idx* o = out + v * capacity;
    for (int64_t k = 0; k < kept; ++k) o[k] = Idx(ws.kept[k]);
    fill_padding(o + kept, capacity - kept);
    count[v] = static_cast<int32_t>(kept);
    true_count[v] = static_cast<int32_t>(
        std::min<int64_t>(kept + std::max<int64_t>(passed - pre_nms_top_k, 0), capacity));
    ws.release_if_large();
  });
}

// TensorRT EfficientNMS over `batch` images: detections by priority, boxes as corners.
template <typename F>
void efficient_nms(ffi::ThreadPool& pool, const F* boxes, const F* scores,
                   const Thresholds<F>& th, int32_t* num, F* out_boxes, F* out_scores,
                   int32_t* out_classes, int32_t* cut, int64_t batch, int64_t N, int64_t C,
                   bool per_class_boxes, int64_t K, int64_t pre_nms_top_k, bool agnostic,
                   bool center) {
  each_image(pool, batch, N * C, [&](int64_t v) {
    Workspace<F>& ws = Workspace<F>::of_thread();
    const Rules r{true, true, th.score_key(v, batch), 0, pre_nms_top_k, K, K, center, kTensorRT,
                  true};
    const F* bb = boxes + v * N * (per_class_boxes ? C : 1) * 4;
    const auto box_of = [&](int64_t e) { return bb + 4 * (per_class_boxes ? e : e / C); };
    const int64_t passed = walk<F>(
        scores + v * N * C, N * C, agnostic ? 1 : C, r, th.iou_at(v, batch), box_of,
        [&](int64_t e) { return static_cast<int32_t>(agnostic ? 0 : e % C); }, ws);
    const int64_t kept = static_cast<int64_t>(ws.kept.size());
    num[v] = static_cast<int32_t>(kept);
    cut[v] = static_cast<int32_t>(std::max<int64_t>(passed - pre_nms_top_k, 0));
    for (int64_t k = 0; k < K; ++k) {
      F* ob = out_boxes + (v * K + k) * 4;
      if (k >= kept) {
        ob[0] = ob[1] = ob[2] = ob[3] = F(0);
        out_scores[v * K + k] = F(0), out_classes[v * K + k] = 0;
        continue;
      }
      const int64_t e = ws.kept[k];
      const Box<F> x = Box<F>::decode(box_of(e), center, kNone);  // corners, as given
      ob[0] = x.lo0, ob[1] = x.lo1, ob[2] = x.hi0, ob[3] = x.hi1;
      out_scores[v * K + k] = scores[v * N * C + e];
      out_classes[v * K + k] = static_cast<int32_t>(e % C);
    }
    ws.release_if_large();
  });
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

template <typename F>
Thresholds<F> thresholds(ffi::AnyBuffer iou, ffi::AnyBuffer score, bool has_score_threshold) {
  return {static_cast<const F*>(iou.untyped_data()),
          has_score_threshold ? static_cast<const F*>(score.untyped_data()) : nullptr,
          static_cast<int64_t>(iou.element_count()), static_cast<int64_t>(score.element_count())};
}

bool same_type(std::initializer_list<ffi::AnyBuffer> buffers) {
  for (const auto& b : buffers)
    if (b.element_type() != buffers.begin()->element_type()) return false;
  return true;
}

ffi::Error OnnxNms(ffi::AnyBuffer boxes, ffi::AnyBuffer scores, ffi::AnyBuffer iou,
                   ffi::AnyBuffer score_threshold, ffi::Result<ffi::AnyBuffer> out,
                   ffi::Result<ffi::Buffer<ffi::S32>> total,
                   ffi::Result<ffi::Buffer<ffi::S32>> true_total, int64_t per_class,
                   int64_t per_image, int64_t pre_nms_top_k, bool has_score_threshold,
                   bool center, bool exact, ffi::ThreadPool pool) {
  XlaFloatMode mode;
  auto sd = scores.dimensions();
  if (sd.size() < 3 || !same_type({boxes, scores, iou, score_threshold}))
    return bad("NonMaxSuppression: scores must be [..., B, C, N], boxes and thresholds of "
               "their dtype");
  const int64_t B = sd[sd.size() - 3], C = sd[sd.size() - 2], N = sd[sd.size() - 1];
  const int64_t batch = total->element_count();
  const int64_t capacity = batch ? static_cast<int64_t>(out->element_count()) / (3 * batch) : 0;
  return guarded("NonMaxSuppression", [&] {
    return dispatch(scores.element_type(), out->element_type(), [&](auto f, auto i) {
      using F = decltype(f);
      using Idx = decltype(i);
      onnx_nms<F, Idx>(pool, static_cast<const F*>(boxes.untyped_data()),
                       static_cast<const F*>(scores.untyped_data()),
                       thresholds<F>(iou, score_threshold, has_score_threshold),
                       static_cast<Idx*>(out->untyped_data()), total->typed_data(),
                       true_total->typed_data(), batch, B, C, N, capacity, per_class, per_image,
                       pre_nms_top_k, has_score_threshold, center, exact);
      return ffi::Error::Success();
    });
  });
}

ffi::Error BatchedNms(ffi::AnyBuffer boxes, ffi::AnyBuffer scores, ffi::Buffer<ffi::S32> groups,
                      ffi::AnyBuffer iou, ffi::AnyBuffer score_threshold,
                      ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::Buffer<ffi::S32>> count,
                      ffi::Result<ffi::Buffer<ffi::S32>> true_count, int64_t pre_nms_top_k,
                      bool has_score_threshold, bool exact, ffi::ThreadPool pool) {
  XlaFloatMode mode;
  auto sd = scores.dimensions();
  if (sd.size() < 1 || !same_type({boxes, scores, iou, score_threshold}))
    return bad("BatchedNMS: scores must be [..., N], boxes and thresholds of their dtype");
  const int64_t N = sd[sd.size() - 1], batch = count->element_count();
  const int64_t capacity = batch ? static_cast<int64_t>(out->element_count()) / batch : 0;
  return guarded("BatchedNMS", [&] {
    return dispatch(scores.element_type(), out->element_type(), [&](auto f, auto i) {
      using F = decltype(f);
      using Idx = decltype(i);
      batched_nms<F, Idx>(pool, static_cast<const F*>(boxes.untyped_data()),
                          static_cast<const F*>(scores.untyped_data()), groups.typed_data(),
                          thresholds<F>(iou, score_threshold, has_score_threshold),
                          static_cast<Idx*>(out->untyped_data()), count->typed_data(),
                          true_count->typed_data(), batch, N, capacity, pre_nms_top_k,
                          has_score_threshold, exact);
      return ffi::Error::Success();
    });
  });
}

ffi::Error EfficientNms(ffi::AnyBuffer boxes, ffi::AnyBuffer scores, ffi::AnyBuffer iou,
                        ffi::AnyBuffer score_threshold, ffi::Result<ffi::Buffer<ffi::S32>> num,
                        ffi::Result<ffi::AnyBuffer> out_boxes, ffi::Result<ffi::AnyBuffer> out_scores,
                        ffi::Result<ffi::Buffer<ffi::S32>> out_classes,
                        ffi::Result<ffi::Buffer<ffi::S32>> cut, int64_t pre_nms_top_k,
                        bool per_class_boxes, bool agnostic, bool center, ffi::ThreadPool pool) {
  XlaFloatMode mode;
  auto sd = scores.dimensions();
  if (sd.size() < 2 || !same_type({boxes, scores, iou, score_threshold, *out_boxes, *out_scores}))
    return bad("EfficientNMS: scores must be [..., N, C], boxes, thresholds and outputs of "
               "their dtype");
  const int64_t N = sd[sd.size() - 2], C = sd[sd.size() - 1], batch = num->element_count();
  const int64_t K = batch ? static_cast<int64_t>(out_scores->element_count()) / batch : 0;
  return guarded("EfficientNMS", [&] {
    return dispatch(scores.element_type(), ffi::DataType::S32, [&](auto f, auto) {
      using F = decltype(f);
      efficient_nms<F>(pool, static_cast<const F*>(boxes.untyped_data()),
                       static_cast<const F*>(scores.untyped_data()),
                       thresholds<F>(iou, score_threshold, true), num->typed_data(),
                       static_cast<F*>(out_boxes->untyped_data()),
                       static_cast<F*>(out_scores->untyped_data()), out_classes->typed_data(),
                       cut->typed_data(), batch, N, C, per_class_boxes, K, pre_nms_top_k,
                       agnostic, center);
      return ffi::Error::Success();
    });
  });
}

}  // namespace
}  // namespace jaxops

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsOnnxNms, jaxops::OnnxNms,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Attr<int64_t>("per_class")
                                  .Attr<int64_t>("per_image")
                                  .Attr<int64_t>("pre_nms_top_k")
                                  .Attr<bool>("has_score_threshold")
                                  .Attr<bool>("center")
                                  .Attr<bool>("exact")
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsBatchedNms, jaxops::BatchedNms,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Attr<int64_t>("pre_nms_top_k")
                                  .Attr<bool>("has_score_threshold")
                                  .Attr<bool>("exact")
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsEfficientNms, jaxops::EfficientNms,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Attr<int64_t>("pre_nms_top_k")
                                  .Attr<bool>("per_class_boxes")
                                  .Attr<bool>("agnostic")
                                  .Attr<bool>("center")
                                  .Ctx<xla::ffi::ThreadPool>());
