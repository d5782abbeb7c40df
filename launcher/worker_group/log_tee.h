#pragma once
// LogTee: what happens to the bytes a worker writes. Each (rank, stream) pair
// is cut into whole lines, prefixed with "[rank N] " on the console when
// enabled, and copied raw to the per-rank log file when one is open. Only
// whole lines reach the console, so output of different ranks never mixes
// inside a line; bytes are never altered (binary output passes through), a
// line longer than kMaxLine is cut into pieces, and a final line without a
// newline gets one on flush(). The last lines of stderr are kept for the
// failure report. Not thread-safe: driven by the agent's event loop.

#include <chrono>
#include <deque>
#include <string>

namespace ddp::launcher {

// Cuts a byte stream into lines (pure logic, unit-tested). A "\r" (a
// progress bar redrawing its line) ends a segment that is shown at once and
// overwritten by the next: on_redraw(text) for it, and again at the end of
// each feed for the text after it so far, so that updates show as they are
// written. A line ended by "\r\n" (after its text was redrawn) reaches
// on_line with `redrawn` true: only the newline is missing on the console.
class LineSplitter {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;
  // Appends bytes; calls on_line(line_without_newline, redrawn) for each whole
  // line and on_redraw(text) for each "\r" segment.
  template <typename F, typename R>
  void feed(const char* data, size_t size, F&& on_line, R&& on_redraw);
  // Emits what is left (a last line without newline), if anything.
  template <typename F>
  void flush(F&& on_line);

 private:
  std::string pending_;
  std::string redrawn_;     // the text last shown with on_redraw in this line
  bool redrawing_ = false;  // a "\r" was seen in this line
  bool after_cr_ = false;   // the last byte was "\r"
  size_t shown_ = 0;        // bytes of pending_ already shown by a feed's end
};

struct TeeTarget {
  // -1: not shown on the console. A full console (a pipe nobody reads yet,
  // blocking or O_NONBLOCK) is waited for: no line is dropped, and the
  // workers feel the back-pressure through their own pipes. Only a pending
  // SIGINT/SIGTERM/SIGHUP/SIGQUIT (ddprun is stopping) ends the wait for an
  // O_NONBLOCK console, dropping the rest.
  int console_fd = -1;
  std::string prefix;          // e.g. "[rank 3] "; empty: no prefix
  int file_fd = -1;            // -1: no log file
  std::string file_path;       // for the one warning when writing it fails (a full disk)
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
  // When write() last received bytes (ddprun status); the epoch: never.
  std::chrono::steady_clock::time_point last_output() const { return last_output_; }
  // Whether the console is gone (EPIPE: the reader of ddprun's output, such
  // as `head`, exited). Nothing more is written to it then.
  bool console_closed() const { return console_closed_; }

 private:
  void emit(const std::string& line, bool redrawn);
  void redraw(const std::string& text);
  void to_console(const std::string& text);
  TeeTarget target_;
  bool file_failed_ = false;
  bool console_closed_ = false;
  LineSplitter splitter_;
  std::deque<std::string> last_lines_;
  std::chrono::steady_clock::time_point last_output_{};
};

template <typename F, typename R>
void LineSplitter::feed(const char* data, size_t size, F&& on_line, R&& on_redraw) {
  size_t start = 0;
  for (size_t i = 0; i < size; ++i) {
    const char c = data[i];
    if (c == '\n') {
      pending_.append(data + start, i - start);
      if (pending_.empty() && after_cr_) {
        on_line(redrawn_, true);
      } else {
        on_line(pending_, false);
      }
      pending_.clear();
      redrawn_.clear();
      redrawing_ = after_cr_ = false;
      shown_ = 0;
      start = i + 1;
    } else if (c == '\r') {
      pending_.append(data + start, i - start);
      if (!pending_.empty()) {
        if (pending_.size() != shown_) on_redraw(pending_);  // not yet shown whole at a feed's end
        redrawn_.swap(pending_);
        pending_.clear();
      }
      shown_ = 0;
      redrawing_ = after_cr_ = true;
      start = i + 1;
    } else if (pending_.size() + (i - start) + 1 >= kMaxLine) {
      pending_.append(data + start, i - start + 1);
      on_line(pending_, false);
      pending_.clear();
      redrawing_ = after_cr_ = false;
      shown_ = 0;
      start = i + 1;
    } else {
      after_cr_ = false;
    }
  }
  pending_.append(data + start, size - start);
  if (redrawing_ && !pending_.empty() && pending_.size() != shown_) {
    on_redraw(pending_);  // the update written so far, shown now
    shown_ = pending_.size();
  }
}

template <typename F>
void LineSplitter::flush(F&& on_line) {
  if (!pending_.empty()) {
    on_line(pending_, false);
  } else if (redrawing_ && !redrawn_.empty()) {
    on_line(redrawn_, true);  // a bar left without its newline: end the console line
  }
  pending_.clear();
  redrawn_.clear();
  redrawing_ = after_cr_ = false;
  shown_ = 0;
}

}  // namespace ddp::launcher
