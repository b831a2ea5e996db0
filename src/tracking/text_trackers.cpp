// The "jsonl" and "csv" trackers: one record per log() call, appended and flushed at once, so
// `tail -f` shows it and pandas reads the file at any moment (pd.read_json(lines=True), pd.read_csv).
//
//   jsonl: <logging_dir>/metrics.jsonl, one object per line: {"step": 3, "wall_time": ..., "loss": ...}
//          in the order logged. A NaN or infinite number is written as null (JSON has no such numbers).
//   csv:   <logging_dir>/metrics.csv, header "step,wall_time,<names in first-seen order>". A record
//          without a column leaves its cell empty. A record with a name not yet in the header widens
//          it: the file is rewritten (to a temporary, renamed into place, so a reader never sees half
//          a file) with the new header and the earlier rows padded with empty cells. A text value is
//          quoted as RFC 4180 says; numbers read back as the same double; nan/inf as pandas reads them.
//   Both: config.json beside the file (store_init_configuration). "step" and "wall_time" are the
//   record's own fields: a value of either name is refused.
// init_kwargs: "filename" (instead of metrics.jsonl / metrics.csv).
#include "tracking/builtin.h"

#include "base/files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace accel::tracking {

namespace {

void check_names(const Values& values, const std::string& tracker) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::string& n = values[i].first;
    if (n == "step" || n == "wall_time")
      throw std::invalid_argument("tracker '" + tracker + "': '" + n +
                                  "' is the record's own field; log the value under another name");
    if (n.empty()) throw std::invalid_argument("tracker '" + tracker + "': a value has an empty name");
    for (std::size_t j = 0; j < i; ++j)
      if (values[j].first == n) throw std::invalid_argument("tracker '" + tracker + "': '" + n + "' is logged twice");
  }
}

// A file appended one line at a time and flushed after each.
class LineFile {
 public:
  void open(const std::string& path, const std::string& tracker) {
    path_ = path;
    f_ = std::fopen(path.c_str(), "w");
    if (!f_)
      throw std::runtime_error("tracker '" + tracker + "': cannot write " + path +
                               "; choose a writable AcceleratorOptions::project_dir");
  }
  void append(const std::string& line) {
    if (!f_) return;
    if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
      throw std::runtime_error("cannot write " + path_);
  }
  void reopen_append() {
    close();
    f_ = std::fopen(path_.c_str(), "a");
    if (!f_) throw std::runtime_error("cannot reopen " + path_);
  }
  void close() {
    if (f_) std::fclose(f_);
    f_ = nullptr;
  }
  bool is_open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  ~LineFile() { close(); }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

class JsonlTracker : public Tracker {
 public:
  explicit JsonlTracker(const TrackerContext& ctx) : ctx_(ctx) {
    check_kwargs(ctx, "jsonl", {"filename"});
    auto it = ctx.kwargs.find("filename");
    filename_ = it == ctx.kwargs.end() ? "metrics.jsonl" : it->second;
  }
  std::string name() const override { return "jsonl"; }
  bool requires_logging_directory() const override { return true; }
  void start() override {
    make_logging_dir(ctx_.logging_dir, "jsonl");
    file_.open(ctx_.logging_dir + "/" + filename_, "jsonl");
  }
  void store_init_configuration(const Values& config) override {
    if (file_.is_open()) write_config_json(ctx_.logging_dir, config);
  }
  void log(const Values& values, std::int64_t step) override {
    if (!file_.is_open()) return;
    check_names(values, "jsonl");
    nlohmann::ordered_json j;
    j["step"] = step;
    j["wall_time"] = wall_time();
    for (const auto& [k, v] : values) {
      if (v.is_text())
        j[k] = v.text();
      else if (v.kind() == Value::Kind::Bool)
        j[k] = v.number() != 0;
      else if (std::isfinite(v.number()))
        j[k] = v.number();
      else
        j[k] = nullptr;
    }
    file_.append(j.dump() + "\n");
  }
  void finish() override { file_.close(); }

 private:
  TrackerContext ctx_;
  std::string filename_;
  LineFile file_;
};

std::string csv_cell(const Value& v) {
  if (!v.is_text()) return v.to_string();
  const std::string& t = v.text();
  if (t.find_first_of(",\"\r\n") == std::string::npos && !t.empty()) return t;
  std::string q = "\"";
  for (char c : t) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

class CsvTracker : public Tracker {
 public:
  explicit CsvTracker(const TrackerContext& ctx) : ctx_(ctx) {
    check_kwargs(ctx, "csv", {"filename"});
    auto it = ctx.kwargs.find("filename");
    filename_ = it == ctx.kwargs.end() ? "metrics.csv" : it->second;
  }
  std::string name() const override { return "csv"; }
  bool requires_logging_directory() const override { return true; }
  void start() override {
    make_logging_dir(ctx_.logging_dir, "csv");
    file_.open(ctx_.logging_dir + "/" + filename_, "csv");
  }
  void store_init_configuration(const Values& config) override {
    if (file_.is_open()) write_config_json(ctx_.logging_dir, config);
  }
  void log(const Values& values, std::int64_t step) override {
    if (!file_.is_open()) return;
    check_names(values, "csv");
    bool widened = false;
    for (const auto& [k, v] : values)
      if (std::find(columns_.begin(), columns_.end(), k) == columns_.end()) {
        columns_.push_back(k);
        widened = true;
      }
    std::vector<std::string> cells(columns_.size());
    for (const auto& [k, v] : values)
      cells[std::find(columns_.begin(), columns_.end(), k) - columns_.begin()] = csv_cell(v);
    std::string row = std::to_string(step) + "," + format_number(wall_time());
    for (const auto& c : cells) {
      row += ',';
      row += c;
    }
    rows_.push_back({cells.size(), row});
    if (widened && rows_.size() > 1) {
      rewrite();
    } else {
      if (widened) file_.append(header());
      file_.append(row + "\n");
    }
  }
  void finish() override { file_.close(); }

 private:
  std::string header() const {
    std::string h = "step,wall_time";
    for (const auto& c : columns_) {
      h += ',';  // (not "," + cell: GCC 12 warns falsely about that, -Wrestrict)
      h += csv_cell(Value(c));
    }
    return h + "\n";
  }
  // The whole file again under the widened header: each earlier row padded with empty cells.
  void rewrite() {
    std::string text = header();
    for (const auto& [ncells, row] : rows_) text += row + std::string(columns_.size() - ncells, ',') + "\n";
    files::write_file_atomic(file_.path(), text.data(), text.size());
    file_.reopen_append();
  }

  TrackerContext ctx_;
  std::string filename_;
  LineFile file_;
  std::vector<std::string> columns_;
  // Every row written (cells it has, its text): what a widened header rewrites.
  std::vector<std::pair<std::size_t, std::string>> rows_;
};

}  // namespace

std::unique_ptr<Tracker> make_jsonl_tracker(const TrackerContext& ctx) { return std::make_unique<JsonlTracker>(ctx); }
std::unique_ptr<Tracker> make_csv_tracker(const TrackerContext& ctx) { return std::make_unique<CsvTracker>(ctx); }

}  // namespace accel::tracking
