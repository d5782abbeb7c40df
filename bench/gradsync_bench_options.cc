#include "gradsync_bench_options.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

namespace bench {
namespace {

std::optional<int> parse_int(const std::string& text) {
  int v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end) return std::nullopt;
  return v;
}

std::optional<double> parse_double(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A comma-separated list of sizes in MiB, each >= 0 (0: the no-overlap reference).
std::optional<std::vector<double>> parse_list(const std::string& text) {
  std::vector<double> out;
  if (text.empty()) return out;  // none of this kind
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    auto v = parse_double(item);
    if (!v || *v < 0) return std::nullopt;
    out.push_back(*v);
  }
  if (text.back() == ',') return std::nullopt;
  return out;
}

// Sets one flag's value; returns what is wrong with it, or "".
std::string apply(GradSyncBenchConfig& c, const std::string& flag, const std::string& value) {
  struct IntFlag {
    const char* name;
    int* field;
    int min;
  };
  const IntFlag ints[] = {{"--layers", &c.layers, 1}, {"--width", &c.width, 1},
                          {"--batch", &c.batch, 1},   {"--rounds", &c.rounds, 1},
                          {"--steps", &c.steps, 1},   {"--warmup", &c.warmup, 0}};
  for (const auto& f : ints) {
    if (flag != f.name) continue;
    auto v = parse_int(value);
    if (!v || *v < f.min || *v > 1000000) {
      return flag + " must be a whole number from " + std::to_string(f.min) + " to 1000000, not '" +
             value + "'";
    }
    *f.field = *v;
    return "";
  }
  if (flag == "--first" || flag == "--shared_block_kib") {
    auto v = parse_double(value);
    if (!v || *v <= 0) return flag + " must be a number above 0, not '" + value + "'";
    (flag == "--first" ? c.first_mib : c.shared_block_kib) = *v;
    return "";
  }
  if (flag == "--caps" || flag == "--inline_caps") {
    auto v = parse_list(value);
    if (!v)
      return flag + " must be a list of sizes in MiB like 1,4,25 (0: no overlap), not '" + value +
             "'";
    (flag == "--caps" ? c.caps_mib : c.inline_caps_mib) = *v;
    return "";
  }
  if (flag == "--shared") {
    if (value != "0" && value != "1") return "--shared must be 0 or 1, not '" + value + "'";
    c.shared = value == "1";
    return "";
  }
  if (flag == "--compression") {
    if (value == "none")
      c.compression = ddp::Compression::kNone;
    else if (value == "fp16")
      c.compression = ddp::Compression::kFp16;
    else if (value == "bf16")
      c.compression = ddp::Compression::kBf16;
    else
      return "--compression must be none, fp16 or bf16, not '" + value + "'";
    return "";
  }
  return "unknown flag '" + flag + "' (see --help)";
}

}  // namespace

std::string gradsync_bench_usage() {
  return "usage: gradsync_bench [--device] [--layers N] [--width N] [--batch N] [--rounds N] "
         "[--steps N] [--warmup N] [--first MiB] [--caps MiB,MiB,...] [--inline_caps MiB,...] "
         "[--shared 0|1] [--shared_block_kib KiB] [--compression none|fp16|bf16]\n"
         "  --device: model and gradient buckets on the CUDA device LOCAL_RANK (backend nccl);\n"
         "            model default " +
         std::to_string(kDeviceLayers) + " x " + std::to_string(kDeviceWidth) + ", batch " +
         std::to_string(kDeviceBatch) + "\n";
}

GradSyncBenchArgs parse_gradsync_bench_args(int argc, const char* const* argv) {
  GradSyncBenchArgs out;
  GradSyncBenchConfig& c = out.config;
  // The device's model defaults, which the flags may then override.
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--device") continue;
    c.layers = kDeviceLayers;
    c.width = kDeviceWidth;
    c.batch = kDeviceBatch;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      out.help = true;
      return out;
    }
    if (flag == "--device") {
      c.device = true;
      continue;
    }
    if (i + 1 >= argc) {
      out.error = flag.rfind("--", 0) == 0 ? flag + " needs a value"
                                           : "unknown argument '" + flag + "' (see --help)";
      return out;
    }
    out.error = apply(c, flag, argv[++i]);
    if (!out.error.empty()) return out;
  }
  if (c.device) {
    if (c.compression != ddp::Compression::kNone) {
      out.error = "--compression is for host buckets; --device buckets are never compressed";
      return out;
    }
    c.shared = false;  // the shared sum maps host memory
  }
  if (c.caps_mib.empty() && c.inline_caps_mib.empty() && !c.shared) {
    out.error = "nothing to measure: --caps and --inline_caps are empty and --shared is 0";
  }
  return out;
}

}  // namespace bench
