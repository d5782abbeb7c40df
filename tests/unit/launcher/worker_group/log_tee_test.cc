// LineSplitter and StreamTee (worker_group/log_tee.h): whole lines from
// workers' pipes, overlong lines cut, progress-bar updates shown as written.

#include "worker_group/log_tee.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

namespace ddp::launcher {
namespace {

TEST(LineSplitter, CutsWholeLinesAndKeepsPartialOnesUntilFlush) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  auto sink = [&](const std::string& l, bool) { lines.push_back(l); };
  auto no_redraw = [](const std::string& text) { FAIL() << "redrew " << text; };
  splitter.feed("ab", 2, sink, no_redraw);
  EXPECT_TRUE(lines.empty());
  splitter.feed("c\nde\n\nf", 7, sink, no_redraw);
  EXPECT_EQ(lines, (std::vector<std::string>{"abc", "de", ""}));
  splitter.flush(sink);
  EXPECT_EQ(lines.back(), "f");
  std::string nul_line("x\0y", 3);
  splitter.feed((nul_line + "\n").data(), 4, sink, no_redraw);
  EXPECT_EQ(lines.back(), nul_line);
}

TEST(LineSplitter, CutsOverlongLines) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  std::string big(LineSplitter::kMaxLine * 2 + 10, 'x');
  splitter.feed(
      big.data(), big.size(), [&](const std::string& l, bool) { lines.push_back(l); },
      [](const std::string&) {});
  splitter.flush([&](const std::string& l, bool) { lines.push_back(l); });
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].size(), LineSplitter::kMaxLine);
  EXPECT_EQ(lines[2].size(), 10u);
}

// What a progress bar (tqdm) writes: "\r" + the bar, one write per update,
// and "\n" at the end. Each update is shown when it is written.
TEST(LineSplitter, CarriageReturnUpdatesAreShownAsTheyAreWritten) {
  LineSplitter splitter;
  std::vector<std::string> events;
  auto line = [&](const std::string& l, bool redrawn) {
    events.push_back((redrawn ? "nl:" : "line:") + l);
  };
  auto redraw = [&](const std::string& text) { events.push_back("cr:" + text); };
  auto feed = [&](const std::string& bytes) {
    splitter.feed(bytes.data(), bytes.size(), line, redraw);
  };
  feed("\r 10%|#");
  EXPECT_EQ(events, (std::vector<std::string>{"cr: 10%|#"}));
  feed("\r 50%|#####");
  feed("\r100%|##########\n");
  EXPECT_EQ(events,
            (std::vector<std::string>{"cr: 10%|#", "cr: 50%|#####", "line:100%|##########"}));
  events.clear();
  feed("done\r\n");  // a Windows line ending: the text is not overwritten by an empty line
  EXPECT_EQ(events, (std::vector<std::string>{"cr:done", "nl:done"}));
  events.clear();
  feed("a\rb\r");  // a bar left without a newline is ended at the end of the stream
  splitter.flush(line);
  EXPECT_EQ(events, (std::vector<std::string>{"cr:a", "cr:b", "nl:b"}));
  events.clear();
  feed("plain");  // without "\r" nothing is shown before the line ends
  EXPECT_TRUE(events.empty());
  splitter.flush(line);
  EXPECT_EQ(events, (std::vector<std::string>{"line:plain"}));
}

TEST(StreamTee, ProgressBarUpdatesReachTheConsoleWithTheRankPrefix) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  {
    TeeTarget target;
    target.console_fd = fds[1];
    target.prefix = "[rank 1] ";
    StreamTee tee(target);
    const std::string bytes = "\r 50%|#\r100%|##\nnext\n";
    tee.write(bytes.data(), 8);
    tee.write(bytes.data() + 8, bytes.size() - 8);
    tee.flush();
  }
  close(fds[1]);
  char buf[256] = {};
  std::string out(buf, static_cast<size_t>(read(fds[0], buf, sizeof(buf))));
  close(fds[0]);
  EXPECT_EQ(out, "[rank 1]  50%|#\r[rank 1] 100%|##\n[rank 1] next\n");
}

}  // namespace
}  // namespace ddp::launcher
