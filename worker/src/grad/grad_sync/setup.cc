#include "grad/grad_sync/setup.h"

#include <algorithm>
#include <map>

#include "ddp/common/error.h"
#include "helpers/helpers_internal.h"

namespace ddp::detail {

namespace {

bool is_grad_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 ||
         d == DType::kBFloat16;
}

bool valid_dtype(DType d) {
  int v = static_cast<int>(d);
  return v >= static_cast<int>(DType::kFloat32) && v <= static_cast<int>(DType::kUInt8);
}

struct OptionsRecord {
  std::string problem;
  std::vector<std::pair<std::string, std::int64_t>> values;  // name, value
};

std::vector<std::pair<std::string, std::int64_t>> option_values(const GradSyncOptions& o) {
  // log_every is left out: only rank 0 logs, so ranks may differ in it.
  return {{"bucket_cap_bytes", static_cast<std::int64_t>(o.bucket_cap_bytes)},
          {"first_bucket_bytes", static_cast<std::int64_t>(o.first_bucket_bytes)},
          {"compression", static_cast<std::int64_t>(o.compression)},
          {"find_unused_parameters", o.find_unused_parameters ? 1 : 0},
          {"prescaled_grads", o.prescaled_grads ? 1 : 0},
          {"rebuild_buckets", o.rebuild_buckets ? 1 : 0},
          {"broadcast_chunk_bytes", static_cast<std::int64_t>(o.broadcast_chunk_bytes)},
          // overlap and inline issue the same collectives, so ranks may mix
          // them; the shared sum issues none and must be everybody's.
          {"comm_mode", o.comm_mode == CommMode::kShared ? 1 : 0},
          {"shared_block_bytes", static_cast<std::int64_t>(o.shared_block_bytes)}};
}

std::string encode_record(const std::string& problem, const GradSyncOptions& o) {
  Encoder e;
  e.str(problem);
  auto values = option_values(o);
  e.i64(static_cast<std::int64_t>(values.size()));
  for (const auto& [name, value] : values) {
    e.str(name);
    e.i64(value);
  }
  return e.bytes();
}

OptionsRecord decode_record(const std::string& bytes, const char* who) {
  Decoder d(bytes, who);
  OptionsRecord r;
  r.problem = d.str();
  std::int64_t n = d.i64();
  for (std::int64_t i = 0; i < n; ++i) {
    std::string name = d.str();
    r.values.emplace_back(std::move(name), d.i64());
  }
  return r;
}

std::string show_option(const std::string& name, std::int64_t value) {
  if (name == "compression") return name + "=" + compression_name(static_cast<Compression>(value));
  if (name == "comm_mode")
    return std::string("comm_mode=") + (value ? "shared" : "overlap or inline");
  if (name == "find_unused_parameters" || name == "prescaled_grads" || name == "rebuild_buckets") {
    return name + "=" + (value ? "true" : "false");
  }
  return name + "=" + std::to_string(value);
}

// Throws (on every rank: they all see the same records) for the first rank
// with a problem, else for a rank whose options differ from the majority's.
void check_records(ProcessGroup& group, const std::string& mine, const std::string& problem,
                   const std::string& prefix, const char* who) {
  auto all = gather_if_different(group, mine);
  if (!all) {
    if (!problem.empty()) throw Error(prefix + "every rank: " + problem);
    return;
  }
  std::vector<OptionsRecord> records;
  for (const auto& bytes : *all) records.push_back(decode_record(bytes, who));
  for (int r = 0; r < group.size(); ++r) {
    if (!records[r].problem.empty())
      throw Error(prefix + "rank " + std::to_string(r) + ": " + records[r].problem);
  }
  // The options most ranks have (ties: the lowest rank's) are the reference.
  std::vector<std::string> keys;
  for (const auto& r : records) {
    std::string key;
    for (const auto& [name, value] : r.values) key += name + "=" + std::to_string(value) + ";";
    keys.push_back(key);
  }
  const int ref = majority_rank(keys);
  for (int r = 0; r < group.size(); ++r) {
    if (keys[r] == keys[ref]) continue;
    const auto& a = records[r].values;
    const auto& b = records[ref].values;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (a[i] != b[i]) {
        throw Error(prefix + "options differ across ranks: rank " + std::to_string(r) + " has " +
                    show_option(a[i].first, a[i].second) + ", rank " + std::to_string(ref) +
                    " has " + show_option(b[i].first, b[i].second));
      }
    }
    throw Error(prefix + "options differ across ranks: rank " + std::to_string(r) +
                " differs from rank " + std::to_string(ref));
  }
}

}  // namespace

