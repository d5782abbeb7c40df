#include "ddp/grad_sync.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <optional>

#include "ddp/common/error.h"
#include "ddp/log.h"
#include "helpers_internal.h"
#include "shared_sum.h"

#ifdef DDP_HAVE_NCCL
#include <cuda_runtime.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#define DDP_GRADSYNC_X86 1
#include <immintrin.h>
#endif

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

bool is_grad_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat64 || d == DType::kFloat16 ||
         d == DType::kBFloat16;
}

bool valid_dtype(DType d) {
  int v = static_cast<int>(d);
  return v >= static_cast<int>(DType::kFloat32) && v <= static_cast<int>(DType::kUInt8);
}

// ------------------------------------------------------------ host element ops

double load_scalar(const void* p, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kFloat64: {
      double v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      std::uint16_t v;
      std::memcpy(&v, p, sizeof v);
      return dtype == DType::kFloat16 ? half_to_float(v) : bfloat16_to_float(v);
    }
    default:
      return 0;
  }
}

void store_scalar(void* p, DType dtype, double value) {
  switch (dtype) {
    case DType::kFloat32: {
      float v = static_cast<float>(value);
      std::memcpy(p, &v, sizeof v);
      break;
    }
    case DType::kFloat64:
      std::memcpy(p, &value, sizeof value);
      break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      std::uint16_t v = dtype == DType::kFloat16 ? float_to_half(static_cast<float>(value))
                                                 : float_to_bfloat16(static_cast<float>(value));
      std::memcpy(p, &v, sizeof v);
      break;
    }
    default:
      break;
  }
}

// 16-bit floats as float and back.
float from16(std::uint16_t v, bool half) { return half ? half_to_float(v) : bfloat16_to_float(v); }
std::uint16_t to16(float v, bool half) { return half ? float_to_half(v) : float_to_bfloat16(v); }

// data[i] *= scale.
void scale_in_place(void* data, std::size_t count, DType dtype, double scale) {
  switch (dtype) {
    case DType::kFloat32: {
      float* x = static_cast<float*>(data);
      const float s = static_cast<float>(scale);
      for (std::size_t i = 0; i < count; ++i) x[i] *= s;
      break;
    }
    case DType::kFloat64: {
      double* x = static_cast<double*>(data);
      for (std::size_t i = 0; i < count; ++i) x[i] *= scale;
      break;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const bool half = dtype == DType::kFloat16;
      std::uint16_t* x = static_cast<std::uint16_t*>(data);
      const float s = static_cast<float>(scale);
      for (std::size_t i = 0; i < count; ++i) x[i] = to16(from16(x[i], half) * s, half);
      break;
    }
    default:
      break;
  }
}

// dst[i] = src[i] * scale, or dst[i] += src[i] * scale.
void copy_scaled(void* dst, const void* src, std::size_t count, DType dtype, double scale,
                 bool accumulate) {
  switch (dtype) {
    case DType::kFloat32: {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      const float k = static_cast<float>(scale);
      if (accumulate) {
        for (std::size_t i = 0; i < count; ++i) d[i] += s[i] * k;
      } else {
        for (std::size_t i = 0; i < count; ++i) d[i] = s[i] * k;
      }
      break;
    }
    case DType::kFloat64: {
      double* d = static_cast<double*>(dst);
      const double* s = static_cast<const double*>(src);
      if (accumulate) {
        for (std::size_t i = 0; i < count; ++i) d[i] += s[i] * scale;
      } else {
        for (std::size_t i = 0; i < count; ++i) d[i] = s[i] * scale;
      }
      break;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      const bool half = dtype == DType::kFloat16;
      std::uint16_t* d = static_cast<std::uint16_t*>(dst);
      const std::uint16_t* s = static_cast<const std::uint16_t*>(src);
      const float k = static_cast<float>(scale);
      for (std::size_t i = 0; i < count; ++i) {
        float v = from16(s[i], half) * k;
        d[i] = to16(accumulate ? from16(d[i], half) + v : v, half);
      }
      break;
    }
    default:
      break;
  }
}

// wire[i] = 16-bit(src[i] * scale): src is float32 or float64.
// float32 <-> 16-bit conversions of whole buffers. The scalar helpers of
// types.h are exact but one call per element; these are the hot loops of
// compression: F16C where the CPU has it (the same round-to-nearest-even
// results), and branch-free bfloat16 bit arithmetic the compiler vectorizes.
#ifdef DDP_GRADSYNC_X86

__attribute__((target("avx,f16c"))) void floats_to_half_f16c(const float* s, float k,
                                                             std::uint16_t* out, std::size_t n) {
  const __m256 scale = _mm256_set1_ps(k);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + i), scale);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = float_to_half(s[i] * k);
}

__attribute__((target("avx,f16c"))) void half_to_floats_f16c(const std::uint16_t* in, float* d,
                                                             std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) d[i] = half_to_float(in[i]);
}

bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return yes;
}
#endif

void floats_to_half(const float* s, float k, std::uint16_t* out, std::size_t n) {
#ifdef DDP_GRADSYNC_X86
  if (have_f16c()) return floats_to_half_f16c(s, k, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_half(s[i] * k);
}

void half_to_floats(const std::uint16_t* in, float* d, std::size_t n) {
#ifdef DDP_GRADSYNC_X86
  if (have_f16c()) return half_to_floats_f16c(in, d, n);
#endif
  for (std::size_t i = 0; i < n; ++i) d[i] = half_to_float(in[i]);
}

// types.h's inline bfloat16 conversions: these loops vectorise.
void floats_to_bfloat16(const float* s, float k, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bfloat16(s[i] * k);
}

void bfloat16_to_floats(const std::uint16_t* in, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = bfloat16_to_float(in[i]);
}

// wire[i] = 16-bit(src[i] * scale): src is float32 or float64.
void compress(const void* src, DType dtype, std::uint16_t* wire, std::size_t count, double scale,
              bool half) {
  if (dtype == DType::kFloat32) {
    const float* s = static_cast<const float*>(src);
    const float k = static_cast<float>(scale);
    if (half) {
      floats_to_half(s, k, wire, count);
    } else {
      floats_to_bfloat16(s, k, wire, count);
    }
  } else {
    const double* s = static_cast<const double*>(src);
    for (std::size_t i = 0; i < count; ++i) wire[i] = to16(static_cast<float>(s[i] * scale), half);
  }
}

void decompress(const std::uint16_t* wire, void* dst, DType dtype, std::size_t count, bool half) {
  if (dtype == DType::kFloat32) {
    float* d = static_cast<float*>(dst);
    if (half) {
      half_to_floats(wire, d, count);
    } else {
      bfloat16_to_floats(wire, d, count);
    }
  } else {
    double* d = static_cast<double*>(dst);
    for (std::size_t i = 0; i < count; ++i) d[i] = from16(wire[i], half);
  }
}

// ------------------------------------------------------------ device memory

#ifdef DDP_HAVE_NCCL
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("GradSync: ") + what + ": " + cudaGetErrorString(e));
}

