// A worker for libddp's helper tests (log, metrics, params), run under ddprun
// or, for the logging modes, alone with a faked environment. The first
// argument picks what it does; see usage(). Checks print
// "CHECK <name> ok" or "CHECK <name> FAIL <why>"; the exit code is 1 when a
// check failed. Expected errors print "ERROR <message>".

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ddp/common/error.h"
#include "ddp/ddp.h"
#include "ddp/log.h"
#include "ddp/metrics.h"
#include "ddp/params.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: helpers_worker MODE ...\n"
               "  log rank0|local0      log at every level under the policy (no ddp::init)\n"
               "  collectives           reduce_sum / reduce_mean of scalars and buffers\n"
               "  metrics               average_metrics weighted by count = rank + 1\n"
               "  keys-mismatch         average_metrics where rank 1 has another key\n"
               "  params-mismatch       check_same_params where rank 1 has another shape\n"
               "  params-count          check_same_params where the last rank has one more\n"
               "  sync                  broadcast_params and sync_buffers, several chunk sizes\n"
               "  layout-mismatch       broadcast_params where rank 1 passes another count\n");
  return 64;
}

int g_failed = 0;

void check(bool ok, const std::string& name, const std::string& why = "") {
  std::printf("CHECK %s %s%s%s\n", name.c_str(), ok ? "ok" : "FAIL", ok || why.empty() ? "" : " ",
              ok ? "" : why.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failed;
}

// Runs `call`, which must throw ddp::Error: prints "ERROR <what>" (or "NO
// ERROR" and fails), then checks the group still works after the reported
// error and shuts down. Returns the exit code.
int expect_error_then_usable_group(const std::function<void()>& call) {
  try {
    call();
    std::printf("NO ERROR\n");
    return 1;
  } catch (const ddp::Error& e) {
    std::printf("ERROR %s\n", e.what());
  }
  check(ddp::reduce_sum(1) == ddp::world_size(), "group-usable-after-error");
  ddp::shutdown();
  return g_failed ? 1 : 0;
}

bool near(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b)); }

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

int run_log(const std::string& policy) {
  ddp::log::set_policy(policy == "local0" ? ddp::log::Policy::kLocalRank0
                                          : ddp::log::Policy::kRank0);
  int rank = ddp::rank();
  ddp::log::debug("DEBUG-HIDDEN from {}", rank);
  ddp::log::info("INFO-ONE from {}", rank);
  ddp::log::info_all("INFO-ALL from {}", rank);
  ddp::log::warn("WARN from {}", rank);
  ddp::log::error("ERR from {}", rank);
  ddp::log::set_level(ddp::log::Level::kDebug);
  ddp::log::debug("DEBUG-SHOWN from {}", rank);
  ddp::log::set_level(ddp::log::Level::kError);
  ddp::log::warn("WARN-HIDDEN from {}", rank);
  return 0;
}

int run_collectives() {
  auto group = ddp::init();
  const int r = ddp::rank();
  const int n = ddp::world_size();
  check(group->size() == n && group->rank() == r, "group-identity");

  int isum = ddp::reduce_sum(r + 1);
  check(isum == n * (n + 1) / 2, "reduce_sum-int", "got " + std::to_string(isum));
  std::int64_t big = ddp::reduce_sum(std::int64_t{1} << 40);
  check(big == (std::int64_t{1} << 40) * n, "reduce_sum-int64", "got " + std::to_string(big));
  double dsum = ddp::reduce_sum(0.5 * r, *group);
  check(near(dsum, 0.5 * n * (n - 1) / 2), "reduce_sum-double-group", "got " + num(dsum));
  double mean = ddp::reduce_mean(r);  // an int: the mean is exact in double
  check(near(mean, (n - 1) / 2.0), "reduce_mean-scalar", "got " + num(mean));

  std::vector<float> buf = {static_cast<float>(r), 1.0f, static_cast<float>(2 * r), -1.0f};
  ddp::reduce_sum(std::span<float>(buf));
  float s = static_cast<float>(n * (n - 1) / 2);
  check(buf[0] == s && buf[1] == n && buf[2] == 2 * s && buf[3] == -n, "reduce_sum-buffer");
  std::vector<double> dbuf = {static_cast<double>(r), 10.0};
  ddp::reduce_mean(std::span<double>(dbuf), *group);
  check(near(dbuf[0], (n - 1) / 2.0) && near(dbuf[1], 10.0), "reduce_mean-buffer",
        "got " + num(dbuf[0]));
  std::vector<std::int32_t> ibuf = {r * 3, 7};
  ddp::reduce_mean(ibuf.data(), ibuf.size(), ddp::DType::kInt32);
  check(ibuf[0] == 3 * (n * (n - 1) / 2) / n && ibuf[1] == 7, "reduce_mean-int-truncates");
  std::printf("SUM int=%d double=%s MEAN %s\n", isum, num(dsum).c_str(), num(mean).c_str());
  ddp::shutdown();
  return g_failed ? 1 : 0;
}

