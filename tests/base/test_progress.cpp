// accel::ProgressBar: the rendered line for a few states, and what draw() writes where (a non-terminal
// gets a plain line at every 10%, a disabled bar nothing).
#include "base/progress.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// The elapsed time is the one part of the line that is not a function of the state: "[1.2s]" -> "[T]".
std::string without_time(const std::string& line) {
  // The first "[<digits>.<digit>s]" (not with <regex>: it triples this file's compile time).
  auto digit = [&](std::size_t k) { return k < line.size() && std::isdigit(static_cast<unsigned char>(line[k])); };
  for (std::size_t open = line.find('['); open != std::string::npos; open = line.find('[', open + 1)) {
    std::size_t k = open + 1;
    while (digit(k)) ++k;
    if (k > open + 1 && line.compare(k, 1, ".") == 0 && digit(k + 1) && line.compare(k + 2, 2, "s]") == 0)
      return line.substr(0, open) + "[T]" + line.substr(k + 4);
  }
  return line;
}

// Everything `bar` wrote to its file, one entry per line.
std::vector<std::string> lines_of(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::vector<std::string> out;
  std::string cur;
  for (int c; (c = std::fgetc(f)) != EOF;) {
    if (c == '\n') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(c));
    }
  }
  if (!cur.empty()) out.push_back(cur);
  std::fseek(f, 0, SEEK_END);  // a positioning call between reading and the bar's next write
  return out;
}

TEST(ProgressRender, EmptyBarAtTheStart) {
  accel::ProgressBar bar(50, "train", /*enabled=*/false);
  // 24 columns, none filled.
  EXPECT_EQ(without_time(bar.render()), "train   0% |                        | 0/50 [T]");
  EXPECT_EQ(bar.count(), 0);
}

TEST(ProgressRender, PartialBarWithPostfix) {
  accel::ProgressBar bar(50, "train", false);
  bar.update(21, "loss 1.234");
  // 21/50 = 42%: 0.42 * 24 = 10.08 -> 10 columns filled.
  EXPECT_EQ(without_time(bar.render()), "train  42% |##########              | 21/50 [T] loss 1.234");
  bar.update(4);  // an update without a postfix keeps the last one
  EXPECT_EQ(without_time(bar.render()), "train  50% |############            | 25/50 [T] loss 1.234");
  bar.set_postfix("loss 0.5");
  EXPECT_EQ(without_time(bar.render()), "train  50% |############            | 25/50 [T] loss 0.5");
  EXPECT_EQ(bar.count(), 25);
}

TEST(ProgressRender, FullAndOverfullBars) {
  accel::ProgressBar full(3, "eval", false);
  full.update(3);
  EXPECT_EQ(without_time(full.render()), "eval 100% |########################| 3/3 [T]");
  // Past the total: the bar stays full, the count says the truth.
  accel::ProgressBar over(3, "eval", false);
  over.update(5);
  EXPECT_EQ(without_time(over.render()), "eval 100% |########################| 5/3 [T]");
}

TEST(ProgressRender, ZeroOrNegativeTotalIsComplete) {
  accel::ProgressBar zero(0, "x", false);
  EXPECT_EQ(without_time(zero.render()), "x 100% |########################| 0/0 [T]");
  accel::ProgressBar negative(-4, "x", false);  // clamped to 0
  EXPECT_EQ(without_time(negative.render()), "x 100% |########################| 0/0 [T]");
}

TEST(ProgressRender, ElapsedTimeIsSecondsWithOneDecimal) {
  accel::ProgressBar bar(10, "t", false);
  const std::string line = bar.render();
  const std::string tail = " 0/10 [T]";
  const std::string masked = without_time(line);
  EXPECT_NE(masked, line) << line;  // a "[<digits>.<digit>s]" was there
  ASSERT_GE(masked.size(), tail.size()) << line;
  EXPECT_EQ(masked.substr(masked.size() - tail.size()), tail) << line;  // ... at the end
}

// What a bar drawing into a temporary file writes while `use(file)` runs (the bar's destructor
// included), one entry per line.
template <class F>
std::vector<std::string> drawn(F&& use) {
  std::FILE* f = std::tmpfile();
  if (!f) throw std::runtime_error("tmpfile failed");
  use(f);
  auto lines = lines_of(f);
  std::fclose(f);
  return lines;
}

TEST(ProgressDraw, NonTerminalPrintsOneLinePerDecile) {
  const auto lines = drawn([](std::FILE* f) {
    accel::ProgressBar bar(50, "steps", /*enabled=*/true, f);
    for (int i = 0; i < 50; ++i) bar.update(1);
    bar.close();
    bar.close();  // a second close (and the destructor) draw nothing more
  });
  // Deciles 0 (at 1/50), 1 (5/50), ..., 10 (50/50): 11 lines; the final state is not repeated.
  ASSERT_EQ(lines.size(), 11u);
  EXPECT_EQ(without_time(lines.front()), "steps   2% |                        | 1/50 [T]");
  EXPECT_EQ(without_time(lines[1]), "steps  10% |##                      | 5/50 [T]");
  EXPECT_EQ(without_time(lines.back()), "steps 100% |########################| 50/50 [T]");
  for (const auto& l : lines) EXPECT_EQ(l.find('\r'), std::string::npos) << "no carriage return off a terminal";
}

TEST(ProgressDraw, CloseAddsNoLineWithinTheDecileLastDrawn) {
  const auto lines = drawn([](std::FILE* f) {
    accel::ProgressBar bar(100, "w", true, f);
    bar.update(1);  // decile 0: drawn
    bar.update(3);  // 4/100, still decile 0: not drawn
  });               // the destructor closes: same decile as the last line drawn, so nothing more
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(without_time(lines[0]), "w   1% |                        | 1/100 [T]");
}

TEST(ProgressDraw, CloseDrawsABarNeverDrawn) {
  const auto lines = drawn([](std::FILE* f) {
    accel::ProgressBar bar(100, "w", true, f);
    bar.set_postfix("nothing done");  // set_postfix does not draw
    EXPECT_TRUE(lines_of(f).empty());
    bar.close();
  });
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(without_time(lines[0]), "w   0% |                        | 0/100 [T] nothing done");
}

TEST(ProgressDraw, DisabledBarPrintsNothing) {
  const auto lines = drawn([](std::FILE* f) {
    accel::ProgressBar bar(10, "quiet", /*enabled=*/false, f);
    for (int i = 0; i < 10; ++i) bar.update(1, "loss 1");
    EXPECT_EQ(bar.count(), 10);
  });
  EXPECT_TRUE(lines.empty());
}

}  // namespace