// Makes `device` current for the scope (bucket memory is allocated on the
// parameters' device), restoring the caller's device after.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device != previous_) cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};
#endif

#ifndef DDP_HAVE_NCCL
[[noreturn]] void no_cuda() {
  throw Error("GradSync: device buckets need CUDA, and this libddp was built without it");
}
#endif

void device_zero(void* p, std::size_t bytes) {
#ifdef DDP_HAVE_NCCL
  cuda_check(cudaMemsetAsync(p, 0, bytes, 0), "cudaMemsetAsync");
  cuda_check(cudaStreamSynchronize(0), "cudaStreamSynchronize");
#else
  (void)p;
  (void)bytes;
  no_cuda();
#endif
}

// cudaMemcpyDefault: either side may be host or device memory.
void device_copy(void* dst, const void* src, std::size_t bytes) {
#ifdef DDP_HAVE_NCCL
  cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
  cuda_check(cudaStreamSynchronize(0), "cudaStreamSynchronize");
#else
  (void)dst;
  (void)src;
  (void)bytes;
  no_cuda();
#endif
}

std::shared_ptr<void> device_alloc(std::size_t bytes, int device) {
#ifdef DDP_HAVE_NCCL
  DeviceScope scope(device);
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return std::shared_ptr<void>(p, [](void* q) { (void)cudaFree(q); });
#else
  (void)bytes;
  (void)device;
  no_cuda();
#endif
}

// ------------------------------------------------------------ option checks

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
  detail::Encoder e;
  e.str(problem);
  auto values = option_values(o);
  e.i64(static_cast<std::int64_t>(values.size()));
  for (const auto& [name, value] : values) {
    e.str(name);
    e.i64(value);
  }
  return e.bytes();
}

OptionsRecord decode_record(const std::string& bytes) {
  detail::Decoder d(bytes, "GradSync");
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
  if (name == "comm_mode") return std::string("comm_mode=") + (value ? "shared" : "overlap or inline");
  if (name == "find_unused_parameters" || name == "prescaled_grads" || name == "rebuild_buckets") {
    return name + "=" + (value ? "true" : "false");
  }
  return name + "=" + std::to_string(value);
}

std::string mib(std::size_t bytes) {
  return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20));
}

}  // namespace

const char* comm_mode_name(CommMode mode) {
  switch (mode) {
    case CommMode::kOverlap: return "overlap";
    case CommMode::kInline: return "inline";
    case CommMode::kShared: return "shared";
  }
  return "?";
}

const char* compression_name(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "none";
    case Compression::kFp16:
      return "fp16";
    case Compression::kBf16:
      return "bf16";
  }
  return "unknown";
}

std::size_t GradParam::count() const {
  std::size_t n = 1;
  for (auto d : shape) n *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
  return n;
}

// One bucket's memory and this iteration's state.
struct GradSync::Bucket {
  std::shared_ptr<void> buffer;  // count (+1 status word) elements of the bucket's dtype
  std::shared_ptr<void> wire;    // compression: count (+1) 16-bit elements
  bool compressed = false;
  bool has_status = false;  // the last bucket carries the unused-parameter status word
  std::size_t pending = 0;  // slots not yet ready in this iteration
  bool launched = false;
  bool done = false;
  Clock::time_point done_at{};
  std::shared_ptr<Work> work;
  std::exception_ptr error;  // kInline: the collective's failure

  char* data() const { return static_cast<char*>(buffer.get()); }
  std::uint16_t* wire16() const { return static_cast<std::uint16_t*>(wire.get()); }
};

// ------------------------------------------------------------ construction

GradSync::GradSync(std::shared_ptr<ProcessGroup> group, std::vector<GradParam> params,
                   GradSyncOptions options)
    : owned_group_(std::move(group)),
      group_(owned_group_.get()),
      params_(std::move(params)),
      options_(options) {
  if (group_ == nullptr) throw Error("GradSync: the process group is null");
  init();
}

GradSync::GradSync(ProcessGroup& group, std::vector<GradParam> params, GradSyncOptions options)
    : group_(&group), params_(std::move(params)), options_(options) {
  init();
}

GradSync::~GradSync() {
  for (auto& b : buckets_) {
    if (!b->work) continue;
    try {
      b->work->wait();
    } catch (...) {
      // The collective's error was (or will never be) reported by finish().
    }
  }
}

