// Unique of a float array (the sort path of jaxops/ops/unique.py, axis None), decided as
// its xla kernel decides it:
//
// - equality and order on ordered_bits (float_bits.ordered_bits): -0.0 == +0.0, every NaN
//   one value after +inf, a subnormal the value it is (whatever the float mode);
// - each unique value is returned as it appears at its first occurrence (bits copied);
// - sorted: ascending keys; else the order of first occurrence;
// - outputs cut to the capacity: y (padding 0), first indices (padding -1), counts (padding
//   0), the inverse (unique id of every element, -1 where the id is cut) and the count.
//
// The keys and their positions are sorted by an LSD radix sort, which is stable: within a
// group of equal keys the positions stay ascending, so its first entry is the first
// occurrence.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "common.h"

namespace jaxops {
namespace {

template <typename U>
struct Pair {
  U key;
  uint32_t index;
};

template <typename U>
inline U key_of(U k) { return k; }
template <typename U>
inline U key_of(const Pair<U>& p) { return p.key; }

constexpr int kDigitBits = 8, kBuckets = 1 << kDigitBits;

// Counts the digits of key k into the histograms of radix_sort.
template <typename U>
inline void count_digits(U k, uint32_t* count) {
  for (size_t d = 0; d < sizeof(U); ++d) ++count[d * kBuckets + ((k >> (d * kDigitBits)) & (kBuckets - 1))];
}

// Sorts keys or pairs by key (LSD radix, stable), 8-bit digits (measured faster here than
// 11-bit ones: fewer output streams), skipping digits every key shares. `count`: the
// histograms of count_digits over every element (filled while the keys were made).
template <typename T>
void radix_sort(std::vector<T>& a, std::vector<T>& tmp, std::vector<uint32_t>& count) {
  using U = decltype(key_of(a[0]));
  const size_t n = a.size();
  tmp.resize(n);
  for (size_t d = 0; d < sizeof(U); ++d) {
    uint32_t* c = count.data() + d * kBuckets;
    if (*std::max_element(c, c + kBuckets) == n) continue;  // one bucket: nothing moves
    uint32_t sum = 0;
    for (int b = 0; b < kBuckets; ++b) sum += std::exchange(c[b], sum);  // bucket starts
    for (const auto& p : a) tmp[c[(key_of(p) >> (d * kDigitBits)) & (kBuckets - 1)]++] = p;
    a.swap(tmp);
  }
}

// The value of an ordered_bits key, for keys of one value only (not zero, not NaN).
template <typename U>
inline U value_of(U key) {
  constexpr U sign = U{1} << (8 * sizeof(U) - 1);
  return (key & sign) ? U(key & ~sign) : U(~key);
}

struct Placed {
  uint32_t position, value;
};

// out[p.position] = p.value for every item, the items first bucketed by position (blocks of
// 4096) so that the writes of each bucket stay in a few cache lines' neighbourhood: a plain
// scatter of a million positions misses the cache on nearly every write.
template <typename Idx, typename Fn>
void write_by_position(const std::vector<Placed>& items, int64_t n, Idx* out, Fn value) {
  constexpr int kShift = 12;
  const size_t buckets = static_cast<size_t>(n >> kShift) + 1;
  std::vector<uint32_t> start(buckets + 1, 0);
  for (const auto& p : items) ++start[(p.position >> kShift) + 1];
  for (size_t b = 0; b < buckets; ++b) start[b + 1] += start[b];
  std::vector<Placed> bucketed(items.size());
  for (const auto& p : items) bucketed[start[p.position >> kShift]++] = p;
  for (const auto& p : bucketed) out[p.position] = value(p.value);
}

template <typename U, typename Idx>
void unique_impl(const U* x, int64_t n, U inf, bool sorted, int64_t cap, U* y, Idx* first_out,
                 Idx* inverse, Idx* counts_out, int32_t* total) {
  std::vector<Pair<U>> pairs(n), tmp;
  std::vector<uint32_t> histograms(sizeof(U) * kBuckets, 0);
  for (int64_t i = 0; i < n; ++i) {
    pairs[i] = {ordered_bits_of<U>(x[i], inf), static_cast<uint32_t>(i)};
    count_digits(pairs[i].key, histograms.data());
  }
  radix_sort(pairs, tmp, histograms);
  std::vector<uint32_t> first, count;  // per sorted group
  std::vector<U> key;
  std::vector<Placed> group(n);        // (position, sorted group) of every element
  for (int64_t j = 0; j < n; ++j) {
    if (j == 0 || pairs[j].key != pairs[j - 1].key)
      first.push_back(pairs[j].index), count.push_back(0), key.push_back(pairs[j].key);
    ++count.back();
    group[j] = {pairs[j].index, static_cast<uint32_t>(first.size() - 1)};
  }
  std::vector<Pair<U>>().swap(pairs);
  const int64_t m = static_cast<int64_t>(first.size());
  // rank r of the output -> sorted group; for the first-occurrence order, the groups by
  // ascending first position (a scan of the positions finds them in that order).
  std::vector<uint32_t> at_rank, rank;
  if (!sorted) {
    std::vector<uint32_t> group_at(n);
    write_by_position(group, n, group_at.data(), [](uint32_t g) { return g; });
    rank.resize(m);
    at_rank.reserve(m);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t g = group_at[i];
      if (first[g] == static_cast<uint32_t>(i)) rank[g] = static_cast<uint32_t>(at_rank.size()), at_rank.push_back(g);
    }
  }
  write_by_position(group, n, inverse, [&](uint32_t g) {
    const int64_t r = sorted ? g : rank[g];
    return r < cap ? Idx(r) : Idx(-1);
  });
  const U zero_key = ordered_bits_of<U>(U{0}, inf), nan_key = ~U{0};
  for (int64_t r = 0; r < cap; ++r) {
    if (r >= m) {
      y[r] = U{0}, first_out[r] = Idx(-1), counts_out[r] = Idx(0);
      continue;
    }
    const uint32_t g = sorted ? static_cast<uint32_t>(r) : at_rank[r];
    // zero and NaN keys stand for several values: those are read at the first occurrence
    y[r] = key[g] == zero_key || key[g] == nan_key ? x[first[g]] : value_of<U>(key[g]);
    first_out[r] = Idx(first[g]), counts_out[r] = Idx(count[g]);
  }
  *total = static_cast<int32_t>(m);
}

// The sorted unique values alone (y of a sorted Unique; XLA drops the index kernel when a
// caller uses y only): keys without positions sort twice as fast. Zero and NaN keys stand
// for several values; theirs are read at their first occurrence.
template <typename U>
void unique_values(const U* x, int64_t n, U inf, int64_t cap, U* y, int32_t* total) {
  std::vector<U> keys(n), tmp;
  std::vector<uint32_t> histograms(sizeof(U) * kBuckets, 0);
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = ordered_bits_of<U>(x[i], inf);
    count_digits(keys[i], histograms.data());
  }
  radix_sort(keys, tmp, histograms);
  const U zero_key = ordered_bits_of<U>(U{0}, inf), nan_key = ~U{0};
  const auto first_value = [&](U key) {
    for (int64_t i = 0;; ++i) if (ordered_bits_of<U>(x[i], inf) == key) return x[i];
  };
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (j > 0 && keys[j] == keys[j - 1]) continue;
    if (m < cap) y[m] = keys[j] == zero_key || keys[j] == nan_key ? first_value(keys[j])
                                                                  : value_of<U>(keys[j]);
    ++m;
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
                        ffi::Result<ffi::Buffer<ffi::S32>> total) {
  auto xd = x.dimensions(), yd = y->dimensions();
  if (xd.size() == 0 || yd.size() == 0 || y->element_type() != x.element_type())
    return bad("Unique: x and y must be [..., n] and [..., capacity] of one dtype");
  const int64_t n = xd.back(), cap = yd.back(), batch = total->element_count();
  return with_float_bits(x.element_type(), [&](auto utag, auto inf) {
    using U = decltype(utag);
    for (int64_t b = 0; b < batch; ++b)
      unique_values<U>(static_cast<const U*>(x.untyped_data()) + b * n, n, inf, cap,
                       static_cast<U*>(y->untyped_data()) + b * cap, total->typed_data() + b);
    return ffi::Error::Success();
  });
}

