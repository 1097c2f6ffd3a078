// Row moves of the hash tables' big per-slot arrays (jaxops/native/table_rows.py): the
// random reads and writes a training step makes into tables larger than the caches.
//
//   JaxopsTakeRows  out_j[i] = table_j[slots[i]] for every slot in [0, rows), zeros
//                   elsewhere, for k tables of one length in one pass;
//   JaxopsPutRows   table_j[slots[i]] = rows_j[i] for every slot in [0, rows) (others: no
//                   write), in place for k tables in one pass: each table is aliased to its
//                   output, so with the tables donated nothing of their size is copied; the
//                   slots written are distinct (the callers' contract, as XLA's
//                   unique_indices scatter);
//   JaxopsFillHuge  a fresh array filled with one value, its pages advised huge first.
//
// Any element type: a row is `row_bytes` bytes (the product of the trailing dimensions
// times the element size), copied as bytes, so the results are XLA's gather and scatter
// bit for bit. Each loop reads (writes) the row kRowsAhead lanes ahead with a prefetch,
// which XLA's gather and scatter loops do not do: in a table of gigabytes every row is a
// cache (and without huge pages a TLB) miss, and the prefetches overlap them.
//
// Why JaxopsFillHuge: a table's arrays live as long as the table (a donated training step
// updates them in place), and every lookup reads random rows of them. XLA allocates them
// with malloc, in 4 KB pages: a random row is then a TLB miss too. Filling them from a
// kernel that advises 2 MB pages before the first write backs them with huge pages
// (transparent huge pages in "madvise" mode, the common default), once, at creation.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "parallel.h"

namespace jaxops {
namespace {

constexpr int kRowsAhead = 16;
constexpr int64_t kRowGrain = 4096;  // lanes per thread at least

// bytes of one row of `buffer` (every dimension but the first)
int64_t row_bytes_of(const ffi::AnyBuffer& buffer) {
  const auto dims = buffer.dimensions();
  const int64_t rows = dims.size() == 0 ? 1 : dims[0];
  return rows == 0 ? 0 : static_cast<int64_t>(buffer.size_bytes()) / rows;
}

inline void copy_row(char* to, const char* from, int64_t bytes) {
  switch (bytes) {  // the common widths as fixed-size copies (one or two moves)
    case 1: *to = *from; return;
    case 2: std::memcpy(to, from, 2); return;
    case 4: std::memcpy(to, from, 4); return;
    case 8: std::memcpy(to, from, 8); return;
    case 32: std::memcpy(to, from, 32); return;
    case 64: std::memcpy(to, from, 64); return;
    default: std::memcpy(to, from, bytes);
  }
}

// The tables (k of them, all with `rows` rows) of a variadic call, and their row widths.
struct Tables {
  std::vector<const char*> from;
  std::vector<char*> to;
  std::vector<int64_t> bytes;
};

// body(i, slots[i]) for every lane i, split among the pool's threads; prefetch(slot) is
// called kRowsAhead lanes ahead for each slot in [0, rows) (the others are not rows).
template <typename Prefetch, typename Body>
void each_lane(ffi::ThreadPool& pool, const int32_t* slots, int64_t n, int64_t rows,
               const Prefetch& prefetch, const Body& body) {
  parallel_for(pool, n, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kRowsAhead < end) {
        const int32_t a = slots[i + kRowsAhead];
        if (a >= 0 && a < rows) prefetch(int64_t{a});
      }
      body(i, slots[i]);
    }
  });
}

ffi::Error TakeRows(ffi::Buffer<ffi::S32> slots, ffi::RemainingArgs tables,
                    ffi::RemainingRets outs, ffi::ThreadPool pool) {
  const int64_t n = slots.element_count(), k = static_cast<int64_t>(tables.size());
  if (static_cast<int64_t>(outs.size()) != k || k == 0)
    return bad("TakeRows: one output per table expected");
  Tables t;
  int64_t rows = -1;
  for (int64_t j = 0; j < k; ++j) {
    auto table = tables.get<ffi::AnyBuffer>(j);
    auto out = outs.get<ffi::AnyBuffer>(j);
    if (!table.has_value() || !out.has_value()) return bad("TakeRows: buffers expected");
    const auto dims = table->dimensions();
    const int64_t r = dims.size() == 0 ? 1 : dims[0], rb = row_bytes_of(*table);
    if ((rows >= 0 && r != rows) || (*out)->element_type() != table->element_type() ||
        static_cast<int64_t>((*out)->size_bytes()) != n * rb)
      return bad("TakeRows: tables of one length, outputs [N, ...] of their row shapes");
    rows = r;
    t.from.push_back(static_cast<const char*>(table->untyped_data()));
    t.to.push_back(static_cast<char*>((*out)->untyped_data()));
    t.bytes.push_back(rb);
    advise_huge_pages(t.to.back(), (*out)->size_bytes());  // a large take: a copy (copied())
  }
  const int32_t* s = slots.typed_data();
  // One pass for every table: their rows of a lane are requested together, so the misses
  // of k tables overlap (k passes would wait for each table's misses in turn).
  each_lane(
      pool, s, n, rows,
      [&](int64_t a) {
        for (int64_t j = 0; j < k; ++j) __builtin_prefetch(t.from[j] + a * t.bytes[j], 0, 0);
      },
      [&](int64_t i, int32_t at) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t rb = t.bytes[j];
          if (at >= 0 && at < rows)
            copy_row(t.to[j] + i * rb, t.from[j] + int64_t{at} * rb, rb);
          else
            std::memset(t.to[j] + i * rb, 0, rb);
        }
      });
  return ffi::Error::Success();
}