void GradSync::validate_locally(std::string* problem) const {
  auto fail = [&](const std::string& text) {
    if (problem->empty()) *problem = text;
  };
  const GradSyncOptions& o = options_;
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
  const bool nccl = group_->backend_name() == "nccl" && group_->size() > 1;
  std::map<std::string, std::size_t> names;
  bool any_host = false, any_device = false;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const GradParam& p = params_[i];
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
      if (group_->size() > 1 && !nccl) {
        fail(who + " is on cuda:" + std::to_string(p.device) + ", but backend " +
             group_->backend_name() + " reduces host memory");
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
}

void GradSync::check_across_ranks(const std::string& problem) {
  if (group_->size() == 1) {
    if (!problem.empty()) throw Error("GradSync: " + problem);
    return;
  }
  auto all = detail::gather_if_different(*group_, encode_record(problem, options_));
  if (!all) {
    if (!problem.empty()) throw Error("GradSync: every rank: " + problem);
    return;
  }
  std::vector<OptionsRecord> records;
  for (const auto& bytes : *all) records.push_back(decode_record(bytes));
  for (int r = 0; r < group_->size(); ++r) {
    if (!records[r].problem.empty())
      throw Error("GradSync: rank " + std::to_string(r) + ": " + records[r].problem);
  }
  // The options most ranks have (ties: the lowest rank's) are the reference.
  std::vector<std::string> keys;
  for (const auto& r : records) {
    std::string key;
    for (const auto& [name, value] : r.values) key += name + "=" + std::to_string(value) + ";";
    keys.push_back(key);
  }
  const int ref = detail::majority_rank(keys);
  for (int r = 0; r < group_->size(); ++r) {
    if (keys[r] == keys[ref]) continue;
    const auto& mine = records[r].values;
    const auto& theirs = records[ref].values;
    for (std::size_t i = 0; i < std::min(mine.size(), theirs.size()); ++i) {
      if (mine[i] != theirs[i]) {
        throw Error("GradSync: options differ across ranks: rank " + std::to_string(r) + " has " +
                    show_option(mine[i].first, mine[i].second) + ", rank " + std::to_string(ref) +
                    " has " + show_option(theirs[i].first, theirs[i].second));
      }
    }
    throw Error("GradSync: options differ across ranks: rank " + std::to_string(r) +
                " differs from rank " + std::to_string(ref));
  }
}

void GradSync::init() {
  std::string problem;
  validate_locally(&problem);
  check_across_ranks(problem);

  std::vector<ParamInfo> infos;
  infos.reserve(params_.size());
  for (const auto& p : params_) infos.push_back({p.name, p.shape, p.dtype});
  check_same_params(infos, *group_);

  const std::size_t n = params_.size();
  std::vector<bool> trainable(n);
  for (std::size_t i = 0; i < n; ++i) {
    trainable[i] = params_[i].requires_grad;
    device_buckets_ = device_buckets_ || (params_[i].requires_grad && params_[i].device >= 0);
  }
  marked_.assign(n, 0);
  marked_window_.assign(n, 0);
  scaled_.assign(n, options_.prescaled_grads ? 1 : 0);
  known_zero_.assign(n, 1);
  record_order_ = options_.rebuild_buckets;
  inline_ = options_.comm_mode == CommMode::kInline;
  if (options_.comm_mode == CommMode::kShared) {
    init_shared_sum();
    return;
  }

  std::vector<LayoutParam> lp;
  for (const auto& p : params_) lp.push_back({p.count(), p.dtype, p.device});
  apply_layout(make_bucket_layout(lp, reverse_registration_order(trainable),
                                  options_.first_bucket_bytes, options_.bucket_cap_bytes),
               false);
  if (group_->rank() == 0) {
    std::size_t elements = 0;
    for (const auto& p : params_) elements += p.requires_grad ? p.count() : 0;
    log::info(
        "GradSync: {} parameters ({} gradient elements, {}) in {}; first bucket {}, cap {}, "
        "compression {}, "
        "backend {}, {} ranks, communication {}",
        n, elements, mib(layout_.total_bytes()), describe_layout(layout_),
        mib(options_.first_bucket_bytes), mib(options_.bucket_cap_bytes),
        compression_name(options_.compression), group_->backend_name(), group_->size(),
        inline_ ? "inline (on the caller's thread)" : "overlapped (on the group's thread)");
  }
}

void GradSync::init_shared_sum() {
  std::vector<detail::SumParam> sp;
  for (const auto& p : params_) {
    const std::int64_t rows = p.shape.empty() ? 1 : std::max<std::int64_t>(p.shape[0], 1);
    sp.push_back({p.count(), dtype_size(p.dtype), rows, p.requires_grad});
  }
  const int world = group_->size();
  detail::SumLayout layout = detail::make_sum_layout(sp, world, options_.shared_block_bytes);
  const std::size_t bytes = detail::SharedSum::bytes_needed(layout, world);
  if (world == 1) {
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    shared_memory_ = std::shared_ptr<void>(std::aligned_alloc(64, std::max<std::size_t>(rounded, 64)), std::free);
    if (!shared_memory_) throw Error("GradSync: could not allocate " + mib(bytes) + " for the shared sum");
    std::memset(shared_memory_.get(), 0, bytes);
  } else {
    shared_memory_ = group_->allocate_node_shared(bytes);  // collective; nullptr on every rank alike
    if (!shared_memory_) {
      throw Error("GradSync: comm_mode shared needs " + mib(bytes) +
                  " of memory that every rank maps: the ranks of one node under the shm backend, "
                  "with room in its segment (DDP_SHM_ARENA_MB); this group (backend " +
                  group_->backend_name() + ", " + std::to_string(world) +
                  " ranks) has none (use comm_mode overlap or inline)");
    }
  }
  shared_sum_ = std::make_unique<detail::SharedSum>(
      std::move(layout), shared_memory_.get(), group_->rank(), world, group_->timeout(),
      shm::WaitPolicy::for_ranks(world),
      [this](std::size_t p) { return "'" + params_[p].name + "' (index " + std::to_string(p) + ")"; });
  record_order_ = false;
  rebuilt_ = true;  // no buckets to rebuild
  if (group_->rank() == 0) {
    log::info("GradSync: {} parameters in a shared sum of {} ({} blocks of rows), {} ranks: no "
              "collectives, the ranks add their gradients into one node-shared buffer",
              params_.size(), mib(shared_sum_->layout().buffer_bytes),
              shared_sum_->layout().blocks.size(), world);
  }
}

void GradSync::apply_layout(BucketLayout layout, bool keep_values) {
  const int world = group_->size();
  std::vector<std::unique_ptr<Bucket>> fresh;
  for (std::size_t b = 0; b < layout.buckets.size(); ++b) {
    const LayoutBucket& lb = layout.buckets[b];
    auto bucket = std::make_unique<Bucket>();
    bucket->has_status = b + 1 == layout.buckets.size();
    const std::size_t elements = lb.count + (bucket->has_status ? 1 : 0);
    const std::size_t bytes = elements * dtype_size(lb.dtype);
    if (device_buckets_) {
      if (world > 1) {
#ifdef DDP_HAVE_NCCL
        DeviceScope scope(lb.device);
#endif
        bucket->buffer = group_->allocate(bytes);
      } else {
        bucket->buffer = device_alloc(bytes, lb.device);
      }
      device_zero(bucket->buffer.get(), bytes);
    } else {
      bucket->buffer = group_->allocate(bytes);
      std::memset(bucket->buffer.get(), 0, bytes);
    }
    bucket->compressed = options_.compression != Compression::kNone && world > 1 &&
                         (lb.dtype == DType::kFloat32 || lb.dtype == DType::kFloat64);
    if (bucket->compressed) bucket->wire = group_->allocate(elements * sizeof(std::uint16_t));
    bucket->pending = lb.slots.size();
    fresh.push_back(std::move(bucket));
  }
  if (keep_values) {
    for (std::size_t p = 0; p < params_.size(); ++p) {
      if (layout.bucket_of[p] == BucketLayout::kNone || layout_.bucket_of[p] == BucketLayout::kNone)
        continue;
      const BucketSlot& from = layout_.slot(p);
      const BucketSlot& to = layout.slot(p);
      const std::size_t element = dtype_size(params_[p].dtype);
      const char* src = buckets_[layout_.bucket_of[p]]->data() + from.offset * element;
      char* dst = fresh[layout.bucket_of[p]]->data() + to.offset * element;
      if (device_buckets_) {
        device_copy(dst, src, from.count * element);
      } else {
        std::memcpy(dst, src, from.count * element);
      }
    }
  }
  layout_ = std::move(layout);
  buckets_ = std::move(fresh);
}

// ------------------------------------------------------------ parameters and views

const GradParam& GradSync::param(std::size_t index) const {
  if (index >= params_.size()) {
    throw Error("GradSync: parameter index " + std::to_string(index) + " is out of range (" +
                std::to_string(params_.size()) + " parameters)");
  }
  return params_[index];
}

std::size_t GradSync::index_of(std::string_view name) const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return i;
  }
  throw Error("GradSync: no parameter is called '" + std::string(name) + "'");
}