int run_metrics() {
  auto group = ddp::init();
  const int r = ddp::rank();
  const int n = ddp::world_size();
  // Rank r saw r + 1 samples with loss 1 + r and accuracy r / 10.
  ddp::Metrics mine = {{"loss", 1.0 + r}, {"acc", r / 10.0}};
  double count = r + 1;
  auto avg = ddp::average_metrics(mine, count);
  double weight = 0, loss = 0, acc = 0;
  for (int k = 0; k < n; ++k) {
    weight += k + 1;
    loss += (1.0 + k) * (k + 1);
    acc += (k / 10.0) * (k + 1);
  }
  check(avg.size() == 2, "metrics-keys");
  check(near(avg["loss"], loss / weight), "metrics-loss",
        "got " + num(avg["loss"]) + " want " + num(loss / weight));
  check(near(avg["acc"], acc / weight), "metrics-acc",
        "got " + num(avg["acc"]) + " want " + num(acc / weight));
  std::printf("METRIC loss=%s acc=%s\n", num(avg["loss"]).c_str(), num(avg["acc"]).c_str());
  // Unweighted (count 1) is the plain mean; empty dictionaries agree too.
  auto plain = ddp::average_metrics({{"x", static_cast<double>(r)}});
  check(near(plain["x"], (n - 1) / 2.0), "metrics-unweighted");
  check(ddp::average_metrics({}, 1.0).empty(), "metrics-empty");
  // Counts summing to 0 are an error on every rank (and no hang).
  try {
    ddp::average_metrics({{"x", 1.0}}, 0.0);
    check(false, "metrics-zero-count", "no error");
  } catch (const ddp::Error& e) {
    check(std::string(e.what()).find("sum to 0") != std::string::npos, "metrics-zero-count",
          e.what());
  }
  ddp::shutdown();
  return g_failed ? 1 : 0;
}

int run_keys_mismatch() {
  ddp::init();
  ddp::Metrics mine = {{"loss", 1.0}, {"acc", 0.5}};
  if (ddp::rank() == 1) {
    mine.erase("acc");
    mine["accuracy"] = 0.5;
  }
  return expect_error_then_usable_group([&] { ddp::average_metrics(mine, 1.0); });
}

std::vector<ddp::ParamInfo> model() {
  return {{"fc1.weight", {20, 10}, ddp::DType::kFloat32},
          {"fc1.bias", {20}, ddp::DType::kFloat32},
          {"fc2.weight", {10, 21}, ddp::DType::kFloat32},
          {"fc2.bias", {10}, ddp::DType::kFloat32}};
}

int expect_param_error(const std::vector<ddp::ParamInfo>& params) {
  return expect_error_then_usable_group([&] { ddp::check_same_params(params); });
}

int run_params_mismatch() {
  ddp::init();
  ddp::check_same_params(model());  // the same everywhere: no error
  auto params = model();
  if (ddp::rank() == 1) params[2].shape = {10, 20};
  return expect_param_error(params);
}

int run_params_count() {
  ddp::init();
  auto params = model();
  if (ddp::rank() == ddp::world_size() - 1)
    params.push_back({"fc3.weight", {5, 10}, ddp::DType::kFloat16});
  return expect_param_error(params);
}

// Buffers of several dtypes and sizes, filled with values that tell ranks
// apart; `big` elements in the float64 one.
struct State {
  std::vector<float> f32;
  std::vector<std::int64_t> i64;
  std::vector<std::uint16_t> f16;
  std::vector<double> f64;
  std::vector<std::uint8_t> u8;