// args: slots, then k tables, then k row arrays; results: the k tables (aliased).
ffi::Error PutRows(ffi::Buffer<ffi::S32> slots, ffi::RemainingArgs args, ffi::RemainingRets outs,
                   ffi::ThreadPool pool) {
  const int64_t n = slots.element_count(), k = static_cast<int64_t>(outs.size());
  if (static_cast<int64_t>(args.size()) != 2 * k || k == 0)
    return bad("PutRows: k tables and k row arrays expected");
  Tables t;
  std::vector<const char*> from_rows;
  int64_t rows = -1;
  for (int64_t j = 0; j < k; ++j) {
    auto table_in = args.get<ffi::AnyBuffer>(j);
    auto rows_in = args.get<ffi::AnyBuffer>(k + j);
    auto table = outs.get<ffi::AnyBuffer>(j);
    if (!table_in.has_value() || !rows_in.has_value() || !table.has_value())
      return bad("PutRows: buffers expected");
    const auto dims = table_in->dimensions();
    const int64_t r = dims.size() == 0 ? 1 : dims[0], rb = row_bytes_of(*table_in);
    if ((rows >= 0 && r != rows) || (*table)->size_bytes() != table_in->size_bytes() ||
        rows_in->element_type() != table_in->element_type() ||
        static_cast<int64_t>(rows_in->size_bytes()) != n * rb)
      return bad("PutRows: tables of one length, rows [N, ...] of their row shapes and dtypes");
    rows = r;
    char* to = static_cast<char*>((*table)->untyped_data());
    if (table_in->untyped_data() != to)  // not aliased (XLA could not donate): a copy
      std::memcpy(to, table_in->untyped_data(), table_in->size_bytes());
    t.to.push_back(to);
    t.bytes.push_back(rb);
    from_rows.push_back(static_cast<const char*>(rows_in->untyped_data()));
  }
  const int32_t* s = slots.typed_data();
  // Distinct slots: the parts write disjoint rows, so splitting changes nothing.
  each_lane(
      pool, s, n, rows,
      [&](int64_t a) {
        for (int64_t j = 0; j < k; ++j) __builtin_prefetch(t.to[j] + a * t.bytes[j], 1, 0);
      },
      [&](int64_t i, int32_t at) {
        if (at < 0 || at >= rows) return;
        for (int64_t j = 0; j < k; ++j)
          copy_row(t.to[j] + int64_t{at} * t.bytes[j], from_rows[j] + i * t.bytes[j],
                   t.bytes[j]);
      });
  return ffi::Error::Success();
}

ffi::Error FillHuge(ffi::AnyBuffer value, ffi::Result<ffi::AnyBuffer> out, ffi::ThreadPool pool) {
  const int64_t eb = static_cast<int64_t>(value.size_bytes());
  if (value.element_type() != out->element_type() || eb <= 0 ||
      out->size_bytes() % static_cast<size_t>(eb) != 0)
    return bad("FillHuge: a scalar value of the output's dtype expected");
  char* o = static_cast<char*>(out->untyped_data());
  advise_huge_pages(o, out->size_bytes());
  const int64_t n = static_cast<int64_t>(out->size_bytes()) / eb;
  const char* v = static_cast<const char*>(value.untyped_data());
  bool zero = true;
  for (int64_t b = 0; b < eb; ++b) zero = zero && v[b] == 0;
  parallel_for(pool, n, int64_t{1} << 20, [&](int64_t begin, int64_t end) {
    if (zero) {
      std::memset(o + begin * eb, 0, (end - begin) * eb);
      return;
    }
    for (int64_t i = begin; i < end; ++i) copy_row(o + i * eb, v, eb);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxops

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsTakeRows, jaxops::TakeRows,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsPutRows, jaxops::PutRows,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsFillHuge, jaxops::FillHuge,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ctx<xla::ffi::ThreadPool>());
