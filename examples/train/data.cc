#include "data.h"

#include <cblas.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "ddp/common/error.h"
#include "random.h"

namespace train {
namespace {

constexpr int kTeacherHidden = 64;
constexpr float kRegressionNoise = 0.05f;
// Streams of the seed (Random's second argument).
constexpr std::uint64_t kFeatureStream = 1, kTeacherStream = 2, kNoiseStream = 3;
// Samples generated per teacher GEMM (bounds the scratch memory).
constexpr std::int64_t kChunk = 4096;

// The digits: 8x8 pixels of 0..16, 10 classes; 1 in 5 held out, chosen by a
// permutation of this seed (not --seed: every run tests on the same images).
constexpr int kPixels = 64, kDigitClasses = 10;
constexpr float kMaxPixel = 16;
constexpr std::uint64_t kSplitSeed = 0x5EED;

}  // namespace

void Dataset::gather(std::span<const std::int64_t> indices, Batch& batch) const {
  const auto in = static_cast<std::size_t>(input_dim);
  const auto out = static_cast<std::size_t>(output_dim);
  const std::size_t n = indices.size();
  batch.size = static_cast<int>(n);
  batch.x.resize(n * in);
  if (task == Task::kRegression) {
    batch.y.resize(n * out);
  } else {
    batch.labels.resize(n);
  }
  for (std::size_t r = 0; r < n; ++r) {
    const std::int64_t i = indices[r];
    if (i < 0 || i >= size()) {
      throw ddp::Error("Dataset: index " + std::to_string(i) + " outside [0, " +
                       std::to_string(size()) + ")");
    }
    const auto u = static_cast<std::size_t>(i);
    std::memcpy(batch.x.data() + r * in, x.data() + u * in, in * sizeof(float));
    if (task == Task::kRegression) {
      std::memcpy(batch.y.data() + r * out, y.data() + u * out, out * sizeof(float));
    } else {
      batch.labels[r] = labels[u];
    }
  }
}

Dataset make_synthetic(Task task, std::int64_t size, int input_dim, int output_dim,
                       std::uint64_t seed) {
  Dataset d{task, input_dim, output_dim, {}, {}, {}};
  const auto n = static_cast<std::size_t>(size);
  const auto in = static_cast<std::size_t>(input_dim);
  const auto out = static_cast<std::size_t>(output_dim);
  d.x.resize(n * in);
  Random features(seed, kFeatureStream);
  for (auto& v : d.x) v = features.normal();

  // The teacher: W1 [64 x in], W2 [out x 64], scaled so tanh is not saturated
  // and the outputs have unit-order spread.
  Random teacher(seed, kTeacherStream);
  std::vector<float> w1(kTeacherHidden * in), w2(out * kTeacherHidden);
  const float s1 = 1.0f / std::sqrt(static_cast<float>(in));
  const float s2 = 1.5f / std::sqrt(static_cast<float>(kTeacherHidden));
  for (auto& v : w1) v = teacher.normal() * s1;
  for (auto& v : w2) v = teacher.normal() * s2;

  if (task == Task::kRegression) {
    d.y.resize(n * out);
  } else {
    d.labels.resize(n);
  }
  Random noise(seed, kNoiseStream);
  std::vector<float> h(static_cast<std::size_t>(kChunk) * kTeacherHidden);
  std::vector<float> t(static_cast<std::size_t>(kChunk) * out);
  for (std::int64_t begin = 0; begin < size; begin += kChunk) {
    const int rows = static_cast<int>(std::min(kChunk, size - begin));
    const float* xb = d.x.data() + static_cast<std::size_t>(begin) * in;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, kTeacherHidden, input_dim, 1.0f, xb,
                input_dim, w1.data(), input_dim, 0.0f, h.data(), kTeacherHidden);
    for (std::size_t k = 0; k < static_cast<std::size_t>(rows) * kTeacherHidden; ++k) {
      h[k] = std::tanh(h[k]);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, output_dim, kTeacherHidden, 1.0f,
                h.data(), kTeacherHidden, w2.data(), kTeacherHidden, 0.0f, t.data(), output_dim);
    for (int r = 0; r < rows; ++r) {
      const float* row = t.data() + static_cast<std::size_t>(r) * out;
      const auto i = static_cast<std::size_t>(begin) + static_cast<std::size_t>(r);
      if (task == Task::kRegression) {
        for (std::size_t j = 0; j < out; ++j)
          d.y[i * out + j] = row[j] + kRegressionNoise * noise.normal();
      } else {
        d.labels[i] = static_cast<std::int32_t>(std::max_element(row, row + out) - row);
      }
    }
  }
  return d;
}

