// The ScratchCache of common.h: scratch blocks kept between kernel calls, and the C entry
// point that frees them (jaxops.native.release_scratch calls it through ctypes).
#include <cstdlib>
#include <mutex>

#include "common.h"

namespace jaxops {

ScratchCache& ScratchCache::instance() {
  static ScratchCache* cache = new ScratchCache;  // never destroyed: kernels may run until exit
  return *cache;
}

void* ScratchCache::take(size_t bytes, size_t* got) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t best = blocks_.size();
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (blocks_[i].bytes >= bytes && blocks_[i].bytes / 2 <= bytes &&
        (best == blocks_.size() || blocks_[i].bytes < blocks_[best].bytes))
      best = i;
  if (best == blocks_.size()) return nullptr;
  const Block block = blocks_[best];
  blocks_.erase(blocks_.begin() + best);
  kept_ -= block.bytes;
  *got = block.bytes;
  return block.data;
}

void ScratchCache::give(void* data, size_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    blocks_.push_back(Block{data, bytes});
  } catch (...) {  // no room to remember it: free it
    std::free(data);
    return;
  }
  kept_ += bytes;
  while (kept_ > kKeptBytes) {
    kept_ -= blocks_.front().bytes;
    std::free(blocks_.front().data);
    blocks_.erase(blocks_.begin());
  }
}

size_t ScratchCache::release() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t was = kept_;
  for (const Block& block : blocks_) std::free(block.data);
  blocks_.clear();
  kept_ = 0;
  return was;
}

}  // namespace jaxops

// Frees the scratch blocks the kernels keep between calls; returns the bytes given back.
extern "C" size_t jaxops_native_release_scratch() { return jaxops::ScratchCache::instance().release(); }
