#include "base/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>

namespace accel {

ProgressBar::ProgressBar(std::int64_t total, std::string label, bool enabled, std::FILE* out)
    : total_(std::max<std::int64_t>(total, 0)),
      label_(std::move(label)),
      enabled_(enabled),
      tty_(out && isatty(fileno(out))),
      out_(out),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { close(); }

void ProgressBar::update(std::int64_t n, const std::string& postfix) {
  n_ += n;
  if (!postfix.empty()) postfix_ = postfix;
  draw(false);
}

void ProgressBar::close() {
  if (closed_) return;
  closed_ = true;
  draw(true);
}

std::string ProgressBar::render() const {
  constexpr int kWidth = 24;
  const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(n_) / static_cast<double>(total_)) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return fmt::format("{} {:3d}% |{}{}| {}/{} [{:.1f}s]{}{}", label_, static_cast<int>(frac * 100),
                     std::string(filled, '#'), std::string(kWidth - filled, ' '), n_, total_, secs,
                     postfix_.empty() ? "" : " ", postfix_);
}

void ProgressBar::draw(bool final) {
  if (!enabled_ || !out_) return;
  if (tty_) {
    std::fprintf(out_, "\r%s%s", render().c_str(), final ? "\n" : "");
  } else {
    const int decile = total_ > 0 ? static_cast<int>(std::min<std::int64_t>(10, n_ * 10 / total_)) : 10;
    if (decile == last_decile_ && !final) return;
    if (final && decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(out_, "%s\n", render().c_str());
  }
  std::fflush(out_);
}

}  // namespace accel
