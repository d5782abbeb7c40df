#pragma once
// --on_failure=heal: the directory of a run's heal marks, one file per local
// rank (DDP_HEAL_MARK). libddp creates a rank's mark once its program has
// opted into healing; the agent relaunches only ranks whose mark exists, and
// removes a rank's mark before each launch of it, so that a mark always
// speaks for the incarnation that runs. The directory is private to the run
// and removed with this object. Not thread-safe; owned by the agent.

#include <string>

namespace ddp::launcher {

class HealMarks {
 public:
  // Creates $TMPDIR/ddprun-heal-<run_id>-XXXXXX. Throws ddp::Error naming
  // TMPDIR when it cannot.
  explicit HealMarks(const std::string& run_id);
  ~HealMarks();  // removes the directory and every mark in it
  HealMarks(const HealMarks&) = delete;
  HealMarks& operator=(const HealMarks&) = delete;

  const std::string& dir() const { return dir_; }
  // Local rank `local_rank`'s mark: DIR/local_rank_<n>.
  static std::string path(const std::string& dir, int local_rank);
  std::string path(int local_rank) const { return path(dir_, local_rank); }
  bool exists(int local_rank) const;
  // Removes the mark (a stale one from an earlier launch); no error when absent.
  void clear(int local_rank) const;

 private:
  std::string dir_;
};

}  // namespace ddp::launcher
