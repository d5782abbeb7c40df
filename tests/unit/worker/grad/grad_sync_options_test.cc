// GradSync with every rank a thread: gradient compression (fp16, bf16) and
// its rounding bound, every floating dtype, the cross-rank consistency checks
// and the misuse they name, prepare() (rank 0's parameters and buffers), and
// the per-iteration statistics and rank-0 logging.

#include "grad_sync_test_support.h"

namespace ddp {
namespace {

using namespace ::ddp::grad_sync_test;
using namespace std::chrono_literals;

// ------------------------------------------------------------ compression

struct CompressionCase {
  int world;
  Compression compression;
};
void PrintTo(const CompressionCase& c, std::ostream* os) {
  *os << compression_name(c.compression) << ", world " << c.world;
}

class CompressionBound : public ::testing::TestWithParam<CompressionCase> {};

TEST_P(CompressionBound, MeanStaysWithinTheRoundingBoundOfTheWireType) {
  const auto [world, compression] = GetParam();
  // |x| <= 1. Dividing by the world size before the conversion costs one
  // rounding of at most u * |x| / N; each of the N - 1 sums in 16 bits one
  // more of at most u * 1 (u = 2^-11 for fp16, 2^-8 for bf16). So the error is
  // at most N * u; we allow twice that.
  const double u = compression == Compression::kFp16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  const double bound = 2 * world * u;
  auto value = [](int rank, std::size_t p, std::size_t i) {
    std::mt19937 gen(static_cast<unsigned>(rank * 7919 + p * 104729 + i));
    return std::uniform_real_distribution<double>(-1, 1)(gen);
  };
  std::vector<GradParam> params = {{"a", {1000}}, {"b", {37}}, {"c", {50}, DType::kFloat64}};
  on_ranks(world, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    options.compression = compression;
    GradSync sync(pg, params, options);
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t i = 0; i < params[p].count(); ++i) {
        if (params[p].dtype == DType::kFloat32) {
          static_cast<float*>(sync.grad(p))[i] = static_cast<float>(value(pg.rank(), p, i));
        } else {
          static_cast<double*>(sync.grad(p))[i] = value(pg.rank(), p, i);
        }
      }
      sync.mark_ready(p);
    }
    sync.finish();
    EXPECT_EQ(sync.stats().last.bytes_on_wire, 2 * (1000 + 37 + 50 + 1u))
        << "16 bits per element (+ status word)";
    std::size_t inexact = 0;
    double worst = 0;
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t i = 0; i < params[p].count(); ++i) {
        double want = 0;
        for (int r = 0; r < world; ++r) want += value(r, p, i);
        want /= world;
        double got = params[p].dtype == DType::kFloat32 ? static_cast<float*>(sync.grad(p))[i]
                                                        : static_cast<double*>(sync.grad(p))[i];
        worst = std::max(worst, std::abs(got - want));
        inexact += std::abs(got - want) > 1e-7 ? 1 : 0;
      }
    }
    EXPECT_LE(worst, bound);
    EXPECT_GT(inexact, 0u) << "nothing was rounded: was the bucket compressed at all?";
  });
}

INSTANTIATE_TEST_SUITE_P(WireTypes, CompressionBound,
                         ::testing::Values(CompressionCase{2, Compression::kFp16},
                                           CompressionCase{4, Compression::kFp16},
                                           CompressionCase{2, Compression::kBf16},
                                           CompressionCase{4, Compression::kBf16}),
                         [](const ::testing::TestParamInfo<CompressionCase>& info) {
                           return std::string(compression_name(info.param.compression)) + "_world" +
                                  std::to_string(info.param.world);
                         });

TEST(GradSyncCompression, WireValuesAreExactlyTheScalarRoundingsOfTheScaledGradients) {
  // With 2 ranks every element is one 16-bit sum of the two ranks' halves:
  // the result must be, bit for bit, what types.h's scalar conversions give
  // (the vectorised conversions included; 1037 is no multiple of 8).
  for (Compression compression : {Compression::kFp16, Compression::kBf16}) {
    SCOPED_TRACE(compression_name(compression));
    const bool half = compression == Compression::kFp16;
    auto to16 = [&](float v) { return half ? float_to_half(v) : float_to_bfloat16(v); };
    auto from16 = [&](std::uint16_t v) { return half ? half_to_float(v) : bfloat16_to_float(v); };
    auto value = [](int rank, std::size_t i) {
      return std::ldexp(static_cast<float>((i * 2654435761u + rank * 40503u) % 20011) - 10005.0f,
                        static_cast<int>(i % 23) - 20);
    };
    on_ranks(2, [&](ProcessGroup& pg) {
      GradSyncOptions options;
      options.log_every = 0;
      options.compression = compression;
      GradSync sync(pg, {{"w", {1037}}}, options);
      for (std::size_t i = 0; i < 1037; ++i) sync.grad_view(0)[i] = value(pg.rank(), i);
      sync.mark_ready(0);
      sync.finish();
      for (std::size_t i = 0; i < 1037; ++i) {
        const float want =
            from16(to16(from16(to16(value(0, i) * 0.5f)) + from16(to16(value(1, i) * 0.5f))));
        ASSERT_EQ(sync.grad_view(0)[i], want) << "element " << i;
      }
    });
  }
}

