// Unique of a float array (the sort path of jaxops/ops/unique.py, axis None), decided as
// its xla kernel decides it:
//
// - equality and order on ordered_bits (float_bits.ordered_bits): -0.0 == +0.0, NaNs after
//   +inf, a subnormal the value it is (whatever the float mode);
// - equal_nan: every NaN is one value; otherwise each NaN is a value of its own, the NaNs in
//   order of position (the stable sort keeps them so);
// - each unique value is returned as it appears at its first occurrence (bits copied);
// - sorted: ascending keys; else the order of first occurrence;
// - outputs cut to the capacity: y (padding 0), first indices (padding -1), counts (padding
//   0), the inverse (unique id of every element, -1 where the id is cut) and the count.
//
// The keys (and, for the index outputs, their positions) are sorted by an LSD radix sort
// (radix_sort.h), which is stable: within a group of equal keys the positions stay ascending, so its first
// entry is the first occurrence.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "common.h"
#include "parallel.h"
#include "radix_sort.h"

namespace jaxops {
namespace {

// The value of an ordered_bits key, for keys of one value only (not zero, not NaN).
template <typename U>
inline U value_of(U key) {
  constexpr U sign = U{1} << (8 * sizeof(U) - 1);
  return (key & sign) ? U(key & ~sign) : U(~key);
}

// Items per sorting thread at least: below, one thread sorts (the pool's start-up and the
// per-thread offsets cost more than they save).
constexpr int64_t kSortGrain = 1 << 15;

struct Placed {
  uint32_t position, value;
};

// out[p.position] = value(p.value) for every item, the items first bucketed by position
// (blocks of 4096) so that the writes of each bucket stay in a few cache lines'
// neighbourhood: a plain scatter of a million positions misses the cache on nearly every
// write.
template <typename Idx, typename Fn>
void write_by_position(const Placed* items, size_t count, int64_t n, Idx* out, Fn value) {
  constexpr int kShift = 12;
  const size_t buckets = static_cast<size_t>(n >> kShift) + 1;
  std::vector<uint32_t> start(buckets + 1, 0);
  for (size_t k = 0; k < count; ++k) ++start[(items[k].position >> kShift) + 1];
  for (size_t b = 0; b < buckets; ++b) start[b + 1] += start[b];
  Scratch<Placed> bucketed(count);
  for (size_t k = 0; k < count; ++k) bucketed.get()[start[items[k].position >> kShift]++] = items[k];
  for (size_t k = 0; k < count; ++k) out[bucketed.get()[k].position] = value(bucketed.get()[k].value);
}

template <typename U>
struct Keys {
  U inf, zero = ordered_bits_of<U>(U{0}, inf), nan = static_cast<U>(~U{0});
  U operator()(U bits) const { return ordered_bits_of<U>(bits, inf); }
};

template <typename U, typename Idx>
void unique_impl(const U* x, int64_t n, Keys<U> keys, bool equal_nan, bool sorted, int64_t cap,
                 U* y, Idx* first_out, Idx* inverse, Idx* counts_out, int32_t* total,
                 const OnPool& run) {
  Scratch<KeyPair<U>> pairs_a(n), pairs_t(n);
  run.ranges(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) pairs_a.get()[i] = {keys(x[i]), static_cast<uint32_t>(i)};
  });
  const KeyPair<U>* pairs = radix_sort(pairs_a.get(), pairs_t.get(), n, run);
  // per sorted group: first position, count, key; a NaN key starts a group of its own
  // unless equal_nan
  std::vector<uint32_t> first, count;
  std::vector<U> key;
  Scratch<Placed> group(n);  // (position, sorted group) of every element
  for (int64_t j = 0; j < n; ++j) {
    const U k = pairs[j].key;
    if (j == 0 || k != pairs[j - 1].key || (k == keys.nan && !equal_nan))
      first.push_back(pairs[j].index), count.push_back(0), key.push_back(k);
    ++count.back();
    group.get()[j] = {pairs[j].index, static_cast<uint32_t>(first.size() - 1)};
  }
  const int64_t m = static_cast<int64_t>(first.size());
  // rank r of the output -> sorted group; for the first-occurrence order, the groups by
  // ascending first position (a scan of the positions finds them in that order).
  std::vector<uint32_t> at_rank, rank;
  if (!sorted) {
    Scratch<uint32_t> group_at(n);
    write_by_position(group.get(), n, n, group_at.get(), [](uint32_t g) { return g; });
    rank.resize(m);
    at_rank.reserve(m);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t g = group_at.get()[i];
      if (first[g] == static_cast<uint32_t>(i)) rank[g] = static_cast<uint32_t>(at_rank.size()), at_rank.push_back(g);
    }
  }
  write_by_position(group.get(), n, n, inverse, [&](uint32_t g) {
    const int64_t r = sorted ? g : rank[g];
    return r < cap ? Idx(r) : Idx(-1);
  });
  for (int64_t r = 0; r < cap; ++r) {
    if (r >= m) {
      y[r] = U{0}, first_out[r] = Idx(-1), counts_out[r] = Idx(0);
      continue;
    }
    const uint32_t g = sorted ? static_cast<uint32_t>(r) : at_rank[r];
    // zero and NaN keys stand for several values: those are read at the first occurrence
    y[r] = key[g] == keys.zero || key[g] == keys.nan ? x[first[g]] : value_of<U>(key[g]);
    first_out[r] = Idx(first[g]), counts_out[r] = Idx(count[g]);
  }
  *total = static_cast<int32_t>(m);
}

