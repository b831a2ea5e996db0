// The "tensorboard" tracker: an event file that TensorBoard (and anything reading its format:
// `swanlab convert -t tensorboard`, `wandb sync --sync-tensorboard`) reads, written with
// TensorBoard's own messages (tensorboard.proto) through the packaged protobuf library.
//
// File: <logging_dir>/events.out.tfevents.<unix time>.<host>.<pid>.<n>[<filename_suffix>], a
// TFRecord stream: per record, the length (uint64 LE), the masked CRC32C of those 8 bytes (uint32 LE),
// the serialized Event, the masked CRC32C of it. The first Event holds file_version "brain.Event:2".
// Numbers and booleans are scalar summaries (simple_value: TensorBoard keeps them as float32), texts
// and the run's configuration (a Markdown table under the tag "config", step 0) are text-plugin
// summaries (a DT_STRING tensor), distributions are HistogramProtos. Each log() call is one Event,
// flushed when written.
//
// Compiled apart from torch (src/CMakeLists.txt, accel_tracking): libtorch's include directory
// carries protobuf 3.13 headers that would shadow the packaged ones the generated code needs.
// init_kwargs: "filename_suffix".
#include "base/error.h"
#include "tracking/builtin.h"
#include "tracking/crc32c.h"

#include "tensorboard.pb.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace accel::tracking {

namespace {

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

class EventFile {
 public:
  void open(const std::string& path) {
    path_ = path;
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_)
      throw accel::RuntimeError("tracker 'tensorboard': cannot write " + path +
                                "; choose a writable AcceleratorOptions::project_dir");
  }
  void write(const tb::Event& e) {
    if (!f_) return;
    const std::string data = e.SerializeAsString();
    std::string rec;
    rec.reserve(data.size() + 16);
    put_le(rec, data.size(), 8);
    put_le(rec, masked_crc32c(rec.data(), 8), 4);
    rec += data;
    put_le(rec, masked_crc32c(data.data(), data.size()), 4);
    if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size()) throw accel::RuntimeError("cannot write " + path_);
  }
  void flush() {
    if (f_ && std::fflush(f_) != 0) throw accel::RuntimeError("cannot write " + path_);
  }
  void close() {
    if (f_) std::fclose(f_);
    f_ = nullptr;
  }
  bool is_open() const { return f_ != nullptr; }
  ~EventFile() { close(); }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

void set_text(tb::Summary::Value* v, const std::string& tag, const std::string& text) {
  v->set_tag(tag);
  auto* md = v->mutable_metadata();
  md->mutable_plugin_data()->set_plugin_name("text");  // content: TextPluginData{version 0}, all defaults
  md->set_data_class(tb::DATA_CLASS_TENSOR);
  auto* t = v->mutable_tensor();
  t->set_dtype(tb::DT_STRING);
  t->mutable_tensor_shape()->add_dim()->set_size(1);
  t->add_string_val(text);
}

std::string markdown_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += "<br>";
    else
      out += c;
  }
  return out;
}

class TensorBoardTracker : public Tracker {
 public:
  explicit TensorBoardTracker(const TrackerContext& ctx) : ctx_(ctx) {
    check_kwargs(ctx, "tensorboard", {"filename_suffix"});
    auto it = ctx.kwargs.find("filename_suffix");
    if (it != ctx.kwargs.end()) suffix_ = it->second;
  }
  std::string name() const override { return "tensorboard"; }
  bool requires_logging_directory() const override { return true; }

  void start() override {
    make_logging_dir(ctx_.logging_dir, "tensorboard");
    static std::atomic<int> files{0};
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    char name[512];
    std::snprintf(name, sizeof name, "events.out.tfevents.%lld.%s.%d.%d", static_cast<long long>(wall_time()), host,
                  static_cast<int>(::getpid()), files++);
    path_ = ctx_.logging_dir + "/" + name + suffix_;
    file_.open(path_);
    tb::Event e;
    e.set_wall_time(wall_time());
    e.set_file_version("brain.Event:2");
    file_.write(e);
    file_.flush();
  }

  void store_init_configuration(const Values& config) override {
    if (!file_.is_open()) return;
    std::string md = "| key | value |\n|---|---|\n";
    for (const auto& [k, v] : config) md += "| " + markdown_cell(k) + " | " + markdown_cell(v.to_string()) + " |\n";
    tb::Event e;
    e.set_wall_time(wall_time());
    e.set_step(0);
    set_text(e.mutable_summary()->add_value(), "config", md);
    file_.write(e);
    file_.flush();
  }

  void log(const Values& values, std::int64_t step) override {
    if (!file_.is_open()) return;
    tb::Event e;
    e.set_wall_time(wall_time());
    e.set_step(step);
    auto* s = e.mutable_summary();
    for (const auto& [k, v] : values) {
      if (v.is_text()) {
        set_text(s->add_value(), k, v.text());
      } else {
        auto* sv = s->add_value();
        sv->set_tag(k);
        sv->set_simple_value(static_cast<float>(v.number()));
      }
    }
    file_.write(e);
    file_.flush();
  }

  // Equal-width buckets between the smallest and the largest finite value (30, or fewer for few
  // values); bucket_limit holds each bucket's right edge, as TensorBoard reads it.
  void log_histogram(const std::string& tag, const std::vector<double>& values, std::int64_t step) override {
    if (!file_.is_open()) return;
    tb::HistogramProto h;
    double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0, n = 0;
    for (double x : values) {
      if (!std::isfinite(x)) continue;
      lo = std::min(lo, x), hi = std::max(hi, x), sum += x, sq += x * x, n += 1;
    }
    if (n == 0) lo = hi = 0;
    h.set_min(lo), h.set_max(hi), h.set_num(n), h.set_sum(sum), h.set_sum_squares(sq);
    const int buckets = hi > lo ? static_cast<int>(std::min<double>(30, std::max<double>(1, n))) : 1;
    std::vector<double> counts(buckets, 0);
    const double width = (hi - lo) / buckets;
    for (double x : values) {
      if (!std::isfinite(x)) continue;
      int b = width > 0 ? static_cast<int>((x - lo) / width) : 0;
      counts[std::clamp(b, 0, buckets - 1)] += 1;
    }
    for (int b = 0; b < buckets; ++b) {
      h.add_bucket_limit(b + 1 == buckets ? hi : lo + width * (b + 1));
      h.add_bucket(counts[b]);
    }
    tb::Event e;
    e.set_wall_time(wall_time());
    e.set_step(step);
    auto* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    *v->mutable_histo() = h;
    file_.write(e);
    file_.flush();
  }

  void finish() override { file_.close(); }

 private:
  TrackerContext ctx_;
  std::string suffix_, path_;
  EventFile file_;
};

}  // namespace

std::unique_ptr<Tracker> make_tensorboard_tracker(const TrackerContext& ctx) {
  return std::make_unique<TensorBoardTracker>(ctx);
}

}  // namespace accel::tracking