TEST(GradSyncCompression, Fp16DividesBeforeSummingSoLargeGradientsDoNotOverflow) {
  // 4 x 30000 = 120000 overflows fp16 (max 65504); 4 x 7500 does not.
  on_ranks(4, [](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    options.compression = Compression::kFp16;
    GradSync sync(pg, {{"w", {8}}}, options);
    std::fill(sync.grad_view(0), sync.grad_view(0) + 8, 30000.0f);
    sync.mark_ready(0);
    sync.finish();
    for (int i = 0; i < 8; ++i) EXPECT_NEAR(sync.grad_view(0)[i], 30000.0, 30000.0 / 1024);
  });
}

// ------------------------------------------------------------ dtypes

TEST(GradSyncDtypes, EveryFloatingDtypeIsGroupedApartAndAveraged) {
  std::vector<GradParam> params = {{"a", {6}, DType::kFloat32},
                                   {"b", {5}, DType::kFloat64},
                                   {"c", {7}, DType::kFloat16},
                                   {"d", {4}, DType::kBFloat16},
                                   {"e", {3}, DType::kFloat32}};
  auto store = [](void* base, DType dtype, std::size_t i, double v) {
    char* p = static_cast<char*>(base) + i * dtype_size(dtype);
    if (dtype == DType::kFloat32) {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
    } else if (dtype == DType::kFloat64) {
      std::memcpy(p, &v, 8);
    } else {
      std::uint16_t h = dtype == DType::kFloat16 ? float_to_half(static_cast<float>(v))
                                                 : float_to_bfloat16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
    }
  };
  auto load = [](const void* base, DType dtype, std::size_t i) -> double {
    const char* p = static_cast<const char*>(base) + i * dtype_size(dtype);
    if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    if (dtype == DType::kFloat64) {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    std::uint16_t h;
    std::memcpy(&h, p, 2);
    return dtype == DType::kFloat16 ? half_to_float(h) : bfloat16_to_float(h);
  };
  // Exact in every dtype: (r + 1) * k with small k; the mean over 2 ranks is 1.5 * k.
  auto value = [](int rank, std::size_t p, std::size_t i) {
    return (rank + 1) * static_cast<double>(i % 4 + p);
  };
  on_ranks(2, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 0;
    GradSync sync(pg, params, options);
    for (const auto& b : sync.layout().buckets) {
      for (const auto& s : b.slots)
        EXPECT_EQ(params[s.param].dtype, b.dtype) << params[s.param].name;
    }
    EXPECT_EQ(sync.layout().buckets.size(), 4u);
    for (bool copy_in : {false, true}) {
      SCOPED_TRACE(copy_in ? "set_grad" : "views");
      for (std::size_t p = 0; p < params.size(); ++p) {
        std::vector<char> src(params[p].count() * dtype_size(params[p].dtype));
        void* dst = copy_in ? static_cast<void*>(src.data()) : sync.grad(p);
        for (std::size_t i = 0; i < params[p].count(); ++i)
          store(dst, params[p].dtype, i, value(pg.rank(), p, i));
        if (copy_in) sync.set_grad(p, src.data());
        sync.mark_ready(p);
      }
      sync.finish();
      for (std::size_t p = 0; p < params.size(); ++p) {
        for (std::size_t i = 0; i < params[p].count(); ++i) {
          EXPECT_EQ(load(sync.grad(p), params[p].dtype, i), 1.5 * static_cast<double>(i % 4 + p))
              << params[p].name << "[" << i << "]";
        }
      }
    }
  });
}

// ------------------------------------------------------------ consistency checks