std::string check_setup(const ProcessGroup& group, const std::vector<GradParam>& params,
                        const GradSyncOptions& o) {
  std::string problem;
  auto fail = [&](const std::string& text) {
    if (problem.empty()) problem = text;
  };
  if (o.bucket_cap_bytes == 0) fail("bucket_cap_bytes must be > 0");
  if (o.first_bucket_bytes == 0) fail("first_bucket_bytes must be > 0");
  if (o.broadcast_chunk_bytes == 0) fail("broadcast_chunk_bytes must be > 0");
  if (o.log_every < 0) fail("log_every must be >= 0 (got " + std::to_string(o.log_every) + ")");
  int c = static_cast<int>(o.compression);
  if (c < static_cast<int>(Compression::kNone) || c > static_cast<int>(Compression::kBf16)) {
    fail("unknown compression (" + std::to_string(c) + ")");
  }
  const int m = static_cast<int>(o.comm_mode);
  if (m < static_cast<int>(CommMode::kOverlap) || m > static_cast<int>(CommMode::kShared)) {
    fail("unknown comm_mode (" + std::to_string(m) + ")");
  }
  const bool shared = o.comm_mode == CommMode::kShared;
  if (shared && o.compression != Compression::kNone) {
    fail(std::string("compression ") + compression_name(o.compression) +
         " does not apply to comm_mode shared: nothing goes on a wire (use none)");
  }
  if (shared && o.shared_block_bytes == 0) fail("shared_block_bytes must be > 0");
  const bool nccl = group.backend_name() == "nccl" && group.size() > 1;
  std::map<std::string, std::size_t> names;
  bool any_host = false, any_device = false;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const GradParam& p = params[i];
    const std::string who = "parameter " + std::to_string(i) + " '" + p.name + "'";
    if (!p.name.empty()) {
      auto [it, fresh] = names.emplace(p.name, i);
      if (!fresh)
        fail("parameter names must be unique: '" + p.name + "' is parameter " +
             std::to_string(it->second) + " and " + std::to_string(i));
    }
    for (auto d : p.shape) {
      if (d < 0) fail(who + " has a negative dimension (" + std::to_string(d) + ")");
    }
    if (!valid_dtype(p.dtype)) {
      fail(who + " has an unknown dtype (" + std::to_string(static_cast<int>(p.dtype)) + ")");
      continue;
    }
    if (!p.requires_grad) continue;
    if (!is_grad_dtype(p.dtype)) {
      fail(who + " has dtype " + dtype_name(p.dtype) +
           ": gradients are float32, float64, float16 or bfloat16 (set requires_grad = false)");
    }
    if (p.device >= 0) {
      any_device = true;
      if (shared) {
        fail(who + " is on cuda:" + std::to_string(p.device) +
             ", but comm_mode shared sums host memory");
      }
      if (group.size() > 1 && !nccl) {
        fail(who + " is on cuda:" + std::to_string(p.device) + ", but backend " +
             group.backend_name() + " reduces host memory");
      }
#ifndef DDP_HAVE_NCCL
      fail(who + " is on cuda:" + std::to_string(p.device) +
           ", but this libddp was built without CUDA");
#endif
    } else {
      any_host = true;
      if (nccl)
        fail(who + " is in host memory (device -1), but backend nccl reduces device memory");
    }
  }
  if (any_host && any_device)
    fail("parameters with gradients are all on the host or all on devices, not both");
  if (any_device && o.compression != Compression::kNone) {
    fail(std::string("compression ") + compression_name(o.compression) +
         " is done on the CPU and is not available for device (nccl) buckets; NCCL reduces them "
         "with avg");
  }
  return problem;
}

void agree_on_setup(ProcessGroup& group, const std::vector<GradParam>& params,
                    const GradSyncOptions& options, const std::string& problem, const char* who) {
  const std::string prefix = std::string(who) + ": ";
  if (group.size() == 1) {
    if (!problem.empty()) throw Error(prefix + problem);
  } else {
    check_records(group, encode_record(problem, options), problem, prefix, who);
  }
  std::vector<ParamInfo> infos;
  infos.reserve(params.size());
  for (const auto& p : params) infos.push_back({p.name, p.shape, p.dtype});
  check_same_params(infos, group);
}

}  // namespace ddp::detail