std::size_t GradSync::checked_trainable(std::size_t index, const char* what) const {
  if (index >= params_.size()) {
    throw Error(std::string("GradSync: ") + what + ": parameter index " + std::to_string(index) +
                " is out of range (" + std::to_string(params_.size()) + " parameters)");
  }
  if (!params_[index].requires_grad) {
    throw Error(std::string("GradSync: ") + what + ": parameter '" + params_[index].name +
                "' (index " + std::to_string(index) +
                ") is frozen (requires_grad = false): it has no gradient");
  }
  return index;
}

void* GradSync::grad(std::size_t index) {
  checked_trainable(index, "grad");
  // The last synced window's sum (window synced_iterations_ - 1; the same
  // buffer parity as synced_iterations_ + 1, which reads zeros before any).
  if (shared()) return shared_sum_->result(index, synced_iterations_ + 1);
  const BucketSlot& slot = layout_.slot(index);
  return buckets_[layout_.bucket_of[index]]->data() +
         slot.offset * dtype_size(params_[index].dtype);
}

float* GradSync::grad_view(std::size_t index) {
  checked_trainable(index, "grad_view");
  if (params_[index].dtype != DType::kFloat32) {
    throw Error("GradSync: grad_view: parameter '" + params_[index].name + "' is " +
                dtype_name(params_[index].dtype) + ", not float32 (use grad())");
  }
  return static_cast<float*>(grad(index));
}

std::string GradSync::param_list(const std::vector<std::size_t>& indices) const {
  constexpr std::size_t kShown = 20;
  std::string text;
  for (std::size_t k = 0; k < indices.size() && k < kShown; ++k) {
    text += (k ? ", '" : "'") + params_[indices[k]].name + "' (index " +
            std::to_string(indices[k]) + ")";
  }
  if (indices.size() > kShown) text += " and " + std::to_string(indices.size() - kShown) + " more";
  return text;
}

void GradSync::zero_bytes(void* p, std::size_t bytes) {
  if (device_buckets_) {
    device_zero(p, bytes);
  } else {
    std::memset(p, 0, bytes);
  }
}

// ------------------------------------------------------------ iterations

void GradSync::set_needed_gradients(std::vector<ElementRange> per_param) {
  require_between_iterations("set_needed_gradients");
  if (!per_param.empty() && per_param.size() != params_.size()) {
    throw Error("GradSync::set_needed_gradients: " + std::to_string(per_param.size()) + " ranges for " +
                std::to_string(params_.size()) + " parameters");
  }
  for (std::size_t p = 0; p < per_param.size(); ++p) {
    const ElementRange& r = per_param[p];
    if (r.begin > r.end || r.end > params_[p].count()) {
      throw Error("GradSync::set_needed_gradients: elements [" + std::to_string(r.begin) + ", " +
                  std::to_string(r.end) + ") are not within parameter '" + params_[p].name + "' (" +
                  std::to_string(params_[p].count()) + " elements)");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  needed_ = std::move(per_param);
}

void GradSync::require_between_iterations(const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_iteration_) {
    throw Error(std::string("GradSync: ") + what + " was called during iteration " +
                std::to_string(iterations_ + 1) +
                " (after begin_backward/mark_ready/add_grad/set_grad, before finish())");
  }
}

void GradSync::begin_iteration_locked(Clock::time_point now) {
  if (in_iteration_) return;
  in_iteration_ = true;
  iteration_sync_ = no_sync_depth_ == 0;
  backward_start_ = now;
  have_backward_start_ = true;
}

void GradSync::begin_backward() {
  auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  begin_iteration_locked(now);
}

void GradSync::begin_no_sync() {
  std::lock_guard<std::mutex> lock(mu_);
  ++no_sync_depth_;
}

void GradSync::end_no_sync() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (no_sync_depth_ > 0) --no_sync_depth_;
}

bool GradSync::sync_enabled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return no_sync_depth_ == 0;
}

void GradSync::set_grad(std::size_t index, const void* src) { copy_in(index, src, false); }
void GradSync::add_grad(std::size_t index, const void* src) { copy_in(index, src, true); }

