// The shm backend's reduce_scatter variants.

#include "backends/shm/variants.h"

#include <cstring>

namespace ddp::shm {

void reduce_scatter(Context& ctx, Algorithm a, const void* in, void* out, std::size_t count,
                    DType dtype, ReduceOp op, bool timing) {
  const std::size_t element = dtype_size(dtype), bytes = count * element;
  Descriptor d = ctx.descriptor(Collective::kReduceScatter, dtype, bytes, -1,
                                static_cast<std::int32_t>(op), a, timing);
  d.offset = ctx.segment->offset_of(in, bytes * static_cast<std::size_t>(ctx.local_size));
  ctx.begin(d);  // which variant can run depends on where every rank's input lives, known once all
                 // published
  auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  const std::size_t mine = static_cast<std::size_t>(ctx.me) * bytes;
  if (a == Algorithm::kPull && ctx.all_in_segment()) {
    const std::size_t block = std::max<std::size_t>(1, kFuseBytes / element);
    for (std::size_t o = 0; o < count; o += block) {
      const std::size_t n = std::min(block, count - o), at = mine + o * element;
      ctx.reduce_slice(
          dst + o * element, src + at,
          [&](int k) { return ctx.segment->base() + ctx.published(k).offset + at; }, n, dtype, op);
    }
    ctx.phase();  // nobody returns (and lets its caller reuse `in`) before all have read it
    return;
  }
  // Each chunk slot holds, per destination rank, `per` elements of its block.
  const std::size_t per =
      std::max<std::size_t>(1, ctx.segment->geometry().chunk_bytes /
                                   (element * static_cast<std::size_t>(ctx.local_size)));
  for (std::size_t b = 0; b < count; b += per) {
    const std::size_t m = std::min(per, count - b);
    const unsigned parity = ctx.chunk_parity++;
    char* slot = ctx.segment->chunk_slot(ctx.me, parity);
    for (int k = 0; k < ctx.local_size; ++k) {
      if (k == ctx.me) continue;
      std::memcpy(slot + static_cast<std::size_t>(k) * per * element,
                  src + (static_cast<std::size_t>(k) * count + b) * element, m * element);
    }
    ctx.phase();
    const std::size_t at = static_cast<std::size_t>(ctx.me) * per * element;
    ctx.reduce_slice(
        dst + b * element, src + mine + b * element,
        [&](int k) { return ctx.segment->chunk_slot(k, parity) + at; }, m, dtype, op);
  }
}

}  // namespace ddp::shm
