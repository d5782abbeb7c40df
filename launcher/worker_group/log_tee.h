#pragma once
// LogTee: what happens to the bytes a worker writes. Each (rank, stream) pair
// is cut into whole lines, prefixed with "[rank N] " on the console when
// enabled, and copied raw to the per-rank log file when one is open. Only
// whole lines reach the console, so output of different ranks never mixes
// inside a line; bytes are never altered (binary output passes through), a
// line longer than kMaxLine is cut into pieces, and a final line without a
// newline gets one on flush(). The last lines of stderr are kept for the
// failure report. Not thread-safe: driven by the agent's event loop.

#include <deque>
#include <string>

namespace ddp::launcher {

// Cuts a byte stream into lines (pure logic, unit-tested).
class LineSplitter {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;
  // Appends bytes; calls on_line(line_without_newline) for each whole line.
  template <typename F>
  void feed(const char* data, size_t size, F&& on_line);
  // Emits what is left (a last line without newline), if anything.
  template <typename F>
  void flush(F&& on_line);

 private:
  std::string pending_;
};

struct TeeTarget {
  // -1: not shown on the console. A full console (a pipe nobody reads yet,
  // blocking or O_NONBLOCK) is waited for: no line is dropped, and the
  // workers feel the back-pressure through their own pipes. Only a pending
  // SIGINT/SIGTERM/SIGHUP/SIGQUIT (ddprun is stopping) ends the wait for an
  // O_NONBLOCK console, dropping the rest.
  int console_fd = -1;
  std::string prefix;        // e.g. "[rank 3] "; empty: no prefix
  int file_fd = -1;          // -1: no log file
  std::string file_path;     // for the one warning when writing it fails (a full disk)
  size_t keep_last_lines = 0;  // >0: remember the last lines (stderr)
};

class StreamTee {
 public:
  explicit StreamTee(TeeTarget target) : target_(std::move(target)) {}
  StreamTee(const StreamTee&) = delete;
  StreamTee& operator=(const StreamTee&) = delete;
  ~StreamTee();

  void write(const char* data, size_t size);
  void flush();  // end of stream
  const std::deque<std::string>& last_lines() const { return last_lines_; }

 private:
  void emit(const std::string& line);
  TeeTarget target_;
  bool file_failed_ = false;
  LineSplitter splitter_;
  std::deque<std::string> last_lines_;
};

template <typename F>
void LineSplitter::feed(const char* data, size_t size, F&& on_line) {
  size_t start = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      pending_.append(data + start, i - start);
      on_line(pending_);
      pending_.clear();
      start = i + 1;
    } else if (pending_.size() + (i - start) + 1 >= kMaxLine) {
      pending_.append(data + start, i - start + 1);
      on_line(pending_);
      pending_.clear();
      start = i + 1;
    }
  }
  pending_.append(data + start, size - start);
}

template <typename F>
void LineSplitter::flush(F&& on_line) {
  if (!pending_.empty()) {
    on_line(pending_);
    pending_.clear();
  }
}

}  // namespace ddp::launcher