void GradSync::copy_in(std::size_t index, const void* src, bool accumulate) {
  const char* what = accumulate ? "add_grad" : "set_grad";
  checked_trainable(index, what);
  const GradParam& p = params_[index];
  const std::size_t count = p.count();
  if (src == nullptr && count > 0) {
    throw Error(std::string("GradSync: ") + what + ": source of parameter '" + p.name +
                "' is null");
  }
  if (shared()) {
    contribute_copy(index, src);
    return;
  }
  if (device_buckets_ && accumulate) {
    throw Error("GradSync: add_grad: parameter '" + p.name +
                "' has a device bucket; accumulate into grad() with your own kernels");
  }
  const double scale = 1.0 / group_->size();
  bool rescale_existing = false;
  {
    auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    begin_iteration_locked(now);
    if (marked_[index]) {
      throw Error(std::string("GradSync: ") + what + ": parameter '" + p.name + "' (index " +
                  std::to_string(index) + ") was already marked ready in iteration " +
                  std::to_string(iterations_ + 1) + " (its bucket may be in flight)");
    }
    if (!device_buckets_) {
      // A view holding unscaled values (a previous result, raw writes) is
      // brought to the same scale before scaled values are added to it.
      rescale_existing = accumulate && !scaled_[index] && !known_zero_[index] && scale != 1.0;
      scaled_[index] = 1;
    }
    known_zero_[index] = 0;
  }
  void* dst = grad(index);
  if (device_buckets_) {
    device_copy(dst, src, count * dtype_size(p.dtype));
    return;
  }
  if (rescale_existing) scale_in_place(dst, count, p.dtype, scale);
  copy_scaled(dst, src, count, p.dtype, scale, accumulate);
}

void GradSync::zero_grad() {
  require_between_iterations("zero_grad");
  if (shared()) return;  // every window's sum starts from zero by itself
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const LayoutBucket& lb = layout_.buckets[b];
    zero_bytes(buckets_[b]->data(), lb.bytes());
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(known_zero_.begin(), known_zero_.end(), 1);
}

std::vector<std::size_t> GradSync::unmarked_locked() const {
  std::vector<std::size_t> unmarked;
  for (std::size_t p = 0; p < params_.size(); ++p) {
    if (params_[p].requires_grad && !marked_[p]) unmarked.push_back(p);
  }
  return unmarked;
}

void GradSync::mark_once_locked(std::size_t index, const char* what, const char* done) {
  if (marked_[index]) {
    throw Error(std::string("GradSync: ") + what + ": parameter '" + params_[index].name +
                "' (index " + std::to_string(index) + ") was already " + done + " in iteration " +
                std::to_string(iterations_ + 1) +
                "; call finish() at the end of every iteration (no_sync ones too)");
  }
  marked_[index] = 1;
  marked_window_[index] = 1;
  known_zero_[index] = 0;
}

void GradSync::mark_ready(std::size_t index) {
  checked_trainable(index, "mark_ready");
  if (shared()) {
    throw Error("GradSync: mark_ready: parameter '" + params_[index].name +
                "': comm_mode shared adds gradients up as they are written; hand it over with "
                "contribute() (or add_grad()/set_grad()), not through its view");
  }
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  begin_iteration_locked(now);
  mark_once_locked(index, "mark_ready", "marked ready");
  if (record_order_) observed_order_.push_back(index);
  last_mark_ = now;
  have_last_mark_ = true;
  if (!iteration_sync_) return;
  Bucket& bucket = *buckets_[layout_.bucket_of[index]];
  if (--bucket.pending == 0) launch_ready_locked(false);
  poll_completions_locked(now);
}

// ------------------------------------------------------------ the shared sum (CommMode::kShared)

void GradSync::contribute(std::size_t index, const std::function<void(const GradBlock&)>& write) {
  checked_trainable(index, "contribute");
  if (!shared()) {
    throw Error(std::string("GradSync: contribute: parameter '") + params_[index].name +
                "': contribute() hands gradients to comm_mode shared; this GradSync's comm_mode is " +
                comm_mode_name(options_.comm_mode) + " (write grad() and call mark_ready())");
  }
  std::uint64_t window = 0, window_round = 0;
  {
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    if (!shared_broken_.empty()) throw Error("GradSync: contribute: " + shared_broken_);
    begin_iteration_locked(now);
    mark_once_locked(index, "contribute", "handed over");
    window = synced_iterations_;
    window_round = window_round_;
  }
  const GradParam& p = params_[index];
  const std::size_t row_elements =
      shared_sum_->layout().row_bytes[index] / dtype_size(p.dtype);
  const float scale = grad_scale();
  double waited = 0;
  try {
    waited = shared_sum_->contribute(index, window, window_round, [&](const detail::BlockWrite& b) {
      write(GradBlock{b.data, b.row_begin, b.rows, row_elements, !b.first, scale});
    });
  } catch (const detail::SharedSumTimeout& e) {
    std::lock_guard<std::mutex> lock(mu_);
    shared_broken_ = e.what();
    throw;
  }
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  shared_wait_ms_ += waited;
  last_mark_ = std::max(last_mark_, now);
  have_last_mark_ = true;
}

void GradSync::contribute_copy(std::size_t index, const void* src) {
  const GradParam& p = params_[index];
  const std::size_t element = dtype_size(p.dtype);
  contribute(index, [&](const GradBlock& b) {
    const std::size_t first = static_cast<std::size_t>(b.row_begin) * b.row_elements;
    copy_scaled(b.data, static_cast<const char*>(src) + first * element,
                static_cast<std::size_t>(b.rows) * b.row_elements, p.dtype, b.scale, b.accumulate);
  });
}