ffi::Error Unique(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> first,
                  ffi::Result<ffi::AnyBuffer> inverse, ffi::Result<ffi::AnyBuffer> counts,
                  ffi::Result<ffi::Buffer<ffi::S32>> total, bool sorted) {
  auto xd = x.dimensions(), yd = y->dimensions();
  if (xd.size() == 0 || yd.size() == 0 || y->element_type() != x.element_type())
    return bad("Unique: x and y must be [..., n] and [..., capacity] of one dtype");
  const int64_t n = xd.back(), cap = yd.back(), batch = total->element_count();
  if (n >= (int64_t{1} << 31)) return bad("Unique: more than 2**31 elements");
  if (first->element_type() != inverse->element_type() ||
      first->element_type() != counts->element_type())
    return bad("Unique: the index outputs must share one dtype");
  auto run = [&](auto utag, auto itag, auto inf) -> ffi::Error {
    using U = decltype(utag);
    using Idx = decltype(itag);
    const U* xs = static_cast<const U*>(x.untyped_data());
    U* ys = static_cast<U*>(y->untyped_data());
    Idx* f = static_cast<Idx*>(first->untyped_data());
    Idx* v = static_cast<Idx*>(inverse->untyped_data());
    Idx* c = static_cast<Idx*>(counts->untyped_data());
    for (int64_t b = 0; b < batch; ++b)
      unique_impl<U, Idx>(xs + b * n, n, static_cast<U>(inf), sorted, cap, ys + b * cap,
                          f + b * cap, v + b * n, c + b * cap, total->typed_data() + b);
    return ffi::Error::Success();
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
                                  .Attr<bool>("sorted"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsUniqueValues, jaxops::UniqueValues,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::S32>>());