Data load_digits(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    throw ddp::Error("cannot open " + path + ": " + std::strerror(errno) +
                     " (install Debian's python3-sklearn, or give --data_file)");
  }
  std::string text;
  char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(file, buffer, sizeof buffer)) > 0)
    text.append(buffer, static_cast<std::size_t>(got));
  int error = Z_OK;
  const std::string gz_error = got < 0 ? gzerror(file, &error) : "";
  gzclose(file);
  if (got < 0) throw ddp::Error(path + ": " + gz_error);

  // One image per line: 64 pixels, then the label, comma-separated.
  Dataset all{Task::kClassification, kPixels, kDigitClasses, {}, {}, {}};
  std::replace(text.begin(), text.end(), ',', ' ');
  std::istringstream lines(text);
  int line_no = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_no;
    if (line.find_first_not_of(" \r") == std::string::npos) continue;
    std::istringstream in(line);
    double v[kPixels + 1];
    int n = 0;
    while (n <= kPixels && in >> v[n]) ++n;
    std::string rest;
    const auto pixel = [](double p) { return p >= 0 && p <= kMaxPixel; };
    if (n != kPixels + 1 || in >> rest || !std::all_of(v, v + kPixels, pixel) || v[kPixels] < 0 ||
        v[kPixels] >= kDigitClasses || v[kPixels] != std::floor(v[kPixels])) {
      throw ddp::Error(path + ":" + std::to_string(line_no) +
                       ": expected 64 pixel values 0..16 and a label 0..9, comma-separated");
    }
    for (int k = 0; k < kPixels; ++k) all.x.push_back(static_cast<float>(v[k]) / kMaxPixel);
    all.labels.push_back(static_cast<std::int32_t>(v[kPixels]));
  }
  const std::int64_t n = all.size();
  if (n < 10) throw ddp::Error(path + ": " + std::to_string(n) + " images, too few to split");
  // The held-out fifth: the end of a fixed permutation.
  const std::vector<std::int64_t> order = ddp::random_permutation(n, kSplitSeed);
  const auto n_train = static_cast<std::size_t>(n - n / 5);
  const auto part = [&all](std::span<const std::int64_t> indices) {
    Batch b;
    all.gather(indices, b);
    return Dataset{all.task, kPixels, kDigitClasses, std::move(b.x), {}, std::move(b.labels)};
  };
  return {part(std::span(order).first(n_train)), part(std::span(order).subspan(n_train))};
}

Data load_data(const Config& c) {
  if (c.data == "digits") return load_digits(c.data_file);
  return {make_synthetic(c.task, c.dataset_size, c.input_dim, c.output_dim, c.seed), {}};
}

DataPlan::DataPlan(std::int64_t dataset_size, int world_size, int rank, int batch_size,
                   int accumulate, std::uint64_t seed)
    : sampler_(dataset_size, world_size, rank, /*shuffle=*/true, seed, /*drop_last=*/false),
      batch_size_(batch_size),
      accumulate_(accumulate),
      steps_per_epoch_(sampler_.size() / (static_cast<std::int64_t>(batch_size) * accumulate)) {
  if (steps_per_epoch_ < 1) {
    throw ddp::Error(std::to_string(dataset_size) + " samples give each of " +
                     std::to_string(world_size) + " rank(s) " + std::to_string(sampler_.size()) +
                     " per epoch, fewer than one step needs (--batch_size " +
                     std::to_string(batch_size) + " x --accumulate " + std::to_string(accumulate) +
                     ")");
  }
}

std::span<const std::int64_t> DataPlan::micro_batch(std::int64_t step, int micro) {
  const std::int64_t epoch = epoch_of(step);
  if (epoch != cached_epoch_) {
    sampler_.set_epoch(epoch);
    indices_ = sampler_.indices();
    cached_epoch_ = epoch;
  }
  const std::int64_t m = (step - epoch * steps_per_epoch_) * accumulate_ + micro;
  return std::span<const std::int64_t>(indices_).subspan(static_cast<std::size_t>(m * batch_size_),
                                                         static_cast<std::size_t>(batch_size_));
}

}  // namespace train