void GradSync::finish_shared(Clock::time_point enter, std::unique_lock<std::mutex>& lock) {
  if (!shared_broken_.empty()) {
    record_iteration_locked(false, enter, enter);
    throw Error("GradSync: finish: " + shared_broken_);
  }
  const bool sync = iteration_sync_;
  const std::uint64_t window = synced_iterations_, round = iterations_;
  // Parameters not handed over count as zero contributions, so that no rank
  // waits for them; without find_unused_parameters they void the window.
  const std::vector<std::size_t> unmarked = unmarked_locked();
  try {
    for (std::size_t p : unmarked) {
      if (sync && !options_.find_unused_parameters) shared_sum_->flag_missing(p, window);
      const std::size_t row_bytes = shared_sum_->layout().row_bytes[p];
      shared_wait_ms_ += shared_sum_->contribute(p, window, window_round_, [&](const detail::BlockWrite& b) {
        if (b.first) std::memset(b.data, 0, static_cast<std::size_t>(b.rows) * row_bytes);
      });
    }
    shared_sum_->publish_rounds(round + 1);
    if (sync) shared_sum_->wait_rounds(round + 1);  // its time is inside finish()'s, which counts
  } catch (const detail::SharedSumTimeout& e) {
    shared_broken_ = e.what();
    record_iteration_locked(sync, enter, Clock::now());
    throw;
  }
  std::vector<std::size_t> invalid;
  if (sync) {
    for (std::size_t p = 0; p < params_.size(); ++p) {
      if (params_[p].requires_grad && shared_sum_->missing(p, window)) invalid.push_back(p);
    }
  }
  record_iteration_locked(sync, enter, Clock::now());
  if (sync) window_round_ = iterations_;  // the next window begins with the next round
  const std::uint64_t iteration = iterations_;
  lock.unlock();
  log_iteration(last_);
  if (invalid.empty()) return;
  std::vector<std::size_t> mine;
  if (!options_.find_unused_parameters) mine = unmarked;
  if (!mine.empty()) {
    throw Error("GradSync: iteration " + std::to_string(iteration) +
                ": parameters never handed over on rank " + std::to_string(group_->rank()) + ": " +
                param_list(mine) +
                "; contribute every parameter that has a gradient, or set find_unused_parameters "
                "to count them as zero (every rank's gradients of this iteration are invalid)");
  }
  throw Error("GradSync: iteration " + std::to_string(iteration) + ": " + param_list(invalid) +
              " had no valid gradient from some rank (never handed over there, or its write "
              "failed; that rank's error names it): every rank's gradients of this iteration are "
              "invalid");
}

void GradSync::launch_ready_locked(bool status) {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) {
    launch_locked(next_launch_, status);
    ++next_launch_;
  }
}

void GradSync::launch_locked(std::size_t b, bool status) {
  Bucket& bucket = *buckets_[b];
  const LayoutBucket& lb = layout_.buckets[b];
  const auto now = Clock::now();
  if (!have_first_launch_) {
    first_launch_ = now;
    have_first_launch_ = true;
  }
  bucket.launched = true;
  ++launched_count_;
  const int world = group_->size();
  if (world == 1) {  // nothing to reduce with
    bucket.done = true;
    bucket.done_at = now;
    return;
  }
  const std::size_t elements = lb.count + (bucket.has_status ? 1 : 0);
  const double scale = 1.0 / world;
  if (bucket.compressed) {
    const bool half = options_.compression == Compression::kFp16;
    const std::size_t element = dtype_size(lb.dtype);
    for (const BucketSlot& slot : lb.slots) {
      compress(bucket.data() + slot.offset * element, lb.dtype, bucket.wire16() + slot.offset,
               slot.count, scaled_[slot.param] ? 1.0 : scale, half);
    }
    if (bucket.has_status) bucket.wire16()[lb.count] = to16(status ? 1.0f : 0.0f, half);
    const DType wire = half ? DType::kFloat16 : DType::kBFloat16;
    start_all_reduce(bucket, bucket.wire.get(), elements, wire, ReduceOp::kSum);
    wire_bytes_ += elements * sizeof(std::uint16_t);
    return;
  }
  ReduceOp op = ReduceOp::kSum;
  if (device_buckets_) {
    op = options_.prescaled_grads ? ReduceOp::kSum : ReduceOp::kAvg;
  } else {
    std::size_t scaled = 0;
    for (const BucketSlot& slot : lb.slots) scaled += scaled_[slot.param] ? 1 : 0;
    if (scaled == 0) {
      op = ReduceOp::kAvg;  // divided after the sum, on the group's thread
    } else if (scaled < lb.slots.size()) {
      const std::size_t element = dtype_size(lb.dtype);
      for (const BucketSlot& slot : lb.slots) {
        if (!scaled_[slot.param])
          scale_in_place(bucket.data() + slot.offset * element, slot.count, lb.dtype, scale);
      }
    }
  }
  if (bucket.has_status) {
    char* word = bucket.data() + lb.count * dtype_size(lb.dtype);
    if (device_buckets_) {
      char host[8] = {};
      store_scalar(host, lb.dtype, status ? 1.0 : 0.0);
      device_copy(word, host, dtype_size(lb.dtype));
    } else {
      store_scalar(word, lb.dtype, status ? 1.0 : 0.0);
    }
  }
  // Partial: this rank's elements of the bucket (the status word goes apart,
  // in finish()), with the full count so every path splits the bucket as a
  // full all-reduce does and gives the same bits.
  const bool partial = !needed_.empty() && !device_buckets_;
  std::vector<ElementRange> mine;
  if (partial) {
    for (const BucketSlot& slot : lb.slots) {
      const ElementRange& r = needed_[slot.param];
      if (!r.empty()) mine.push_back({slot.offset + r.begin, slot.offset + r.end});
    }
  }
  start_all_reduce(bucket, bucket.buffer.get(), elements, lb.dtype, op, partial ? &mine : nullptr);
  wire_bytes_ += elements * dtype_size(lb.dtype);
}

void GradSync::start_all_reduce(Bucket& bucket, void* data, std::size_t count, DType dtype, ReduceOp op,
                                const std::vector<ElementRange>* needed) {
  if (!inline_) {
    bucket.work = needed ? group_->all_reduce_partial_async(data, count, dtype, op, *needed)
                         : group_->all_reduce_async(data, count, dtype, op);
    return;
  }
  const auto start = Clock::now();
  if (inline_error_) {
    bucket.error = inline_error_;  // the group failed this iteration: no more waiting on it
  } else {
    try {
      if (needed) {
        group_->all_reduce_partial(data, count, dtype, op, *needed);
      } else {
        group_->all_reduce(data, count, dtype, op);
      }
    } catch (...) {
      bucket.error = inline_error_ = std::current_exception();
    }
  }
  bucket.done = true;
  bucket.done_at = Clock::now();
  inline_ms_ += std::chrono::duration<double, std::milli>(bucket.done_at - start).count();
}

void GradSync::poll_completions_locked(Clock::time_point now) {
  while (oldest_unfinished_ < next_launch_) {
    Bucket& bucket = *buckets_[oldest_unfinished_];
    if (!bucket.done) {
      if (bucket.work && !bucket.work->is_completed()) return;
      bucket.done = true;
      bucket.done_at = now;
    }
    ++oldest_unfinished_;
  }
}

