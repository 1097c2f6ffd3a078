// Row moves of the hash tables' big per-slot arrays (jaxops/native/table_rows.py): the
// random reads and writes a training step makes into tables larger than the caches.
//
//   JaxopsTakeRows  out[i] = table[slots[i]] for every slot in [0, rows); zeros elsewhere;
//   JaxopsPutRows   table[slots[i]] = rows[i] for every slot in [0, rows) (others: no
//                   write), in place: the table is aliased to the output, so with the
//                   table donated nothing of its size is copied; the slots written are
//                   distinct (the callers' contract, as XLA's unique_indices scatter);
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

ffi::Error TakeRows(ffi::AnyBuffer table, ffi::Buffer<ffi::S32> slots,
                    ffi::Result<ffi::AnyBuffer> out, ffi::ThreadPool pool) {
  const int64_t n = slots.element_count(), rb = row_bytes_of(table);
  const auto tdims = table.dimensions();
  const int64_t rows = tdims.size() == 0 ? 1 : tdims[0];
  if (out->element_type() != table.element_type() ||
      static_cast<int64_t>(out->size_bytes()) != n * rb)
    return bad("TakeRows: out [N, ...] of the table's row shape and dtype expected");
  const char* t = static_cast<const char*>(table.untyped_data());
  const int32_t* s = slots.typed_data();
  char* o = static_cast<char*>(out->untyped_data());
  advise_huge_pages(o, out->size_bytes());  // a large take is a table's copy (copied())
  parallel_for(pool, n, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kRowsAhead < end) {
        const int32_t a = s[i + kRowsAhead];
        if (a >= 0 && a < rows) __builtin_prefetch(t + a * rb, 0, 0);
      }
      const int32_t at = s[i];
      if (at >= 0 && at < rows)
        copy_row(o + i * rb, t + int64_t{at} * rb, rb);
      else
        std::memset(o + i * rb, 0, rb);
    }
  });
  return ffi::Error::Success();
}

ffi::Error PutRows(ffi::AnyBuffer table_in, ffi::Buffer<ffi::S32> slots, ffi::AnyBuffer rows_in,
                   ffi::Result<ffi::AnyBuffer> table, ffi::ThreadPool pool) {
  const int64_t n = slots.element_count(), rb = row_bytes_of(table_in);
  const auto tdims = table_in.dimensions();
  const int64_t rows = tdims.size() == 0 ? 1 : tdims[0];
  if (table->size_bytes() != table_in.size_bytes() ||
      rows_in.element_type() != table_in.element_type() ||
      static_cast<int64_t>(rows_in.size_bytes()) != n * rb)
    return bad("PutRows: rows [N, ...] of the table's row shape and dtype expected");
  char* t = static_cast<char*>(table->untyped_data());
  if (table_in.untyped_data() != t)  // not aliased (XLA could not donate): work on a copy
    std::memcpy(t, table_in.untyped_data(), table_in.size_bytes());
  const int32_t* s = slots.typed_data();
  const char* r = static_cast<const char*>(rows_in.untyped_data());
  // Distinct slots: the parts write disjoint rows, so splitting changes nothing.
  parallel_for(pool, n, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (i + kRowsAhead < end) {
        const int32_t a = s[i + kRowsAhead];
        if (a >= 0 && a < rows) __builtin_prefetch(t + a * rb, 1, 0);
      }
      const int32_t at = s[i];
      if (at >= 0 && at < rows) copy_row(t + int64_t{at} * rb, r + i * rb, rb);
    }
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
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsPutRows, jaxops::PutRows,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ctx<xla::ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxopsFillHuge, jaxops::FillHuge,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ctx<xla::ffi::ThreadPool>());