// The sorted unique values alone (y of a sorted Unique whose index outputs are unused):
// keys without positions sort twice as fast. Zero and NaN keys stand for several values:
// the zero and an equal_nan NaN are read at their first occurrence, and without equal_nan
// the NaNs (each a value, in order of position) are read off x in order.
template <typename U>
void unique_values(const U* x, int64_t n, Keys<U> keys, bool equal_nan, int64_t cap, U* y,
                   int32_t* total, const OnPool& run) {
  // The keys sort in y where it has room for them (one scratch buffer less to fault in);
  // the values then overwrite the sorted keys in place (the m-th value goes to y[m],
  // m <= j, after key j is read).
  Scratch<U> t(n), own(cap >= n ? 0 : n);
  U* a = cap >= n ? y : own.get();
  run.ranges(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) a[i] = keys(x[i]);
  });
  const U* sorted = radix_sort(a, t.get(), n, run);
  const auto first_value = [&](U key) {
    for (int64_t i = 0;; ++i) if (keys(x[i]) == key) return x[i];
  };
  // The distinct keys before the NaNs (the largest keys), in order: each part counts the
  // group starts in its stretch, then writes its values from its first place on. Where
  // the keys sorted in y itself, values could overwrite keys another part has yet to
  // read: one part then (in place, the m-th value at m <= j after key j is read).
  const int64_t j = std::lower_bound(sorted, sorted + n, keys.nan) - sorted;
  const int64_t parts = sorted == y ? 1 : run.parts();
  const OnPool dedupe{run.pool, parts};
  std::vector<int64_t> place(parts + 1, 0);
  const auto stretch = [&](int64_t p) { return std::make_pair(j * p / parts, j * (p + 1) / parts); };
  const auto starts_group = [&](int64_t k) { return k == 0 || sorted[k] != sorted[k - 1]; };
  const auto distinct = [&](int64_t p) {
    const auto [begin, end] = stretch(p);
    for (int64_t k = begin; k < end; ++k) place[p + 1] += starts_group(k);
  };
  const auto write = [&](int64_t p) {  // the previous key kept: y may hold the keys
    const auto [begin, end] = stretch(p);
    int64_t m = place[p];
    U previous = begin > 0 ? sorted[begin - 1] : U{};
    for (int64_t k = begin; k < end && m < cap; ++k) {
      const U key = sorted[k];
      if (k > 0 && key == previous) continue;
      previous = key;
      y[m++] = key == keys.zero ? first_value(keys.zero) : value_of<U>(key);
    }
  };
  dedupe(distinct);
  for (int64_t p = 0; p < parts; ++p) place[p + 1] += place[p];
  dedupe(write);
  int64_t m = place[parts];
  if (j < n && equal_nan) {
    if (m < cap) y[m] = first_value(keys.nan);
    ++m;
  } else if (j < n) {
    for (int64_t i = 0; i < n; ++i) {
      if (keys(x[i]) != keys.nan) continue;
      if (m < cap) y[m] = x[i];
      ++m;
    }
  }
  for (int64_t r = m; r < cap; ++r) y[r] = U{0};
  *total = static_cast<int32_t>(m);
}