void GradSync::finish() {
  const auto enter = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  begin_iteration_locked(enter);
  if (shared()) {
    finish_shared(enter, lock);
    return;
  }
  poll_completions_locked(enter);
  if (!iteration_sync_) {
    std::fill(marked_.begin(), marked_.end(), 0);
    record_iteration_locked(false, enter, enter);
    lock.unlock();
    maybe_rebuild();
    log_iteration(last_);
    return;
  }

  // Parameters never marked ready: zeros (unless accumulated in an earlier
  // no_sync step), so every bucket can still be reduced and no rank hangs.
  const std::vector<std::size_t> unmarked = unmarked_locked();
  for (std::size_t p : unmarked) {
    if (!marked_window_[p]) {
      zero_bytes(grad(p), params_[p].count() * dtype_size(params_[p].dtype));
      known_zero_[p] = 1;
    }
    --buckets_[layout_.bucket_of[p]]->pending;
  }
  const bool local_status = !unmarked.empty() && !options_.find_unused_parameters;
  std::exception_ptr error;
  const double inline_before = inline_ms_;
  try {
    launch_ready_locked(local_status);
  } catch (...) {
    error = std::current_exception();
  }
  inline_finish_ms_ = inline_ms_ - inline_before;

  // Wait in launch order; a 16-bit bucket is unpacked while later ones are still in flight.
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    if (!bucket.launched) continue;
    try {
      if (bucket.error) std::rethrow_exception(bucket.error);
      if (bucket.work) bucket.work->wait();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
    if (!bucket.done) {
      bucket.done = true;
      bucket.done_at = Clock::now();
    }
    if (!error && bucket.compressed) {
      const LayoutBucket& lb = layout_.buckets[b];
      decompress(bucket.wire16(), bucket.data(), lb.dtype, lb.count,
                 options_.compression == Compression::kFp16);
    }
  }
  bool global_status = local_status;
  const bool status_apart = !needed_.empty() && !device_buckets_ && !buckets_.empty() && !buckets_.back()->compressed;
  if (!error && group_->size() > 1 && status_apart) {
    // Partial reductions leave the bucket's status word unreduced: one word of its own.
    double flag = local_status ? 1.0 : 0.0;
    try {
      group_->all_reduce(&flag, 1, DType::kFloat64, ReduceOp::kMax);
    } catch (...) {
      error = std::current_exception();
    }
    global_status = flag != 0;
  } else if (!error && group_->size() > 1 && !buckets_.empty()) {
    const Bucket& last = *buckets_.back();
    const LayoutBucket& lb = layout_.buckets.back();
    double value = 0;
    if (last.compressed) {
      value = from16(last.wire16()[lb.count], options_.compression == Compression::kFp16);
    } else {
      const char* word = last.data() + lb.count * dtype_size(lb.dtype);
      if (device_buckets_) {
        char host[8] = {};
        try {
          device_copy(host, word, dtype_size(lb.dtype));
        } catch (...) {
          error = std::current_exception();
        }
        value = load_scalar(host, lb.dtype);
      } else {
        value = load_scalar(word, lb.dtype);
      }
    }
    global_status = value != 0;
  }
  const auto done = Clock::now();
  record_iteration_locked(true, enter, done);
  const std::uint64_t iteration = iterations_;
  std::fill(known_zero_.begin(), known_zero_.end(), 0);
  lock.unlock();

  if (error) {
    log_iteration(last_);
    std::rethrow_exception(error);
  }
  if (global_status && !options_.find_unused_parameters) {
    {
      std::lock_guard<std::mutex> relock(mu_);
      observed_order_.clear();  // an incomplete iteration's order is no basis for a rebuild
    }
    if (!unmarked.empty()) {
      throw Error("GradSync: iteration " + std::to_string(iteration) +
                  ": parameters never marked ready on rank " + std::to_string(group_->rank()) +
                  ": " + param_list(unmarked) +
                  "; mark every parameter that has a gradient, or set find_unused_parameters to "
                  "count them as zero "
                  "(every rank's gradients of this iteration are invalid)");
    }
    throw Error("GradSync: iteration " + std::to_string(iteration) +
                ": another rank had parameters that were never marked ready (its error names "
                "them); this rank "
                "marked all of them, but the iteration's gradients are invalid");
  }
  maybe_rebuild();
  log_iteration(last_);
}

