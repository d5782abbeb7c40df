#include "grad/grad_sync/bucket_packing.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "ddp/common/error.h"

namespace ddp {

std::size_t BucketLayout::total_bytes() const {
  std::size_t total = 0;
  for (const auto& b : buckets) total += b.bytes();
  return total;
}

BucketLayout make_bucket_layout(const std::vector<LayoutParam>& params,
                                const std::vector<std::size_t>& order,
                                std::size_t first_bucket_bytes, std::size_t bucket_cap_bytes) {
  if (first_bucket_bytes == 0) throw Error("bucket layout: first_bucket_bytes must be > 0");
  if (bucket_cap_bytes == 0) throw Error("bucket layout: bucket_cap_bytes must be > 0");
  BucketLayout layout;
  layout.bucket_of.assign(params.size(), BucketLayout::kNone);
  layout.slot_of.assign(params.size(), BucketLayout::kNone);
  layout.order = order;

  // A bucket under construction, and where it starts in `order` (its number).
  struct Open {
    LayoutBucket bucket;
    std::size_t first_position = 0;
    bool first_of_group = true;
  };
  using Key = std::pair<int, int>;  // dtype, device
  std::map<Key, Open> open;
  std::map<Key, bool> group_started;
  std::vector<std::pair<std::size_t, LayoutBucket>> closed;  // (first position, bucket)

  for (std::size_t position = 0; position < order.size(); ++position) {
    const std::size_t p = order[position];
    if (p >= params.size()) {
      throw Error("bucket layout: parameter index " + std::to_string(p) + " is out of range (" +
                  std::to_string(params.size()) + " parameters)");
    }
    if (layout.bucket_of[p] != BucketLayout::kNone) {
      throw Error("bucket layout: parameter " + std::to_string(p) +
                  " is listed twice in the order");
    }
    layout.bucket_of[p] = 0;  // placeholder: "seen"; the real index comes below
    const LayoutParam& param = params[p];
    Key key{static_cast<int>(param.dtype), param.device};
    auto it = open.find(key);
    if (it == open.end()) {
      Open fresh;
      fresh.bucket.dtype = param.dtype;
      fresh.bucket.device = param.device;
      fresh.first_position = position;
      fresh.first_of_group = !group_started[key];
      group_started[key] = true;
      it = open.emplace(key, std::move(fresh)).first;
    }
    Open& o = it->second;
    o.bucket.slots.push_back({p, o.bucket.count, param.count});
    o.bucket.count += param.count;
    const std::size_t limit = o.first_of_group ? first_bucket_bytes : bucket_cap_bytes;
    if (o.bucket.bytes() >= limit) {
      closed.emplace_back(o.first_position, std::move(o.bucket));
      open.erase(it);
    }
  }
  for (auto& [key, o] : open) closed.emplace_back(o.first_position, std::move(o.bucket));
  // Number buckets by when they are expected to fill: their first parameter's position.
  std::map<std::size_t, LayoutBucket> by_position;
  for (auto& [position, bucket] : closed) by_position.emplace(position, std::move(bucket));
  for (auto& [position, bucket] : by_position) {
    const std::size_t b = layout.buckets.size();
    for (std::size_t s = 0; s < bucket.slots.size(); ++s) {
      layout.bucket_of[bucket.slots[s].param] = b;
      layout.slot_of[bucket.slots[s].param] = s;
    }
    layout.buckets.push_back(std::move(bucket));
  }
  return layout;
}

std::vector<std::size_t> reverse_registration_order(const std::vector<bool>& trainable) {
  std::vector<std::size_t> order;
  for (std::size_t i = trainable.size(); i-- > 0;) {
    if (trainable[i]) order.push_back(i);
  }
  return order;
}

std::vector<std::size_t> rebuild_order(const std::vector<std::size_t>& observed,
                                       const std::vector<std::size_t>& fallback) {
  std::size_t n = 0;
  for (auto p : fallback) n = std::max(n, p + 1);
  // 0: not in fallback, 1: in fallback, 2: placed.
  std::vector<char> state(n, 0);
  for (auto p : fallback) state[p] = 1;
  std::vector<std::size_t> order;
  order.reserve(fallback.size());
  for (auto p : observed) {
    if (p >= n || state[p] == 0) {
      throw Error("bucket rebuild: parameter " + std::to_string(p) +
                  " in the observed order is not a parameter with a gradient");
    }
    if (state[p] == 2) {
      throw Error("bucket rebuild: parameter " + std::to_string(p) +
                  " appears twice in the observed order");
    }
    state[p] = 2;
    order.push_back(p);
  }
  for (auto p : fallback) {
    if (state[p] == 1) order.push_back(p);
  }
  return order;
}

std::string describe_layout(const BucketLayout& layout) {
  std::string text =
      std::to_string(layout.buckets.size()) + (layout.buckets.size() == 1 ? " bucket" : " buckets");
  if (layout.buckets.empty()) return text;
  text += ":";
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    const LayoutBucket& bucket = layout.buckets[b];
    char size[64];
    std::snprintf(size, sizeof size, "%.2f MiB", static_cast<double>(bucket.bytes()) / (1 << 20));
    text += (b ? ", " : " ") + std::string(size) + " (" + std::to_string(bucket.slots.size()) +
            " " + dtype_name(bucket.dtype) +
            (bucket.device >= 0 ? " cuda:" + std::to_string(bucket.device) : "") + ")";
  }
  return text;
}

}  // namespace ddp
