#include "grad/grad_sync/stats.h"

namespace ddp::detail {

const IterationStats& StatsBook::record(IterationStats s) {
  s.iteration = ++iterations_;
  if (s.synced) {
    ++synced_;
    sum_.backward_compute_ms += s.backward_compute_ms;
    sum_.comm_ms += s.comm_ms;
    sum_.overlap_ms += s.overlap_ms;
    sum_.exposed_comm_ms += s.exposed_comm_ms;
    sum_.inline_comm_ms += s.inline_comm_ms;
    sum_.buckets += s.buckets;
    sum_.bytes_on_wire += s.bytes_on_wire;
  }
  last_ = s;
  return last_;
}

GradSyncStats StatsBook::snapshot() const {
  GradSyncStats s;
  s.last = last_;
  s.iterations = iterations_;
  s.synced_iterations = synced_;
  s.mean.iteration = synced_;
  s.mean.synced = true;
  if (synced_ > 0) {
    const double n = static_cast<double>(synced_);
    s.mean.backward_compute_ms = sum_.backward_compute_ms / n;
    s.mean.comm_ms = sum_.comm_ms / n;
    s.mean.overlap_ms = sum_.overlap_ms / n;
    s.mean.exposed_comm_ms = sum_.exposed_comm_ms / n;
    s.mean.inline_comm_ms = sum_.inline_comm_ms / n;
    s.mean.buckets = sum_.buckets / synced_;
    s.mean.bytes_on_wire = sum_.bytes_on_wire / synced_;
  }
  return s;
}

bool StatsBook::due(const IterationStats& s, int log_every) {
  return s.iteration <= 10 || (log_every > 0 && s.iteration % log_every == 0);
}

}  // namespace ddp::detail