void GradSync::record_iteration_locked(bool synced, Clock::time_point enter,
                                       Clock::time_point done) {
  IterationStats s;
  s.iteration = ++iterations_;
  s.synced = synced;
  const auto start = have_backward_start_ ? backward_start_ : enter;
  const auto end = have_last_mark_ ? std::max(last_mark_, start) : start;
  // Communication inside the backward window, which nothing hides: inline
  // collectives run inside mark_ready calls, or (shared sum) waits for blocks
  // other ranks held. It is not compute, and it is exposed as well as
  // whatever finish() waited for.
  const double in_backward = shared() ? shared_wait_ms_ : inline_ms_ - inline_finish_ms_;
  s.backward_compute_ms = std::max(0.0, ms(end - start) - in_backward);
  if (synced) {
    s.exposed_comm_ms = ms(done - enter) + in_backward;
    // The shared sum runs no collective: its communication is its waiting.
    if (shared()) s.comm_ms = s.exposed_comm_ms;
    s.inline_comm_ms = inline_ms_;
    s.buckets = launched_count_;
    s.bytes_on_wire = wire_bytes_;
    if (have_first_launch_) {
      Clock::time_point comm_end = first_launch_;
      for (const auto& b : buckets_) {
        if (b->launched && b->done) comm_end = std::max(comm_end, b->done_at);
      }
      s.comm_ms = ms(comm_end - first_launch_);
      // Inline collectives run between the backward's layers, never beside them.
      s.overlap_ms = inline_ ? 0.0 : std::max(0.0, ms(std::min(end, comm_end) - first_launch_));
    }
    ++synced_iterations_;
    sum_.backward_compute_ms += s.backward_compute_ms;
    sum_.comm_ms += s.comm_ms;
    sum_.overlap_ms += s.overlap_ms;
    sum_.exposed_comm_ms += s.exposed_comm_ms;
    sum_.inline_comm_ms += s.inline_comm_ms;
    sum_.buckets += s.buckets;
    sum_.bytes_on_wire += s.bytes_on_wire;
    // The accumulation window ends with the synced iteration.
    std::fill(marked_window_.begin(), marked_window_.end(), 0);
    std::fill(scaled_.begin(), scaled_.end(), options_.prescaled_grads ? 1 : 0);
  }
  last_ = s;

  // Reset for the next iteration.
  std::fill(marked_.begin(), marked_.end(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    bucket.pending = layout_.buckets[b].slots.size();
    bucket.launched = false;
    bucket.done = false;
    bucket.work.reset();
    bucket.error = nullptr;
  }
  inline_error_ = nullptr;
  inline_ms_ = inline_finish_ms_ = 0;
  shared_wait_ms_ = 0;
  next_launch_ = 0;
  oldest_unfinished_ = 0;
  in_iteration_ = false;
  have_backward_start_ = have_last_mark_ = have_first_launch_ = false;
  wire_bytes_ = 0;
  launched_count_ = 0;
}

void GradSync::maybe_rebuild() {
  if (rebuilt_ || !options_.rebuild_buckets) return;
  rebuilt_ = true;
  std::vector<std::size_t> observed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record_order_ = false;
    observed.swap(observed_order_);
  }
  // Rank 0's order, so every rank builds the same layout.
  std::string bytes;
  if (group_->rank() == 0) {
    detail::Encoder e;
    e.i64(static_cast<std::int64_t>(observed.size()));
    for (auto p : observed) e.i64(static_cast<std::int64_t>(p));
    bytes = e.bytes();
  }
  if (group_->size() > 1) group_->broadcast_object(bytes, 0);
  detail::Decoder d(bytes, "GradSync rebuild");
  std::vector<std::size_t> order0(static_cast<std::size_t>(d.i64()));
  for (auto& p : order0) p = static_cast<std::size_t>(d.i64());

  std::vector<LayoutParam> lp;
  for (const auto& p : params_) lp.push_back({p.count(), p.dtype, p.device});
  BucketLayout fresh = make_bucket_layout(lp, rebuild_order(order0, layout_.order),
                                          options_.first_bucket_bytes, options_.bucket_cap_bytes);
  if (fresh == layout_) {
    if (group_->rank() == 0) log::debug("GradSync: the observed gradient order keeps the layout");
    return;
  }
  apply_layout(std::move(fresh), true);
  ++layout_version_;
  if (group_->rank() == 0) {
    log::info("GradSync: buckets rebuilt from rank 0's gradient order: {}",
              describe_layout(layout_));
  }
}

void GradSync::set_first_bucket_bytes(std::size_t bytes) {
  require_between_iterations("set_first_bucket_bytes");
  if (bytes == 0) throw Error("GradSync: set_first_bucket_bytes: bytes must be > 0");
  if (shared()) {
    throw Error("GradSync: set_first_bucket_bytes: comm_mode shared has no buckets");
  }
  options_.first_bucket_bytes = bytes;
  std::vector<LayoutParam> lp;
  for (const auto& p : params_) lp.push_back({p.count(), p.dtype, p.device});
  BucketLayout fresh = make_bucket_layout(lp, layout_.order, bytes, options_.bucket_cap_bytes);
  if (fresh == layout_) return;
  apply_layout(std::move(fresh), true);
  ++layout_version_;
}

void GradSync::prepare(const std::vector<void*>& param_data,
                       const std::vector<ParamBuffer>& buffers) {
  require_between_iterations("prepare");
  if (param_data.size() != params_.size()) {
    throw Error("GradSync: prepare: " + std::to_string(param_data.size()) +
                " parameter pointers for " + std::to_string(params_.size()) + " parameters");
  }
  std::vector<ParamBuffer> all;
  all.reserve(params_.size() + buffers.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    all.push_back({param_data[i], params_[i].count(), params_[i].dtype});
  all.insert(all.end(), buffers.begin(), buffers.end());
  SyncOptions sync;
  sync.root = 0;
  sync.chunk_bytes = options_.broadcast_chunk_bytes;
  broadcast_params(all, *group_, sync);
}

GradSyncStats GradSync::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  GradSyncStats s;
  s.last = last_;
  s.iterations = iterations_;
  s.synced_iterations = synced_iterations_;
  s.mean.iteration = synced_iterations_;
  s.mean.synced = true;
  if (synced_iterations_ > 0) {
    const double n = static_cast<double>(synced_iterations_);
    s.mean.backward_compute_ms = sum_.backward_compute_ms / n;
    s.mean.comm_ms = sum_.comm_ms / n;
    s.mean.overlap_ms = sum_.overlap_ms / n;
    s.mean.exposed_comm_ms = sum_.exposed_comm_ms / n;
    s.mean.inline_comm_ms = sum_.inline_comm_ms / n;
    s.mean.buckets = sum_.buckets / synced_iterations_;
    s.mean.bytes_on_wire = sum_.bytes_on_wire / synced_iterations_;
  }
  return s;
}

void GradSync::log_iteration(const IterationStats& s) const {
  if (group_->rank() != 0) return;
  const bool due =
      s.iteration <= 10 || (options_.log_every > 0 && s.iteration % options_.log_every == 0);
  if (!due) return;
  if (!s.synced) {
    log::info("GradSync iteration {} (no_sync): backward {:.2f} ms, no communication", s.iteration,
              s.backward_compute_ms);
    return;
  }
  if (shared()) {
    log::info("GradSync iteration {}: backward {:.2f} ms (the sum made inside it), waiting for "
              "other ranks {:.2f} ms (shared sum, no collectives)",
              s.iteration, s.backward_compute_ms, s.exposed_comm_ms);
    return;
  }
  log::info(
      "GradSync iteration {}: backward {:.2f} ms, communication {:.2f} ms, overlap {:.2f} ms, "
      "exposed {:.2f} ms{} "
      "({} buckets, {:.2f} MB)",
      s.iteration, s.backward_compute_ms, s.comm_ms, s.overlap_ms, s.exposed_comm_ms,
      inline_ ? fmt::format(", inline {:.2f} ms", s.inline_comm_ms) : std::string(), s.buckets,
      static_cast<double>(s.bytes_on_wire) / 1e6);
}

}  // namespace ddp
