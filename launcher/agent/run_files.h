#pragma once
// Where a run's per-worker files go, in torchrun's layout:
// LOG_DIR/<run_id>_<random>/attempt_<k>/<local rank>/{stdout,stderr}.log and
// error.json (the TORCHELASTIC_ERROR_FILE torch's @record writes). Without
// --log_dir only the error files are kept, in a private temporary directory
// removed with this object. Not thread-safe; owned by the agent.

#include <string>

#include "worker_group/failure_report.h"

namespace ddp::launcher {

class RunFiles {
 public:
  // Creates the run's directory under `log_dir` ("" = a temporary one).
  // Throws ddp::Error naming --log_dir (or TMPDIR) when it cannot.
  RunFiles(const std::string& log_dir, const std::string& run_id);
  ~RunFiles();
  RunFiles(const RunFiles&) = delete;
  RunFiles& operator=(const RunFiles&) = delete;

  const std::string& root() const { return root_; }
  bool keeps_logs() const { return !temporary_; }
  // Creates and returns attempt_<attempt>/<local_rank>.
  std::string worker_dir(int attempt, int local_rank) const;
  static std::string error_file(const std::string& worker_dir) {
    return worker_dir + "/error.json";
  }

  // torchrun's contract with schedulers (TorchX): when the launcher itself
  // was given TORCHELASTIC_ERROR_FILE, the root cause is written there: the
  // failed worker's error.json with its exit code as errorCode, else a record
  // of ddprun's report in torch's format. Errors are logged, never thrown.
  void write_root_cause(const WorkerOutcome& failed, int attempt, const std::string& report) const;

 private:
  std::string root_;
  bool temporary_ = false;
};

}  // namespace ddp::launcher
