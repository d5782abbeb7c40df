#include "agent/run_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ddp/common/error.h"
#include "ddp/common/launcher_log.h"

namespace ddp::launcher {
namespace {

void make_dir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw Error("--log_dir: cannot create '" + path + "': " + std::strerror(errno));
  }
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

RunFiles::RunFiles(const std::string& log_dir, const std::string& run_id) {
  temporary_ = log_dir.empty();
  std::string base;
  if (temporary_) {
    const char* tmp = std::getenv("TMPDIR");
    base = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddprun-" + run_id +
           "-XXXXXX";
  } else {
    base = log_dir + "/" + run_id + "_XXXXXXXX";  // torchrun's <run_id>_<random>
  }
  std::string buf = base;
  if (mkdtemp(buf.data()) == nullptr) {
    throw Error(std::string(temporary_ ? "TMPDIR" : "--log_dir") + ": cannot create '" + base +
                "': " + std::strerror(errno));
  }
  root_ = buf;
}

RunFiles::~RunFiles() {
  if (!temporary_) return;
  std::error_code ignored;
  std::filesystem::remove_all(root_, ignored);
}

std::string RunFiles::worker_dir(int attempt, int local_rank) const {
  const std::string attempt_dir = root_ + "/attempt_" + std::to_string(attempt);
  make_dir(attempt_dir);
  const std::string dir = attempt_dir + "/" + std::to_string(local_rank);
  make_dir(dir);
  return dir;
}

void RunFiles::write_root_cause(const WorkerOutcome& failed, int attempt,
                                const std::string& report) const {
  const char* target = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (target == nullptr || *target == '\0') return;
  const std::string child = error_file(root_ + "/attempt_" + std::to_string(attempt) + "/" +
                                       std::to_string(failed.local_rank));
  std::string data = read_file(child);
  const std::string code = std::to_string(failed.launcher_exit_code());
  // json.dump writes {"message": {...}}: the exit code goes into the inner
  // object, as torch's override_error_code_in_rootcause_data does.
  const std::string head = "{\"message\": {";
  if (!data.empty() && data.rfind(head, 0) == 0) {
    data.insert(head.size(), "\"errorCode\": " + code + ", ");
  } else if (data.empty()) {
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    data = "{\"message\": {\"errorCode\": " + code + ", \"message\": " +
           json_string("ChildFailedError: rank " + std::to_string(failed.rank) + " " +
                       failed.describe()) +
           ", \"extraInfo\": {\"py_callstack\": " + json_string(report) + ", \"timestamp\": \"" +
           std::to_string(now) + "\"}}}";
  }
  std::ofstream out(target, std::ios::trunc);
  out << data;
  if (!out.flush()) {
    launcher_log().error("TORCHELASTIC_ERROR_FILE={}: cannot write the root cause: {}", target,
                         std::strerror(errno));
  }
}

}  // namespace ddp::launcher