TEST(GradSyncChecks, ParameterMismatchIsReportedOnEveryRankWithTheRankThatHasIt) {
  std::vector<std::string> errors(3);
  on_ranks(3, [&](ProcessGroup& pg) {
    std::vector<GradParam> params = {{"fc.bias", {4}}, {"fc.weight", {4, pg.rank() == 2 ? 6 : 5}}};
    errors[pg.rank()] = error_of([&] { GradSync sync(pg, params); });
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(has(
        errors[r],
        "check_same_params: parameter 1 'fc.weight': rank 2 has shape [4, 6], rank 0 has [4, 5]"))
        << "rank " << r << ": " << errors[r];
  }
}

TEST(GradSyncChecks, DifferentOptionsAreNamedBeforeAnyCollectiveCanMismatch) {
  std::vector<std::string> errors(2);
  on_ranks(2, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    if (pg.rank() == 1) options.bucket_cap_bytes = 2048;
    errors[pg.rank()] = error_of([&] { GradSync sync(pg, three_params(), options); });
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(has(errors[r],
                    "options differ across ranks: rank 1 has bucket_cap_bytes=2048, rank 0 has "
                    "bucket_cap_bytes=26214400"))
        << errors[r];
  }
}

TEST(GradSyncChecks, ALocalProblemIsReportedOnEveryRank) {
  std::vector<std::string> errors(2);
  on_ranks(2, [&](ProcessGroup& pg) {
    std::vector<GradParam> params = three_params();
    if (pg.rank() == 1) params[2].device = 0;  // a device parameter with gloo
    errors[pg.rank()] = error_of([&] { GradSync sync(pg, params); });
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(
        has(errors[r],
            "GradSync: rank 1: parameter 2 'fc3.weight' is on cuda:0, but backend gloo reduces "
            "host memory"))
        << errors[r];
  }
}

TEST(GradSyncChecks, MarkingTwiceInOneIterationNamesTheParameter) {
  auto pg = ProcessGroup::create(0, 1, nullptr, ProcessGroupOptions::of("local"));
  GradSyncOptions options;
  options.log_every = 0;
  GradSync sync(*pg, three_params(), options);
  sync.mark_ready(0);
  std::string e = error_of([&] { sync.mark_ready(0); });
  EXPECT_TRUE(has(e, "parameter 'fc1.weight' (index 0) was already marked ready in iteration 1"))
      << e;
  EXPECT_TRUE(has(e, "call finish()")) << e;
  EXPECT_TRUE(has(error_of([&] { sync.set_grad(0, std::vector<float>(4).data()); }),
                  "already marked ready"));
  sync.mark_ready(1);
  sync.mark_ready(2);
  sync.finish();
  sync.mark_ready(0);  // a new iteration
  sync.mark_ready(1);
  sync.mark_ready(2);
  sync.finish();
}

TEST(GradSyncChecks, BadIndicesFrozenParametersAndMisuseAreNamed) {
  auto pg = ProcessGroup::create(0, 1, nullptr, ProcessGroupOptions::of("local"));
  GradSyncOptions options;
  options.log_every = 0;
  std::vector<GradParam> params = {
      {"w", {3}}, {"steps", {}, DType::kInt64, -1, false}, {"d", {2}, DType::kFloat64}};
  GradSync sync(*pg, params, options);
  EXPECT_EQ(sync.layout().bucket_of[1], BucketLayout::kNone);
  EXPECT_TRUE(has(error_of([&] { sync.mark_ready(9); }),
                  "parameter index 9 is out of range (3 parameters)"));
  EXPECT_TRUE(has(error_of([&] { sync.grad(1); }), "'steps' (index 1) is frozen"));
  EXPECT_TRUE(has(error_of([&] { sync.mark_ready(1); }), "'steps' (index 1) is frozen"));
  EXPECT_TRUE(has(error_of([&] { sync.grad_view(2); }), "'d' is float64, not float32"));
  EXPECT_TRUE(has(error_of([&] { sync.index_of("nope"); }), "no parameter is called 'nope'"));
  EXPECT_EQ(sync.index_of("d"), 2u);
  sync.mark_ready(0);
  EXPECT_TRUE(has(error_of([&] { sync.zero_grad(); }), "zero_grad was called during iteration 1"));
  sync.mark_ready(2);
  sync.finish();
  sync.zero_grad();

  std::vector<GradParam> bad = {{"count", {2}, DType::kInt32}};
  EXPECT_TRUE(has(error_of([&] { GradSync s(*pg, bad); }), "parameter 0 'count' has dtype int32"));
  std::vector<GradParam> twice = {{"x", {1}}, {"x", {1}}};
  EXPECT_TRUE(has(error_of([&] { GradSync s(*pg, twice); }), "names must be unique"));
  GradSyncOptions zero_cap;
  zero_cap.bucket_cap_bytes = 0;
  EXPECT_TRUE(has(error_of([&] { GradSync s(*pg, three_params(), zero_cap); }),
                  "bucket_cap_bytes must be > 0"));
}

// ------------------------------------------------------------ prepare

TEST(GradSyncPrepare, ParametersAndBuffersBecomeRankZerosInSmallChunks) {
  on_ranks(3, [](ProcessGroup& pg) {
    const float r = static_cast<float>(pg.rank());
    std::vector<float> w(10, r), b(3, r * 2);
    std::int64_t steps = pg.rank() + 5;
    std::vector<double> running_mean(4, r * 3);
    std::vector<GradParam> params = {
        {"w", {10}}, {"b", {3}}, {"steps", {}, DType::kInt64, -1, false}};
    GradSyncOptions options;
    options.log_every = 0;
    options.broadcast_chunk_bytes = 16;  // every buffer in several collectives
    GradSync sync(pg, params, options);
    sync.prepare({w.data(), b.data(), &steps},
                 {{running_mean.data(), running_mean.size(), DType::kFloat64}});
    for (float v : w) EXPECT_EQ(v, 0.0f);
    for (float v : b) EXPECT_EQ(v, 0.0f);
    EXPECT_EQ(steps, 5);
    for (double v : running_mean) EXPECT_EQ(v, 0.0);
    EXPECT_TRUE(
        has(error_of([&] { sync.prepare({w.data()}); }), "1 parameter pointers for 3 parameters"));
  });
}

// ------------------------------------------------------------ statistics and logging

TEST(GradSyncStats, FiguresDescribeTheIterationAndRankZeroLogsOnSchedule) {
  std::ostringstream out, err;
  log::set_sinks([&out](std::string_view line) { out << line; },
                 [&err](std::string_view line) { err << line; });
  const int kIterations = 25;
  on_ranks(2, [&](ProcessGroup& pg) {
    GradSyncOptions options;
    options.log_every = 5;
    options.first_bucket_bytes = 16;
    GradSync sync(pg, three_params(), options);
    for (int it = 0; it < kIterations; ++it) {
      sync.begin_backward();
      for (std::size_t p = 0; p < 3; ++p) {
        std::this_thread::sleep_for(1ms);  // "compute"
        sync.mark_ready(p);
      }
      sync.finish();
      GradSyncStats s = sync.stats();
      EXPECT_EQ(s.last.iteration, static_cast<std::uint64_t>(it + 1));
      EXPECT_TRUE(s.last.synced);
      EXPECT_EQ(s.last.buckets, sync.layout().buckets.size());
      EXPECT_EQ(s.last.bytes_on_wire, (12u + 1u) * 4u);
      EXPECT_GE(s.last.backward_compute_ms, 2.5);
      EXPECT_GE(s.last.comm_ms, 0.0);
      EXPECT_GE(s.last.overlap_ms, 0.0);
      EXPECT_LE(s.last.overlap_ms, s.last.comm_ms + 1e-9);
      EXPECT_GE(s.last.exposed_comm_ms, 0.0);
    }
    GradSyncStats s = sync.stats();
    EXPECT_EQ(s.iterations, static_cast<std::uint64_t>(kIterations));
    EXPECT_EQ(s.synced_iterations, static_cast<std::uint64_t>(kIterations));
    EXPECT_EQ(s.mean.iteration, static_cast<std::uint64_t>(kIterations));
    EXPECT_GE(s.mean.backward_compute_ms, 2.5);
  });
  log::reset_sinks();
  std::vector<std::string> logged;
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("GradSync iteration ", 0) == 0)
      logged.push_back(line.substr(19, line.find(':') - 19));
  }
  // Iterations 1-10, then every 5th; only rank 0 logs (each line once).
  EXPECT_EQ(logged, (std::vector<std::string>{"1", "2", "3", "4", "5", "6", "7", "8", "9", "10",
                                              "15", "20", "25"}))
      << out.str();
  EXPECT_TRUE(has(out.str(), "ms, communication")) << out.str();
  std::size_t constructed = 0;
  for (std::size_t at = 0; (at = out.str().find("GradSync: 3 parameters", at)) != std::string::npos;
       ++at)
    ++constructed;
  EXPECT_EQ(constructed, 1u) << out.str();
}

}  // namespace
}  // namespace ddp