// Dispatches on the float type of x: fn(unsigned type tag, bits of +inf).
template <typename Fn>
ffi::Error with_float_bits(ffi::DataType t, Fn fn) {
  switch (t) {
    case ffi::DataType::F16: return fn(uint16_t{}, uint16_t{0x7c00});
    case ffi::DataType::BF16: return fn(uint16_t{}, uint16_t{0x7f80});
    case ffi::DataType::F32: return fn(uint32_t{}, uint32_t{0x7f800000u});
    case ffi::DataType::F64: return fn(uint64_t{}, uint64_t{0x7ff0000000000000ull});
    default: return bad("Unique: x must be a float array");
  }
}

ffi::Error UniqueValues(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                        ffi::Result<ffi::Buffer<ffi::S32>> total, bool equal_nan,
                        ffi::ThreadPool pool) {
  auto xd = x.dimensions(), yd = y->dimensions();
  if (xd.size() == 0 || yd.size() == 0 || y->element_type() != x.element_type())
    return bad("Unique: x and y must be [..., n] and [..., capacity] of one dtype");
  const int64_t n = xd.back(), cap = yd.back(), batch = total->element_count();
  if (n >= (int64_t{1} << 31)) return bad("Unique: more than 2**31 elements");
  advise_huge_pages(y->untyped_data(), y->size_bytes());
  return with_float_bits(x.element_type(), [&](auto utag, auto inf) {
    using U = decltype(utag);
    return guarded("Unique", [&] {
      for (int64_t b = 0; b < batch; ++b)
        unique_values<U>(static_cast<const U*>(x.untyped_data()) + b * n, n, Keys<U>{inf},
                         equal_nan, cap, static_cast<U*>(y->untyped_data()) + b * cap,
                         total->typed_data() + b, OnPool{&pool, parts_for(pool, n, kSortGrain)});
      return ffi::Error::Success();
    });
  });
}

ffi::Error Unique(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> first,
                  ffi::Result<ffi::AnyBuffer> inverse, ffi::Result<ffi::AnyBuffer> counts,
                  ffi::Result<ffi::Buffer<ffi::S32>> total, bool sorted, bool equal_nan,
                  ffi::ThreadPool pool) {
  auto xd = x.dimensions(), yd = y->dimensions();
  if (xd.size() == 0 || yd.size() == 0 || y->element_type() != x.element_type())
    return bad("Unique: x and y must be [..., n] and [..., capacity] of one dtype");
  const int64_t n = xd.back(), cap = yd.back(), batch = total->element_count();
  if (n >= (int64_t{1} << 31)) return bad("Unique: more than 2**31 elements");
  if (first->element_type() != inverse->element_type() ||
      first->element_type() != counts->element_type())
    return bad("Unique: the index outputs must share one dtype");
  for (auto* out : {&y, &first, &inverse, &counts})
    advise_huge_pages((*out)->untyped_data(), (*out)->size_bytes());
  auto run = [&](auto utag, auto itag, auto inf) -> ffi::Error {
    using U = decltype(utag);
    using Idx = decltype(itag);
    const U* xs = static_cast<const U*>(x.untyped_data());
    U* ys = static_cast<U*>(y->untyped_data());
    Idx* f = static_cast<Idx*>(first->untyped_data());
    Idx* v = static_cast<Idx*>(inverse->untyped_data());
    Idx* c = static_cast<Idx*>(counts->untyped_data());
    return guarded("Unique", [&] {
      for (int64_t b = 0; b < batch; ++b)
        unique_impl<U, Idx>(xs + b * n, n, Keys<U>{static_cast<U>(inf)}, equal_nan, sorted, cap,
                            ys + b * cap, f + b * cap, v + b * n, c + b * cap,
                            total->typed_data() + b, OnPool{&pool, parts_for(pool, n, kSortGrain)});
      return ffi::Error::Success();
    });
  };
  auto with_idx = [&](auto utag, auto inf) -> ffi::Error {
    if (first->element_type() == ffi::DataType::S32) return run(utag, int32_t{}, inf);
    if (first->element_type() == ffi::DataType::S64) return run(utag, int64_t{}, inf);
    return bad("Unique: index outputs must be int32 or int64");
  };
  return with_float_bits(x.element_type(), with_idx);
}

}  // namespace
}  // namespace jaxops

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsUnique, jaxops::Unique,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Attr<bool>("sorted")
                                  .Attr<bool>("equal_nan")
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsUniqueValues, jaxops::UniqueValues,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Attr<bool>("equal_nan")
                                  .Ctx<xla::ffi::ThreadPool>());