  State(int rank, std::size_t big) : f32(100), i64(10), f16(7), f64(big), u8(5) {
    for (std::size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<float>(rank * 1000 + i);
    for (std::size_t i = 0; i < i64.size(); ++i) i64[i] = rank * 100 + static_cast<std::int64_t>(i);
    for (std::size_t i = 0; i < f16.size(); ++i)
      f16[i] = ddp::float_to_half(static_cast<float>(rank + i));
    for (std::size_t i = 0; i < f64.size(); ++i) f64[i] = rank + i * 0.5;
    for (std::size_t i = 0; i < u8.size(); ++i) u8[i] = static_cast<std::uint8_t>(rank * 10 + i);
  }
  std::vector<ddp::ParamBuffer> buffers() {
    return {{f32.data(), f32.size(), ddp::DType::kFloat32},
            {i64.data(), i64.size(), ddp::DType::kInt64},
            {f16.data(), f16.size(), ddp::DType::kFloat16},
            {nullptr, 0, ddp::DType::kFloat32},
            {f64.data(), f64.size(), ddp::DType::kFloat64},
            {u8.data(), u8.size(), ddp::DType::kUInt8}};
  }
  bool operator==(const State&) const = default;
};

int run_sync() {
  auto group = ddp::init();
  const int r = ddp::rank();
  const int n = ddp::world_size();
  // The default chunk (everything packed, 2.4 MB of float64 in one piece),
  // 4 KiB (packing, and the float64 buffer in 59 slices), 3 bytes (one
  // element per collective: kept small).
  struct Case {
    std::size_t chunk, big;
  };
  for (Case c : {Case{std::size_t{250} << 20, 300000}, Case{4096, 30000}, Case{3, 20}}) {
    std::string tag = "chunk" + std::to_string(c.chunk);
    ddp::SyncOptions options;
    options.chunk_bytes = c.chunk;
    for (int root : {0, n - 1}) {
      State s(r, c.big);
      options.root = root;
      ddp::broadcast_params(s.buffers(), options);
      check(s == State(root, c.big), "broadcast-" + tag + "-root" + std::to_string(root));
    }
    options.root = 0;
    // kAverage: floating buffers become the mean, integer ones rank 0's values.
    State s(r, c.big);
    ddp::sync_buffers(s.buffers(), ddp::SyncMode::kAverage, *group, options);
    State zero(0, c.big);
    double mean_rank = (n - 1) / 2.0;
    bool ok = s.i64 == zero.i64 && s.u8 == zero.u8;
    for (std::size_t i = 0; i < s.f32.size(); ++i) ok = ok && near(s.f32[i], mean_rank * 1000 + i);
    for (std::size_t i = 0; i < s.f64.size(); ++i) ok = ok && near(s.f64[i], mean_rank + i * 0.5);
    for (std::size_t i = 0; i < s.f16.size(); ++i)
      ok = ok && near(ddp::half_to_float(s.f16[i]), mean_rank + i);
    check(ok, "sync-average-" + tag);
    State b(r, c.big);
    ddp::sync_buffers(b.buffers(), ddp::SyncMode::kBroadcast, options);
    check(b == zero, "sync-broadcast-" + tag);
  }
  // The parameters agree: check_same_params passes.
  ddp::check_same_params({{"w", {2, 3}, ddp::DType::kFloat32}, {"b", {3}, ddp::DType::kFloat32}});
  check(true, "check_same_params-agree");
  ddp::shutdown();
  return g_failed ? 1 : 0;
}

int run_layout_mismatch() {
  ddp::init();
  std::vector<float> data(ddp::rank() == 1 ? 99 : 100, 1.0f);
  try {
    ddp::broadcast_params({{data.data(), data.size(), ddp::DType::kFloat32}});
    std::printf("NO ERROR\n");
    return 1;
  } catch (const ddp::Error& e) {
    std::printf("ERROR %s\n", e.what());
  }
  ddp::shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string mode = argv[1];
  try {
    if (mode == "log" && argc == 3) return run_log(argv[2]);
    if (mode == "collectives") return run_collectives();
    if (mode == "metrics") return run_metrics();
    if (mode == "keys-mismatch") return run_keys_mismatch();
    if (mode == "params-mismatch") return run_params_mismatch();
    if (mode == "params-count") return run_params_count();
    if (mode == "sync") return run_sync();
    if (mode == "layout-mismatch") return run_layout_mismatch();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "helpers_worker %s: unexpected error: %s\n", mode.c_str(), e.what());
    return 2;
  }
  return usage();
}
