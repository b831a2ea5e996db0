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
//   A new run starts the file empty. A resumed run (TrackerContext::resume_after, or resume() once
//   load_state has restored the step) keeps the earlier run's records up to the resumed step and drops
//   the rest, as TensorBoard purges orphaned steps, then appends: no record is lost or doubled. That
//   happens when the first record is written (or at finish), so the order of init_trackers and
//   load_state does not matter. The rows of a widened CSV header are read back from the file, not
//   kept in memory.
// init_kwargs: "filename" (instead of metrics.jsonl / metrics.csv).
#include "base/error.h"
#include "tracking/builtin.h"

#include "base/files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <stdexcept>

namespace accel::tracking {

namespace {

void check_names(const Values& values, const std::string& tracker) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::string& n = values[i].first;
    if (n == "step" || n == "wall_time")
      throw accel::InvalidArgumentError("tracker '" + tracker + "': '" + n +
                                        "' is the record's own field; log the value under another name");
    if (n.empty()) throw accel::InvalidArgumentError("tracker '" + tracker + "': a value has an empty name");
    for (std::size_t j = 0; j < i; ++j)
      if (values[j].first == n)
        throw accel::InvalidArgumentError("tracker '" + tracker + "': '" + n + "' is logged twice");
  }
}

// The records of a file's text: lines, where a CSV field in quotes may hold newlines. A last record
// without its newline (a write cut short) is left out.
std::vector<std::string> split_records(const std::string& text, bool csv) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (csv && text[i] == '"') quoted = !quoted;
    if (text[i] == '\n' && !quoted) {
      out.push_back(text.substr(begin, i - begin));
      begin = i + 1;
    }
  }
  return out;
}

// A record's step, or nothing where it has none (a CSV header, a line that is not a record).
std::optional<std::int64_t> record_step(const std::string& record, bool csv) {
  if (csv) {
    const std::string first = record.substr(0, record.find(','));
    if (first.empty() || first.find_first_not_of("-0123456789") != std::string::npos) return std::nullopt;
    try {
      return std::stoll(first);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  const auto j = nlohmann::json::parse(record, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  return j["step"].get<std::int64_t>();
}

// A CSV record's fields, unquoted.
std::vector<std::string> csv_fields(const std::string& record) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < record.size(); ++i) {
    const char c = record[i];
    if (quoted) {
      if (c == '"' && i + 1 < record.size() && record[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

// A file of records appended one at a time and flushed after each. Opened for appending; before the
// first record (or at close) it is settled: emptied for a new run, or cut to the records of steps up
// to resume_after for a resumed one (a CSV keeps its header), rewritten atomically.
class RecordFile {
 public:
  void open(const std::string& path, const std::string& tracker, bool csv, std::int64_t resume_after) {
    path_ = path;
    csv_ = csv;
    resume_after_ = resume_after;
    f_ = std::fopen(path.c_str(), "a");
    if (!f_)
      throw accel::RuntimeError("tracker '" + tracker + "': cannot write " + path +
                                "; choose a writable AcceleratorOptions::project_dir");
    settled_ = false;
  }
  // The run continues after `step` (load_state after start): records past it are dropped, unless
  // this run has written its first record already.
  void resume(std::int64_t step) {
    if (!settled_) resume_after_ = step;
  }
  // Settles the file if that has not happened yet; returns the records kept (empty once settled).
  std::vector<std::string> settle() {
    if (settled_ || !f_) return {};
    settled_ = true;
    std::vector<std::string> kept;
    if (resume_after_ >= 0) {
      const std::vector<std::string> all = split_records(files::read_file(path_), csv_);
      for (std::size_t i = 0; i < all.size(); ++i) {
        const auto step = record_step(all[i], csv_);
        if ((step && *step <= resume_after_) || (csv_ && i == 0 && !step)) kept.push_back(all[i]);
      }
    }
    rewrite(kept);
    return kept;
  }
  void append(const std::string& line) {
    if (!f_) return;
    settle();
    if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
      throw accel::RuntimeError("cannot write " + path_);
  }
  // Replaces the file's records (atomically: a reader never sees half a file) and appends after them.
  void rewrite(const std::vector<std::string>& records) {
    std::string text;
    for (const auto& r : records) text += r + "\n";
    files::write_file_atomic(path_, text.data(), text.size());
    std::fclose(f_);
    f_ = std::fopen(path_.c_str(), "a");
    if (!f_) throw accel::RuntimeError("cannot reopen " + path_);
  }
  void close() {
    if (f_) settle();
    if (f_) std::fclose(f_);
    f_ = nullptr;
  }
  bool is_open() const { return f_ != nullptr; }
  const std::string& path() const { return path_; }
  ~RecordFile() {
    try {
      close();
    } catch (...) {  // (a destructor must not throw: finish() reports such errors)
    }
  }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  bool csv_ = false, settled_ = true;
  std::int64_t resume_after_ = -1;
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
    file_.open(ctx_.logging_dir + "/" + filename_, "jsonl", /*csv=*/false, ctx_.resume_after);
  }
  void resume(std::int64_t step) override { file_.resume(step); }
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
  RecordFile file_;
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
    file_.open(ctx_.logging_dir + "/" + filename_, "csv", /*csv=*/true, ctx_.resume_after);
  }
  void resume(std::int64_t step) override { file_.resume(step); }
  void store_init_configuration(const Values& config) override {
    if (file_.is_open()) write_config_json(ctx_.logging_dir, config);
  }
  void log(const Values& values, std::int64_t step) override {
    if (!file_.is_open()) return;
    check_names(values, "csv");
    settle();
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
    if (widened && header_written_) {
      rewrite();
    } else if (widened) {
      file_.append(header());
      header_written_ = true;
      written_columns_ = columns_.size();
    }
    file_.append(row + "\n");
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
  // The file settled (see RecordFile); a resumed run takes its columns from the kept header.
  void settle() {
    const std::vector<std::string> kept = file_.settle();
    if (kept.empty() || header_written_) return;
    const std::vector<std::string> names = csv_fields(kept.front());
    for (std::size_t i = 2; i < names.size(); ++i) columns_.push_back(names[i]);  // after step, wall_time
    written_columns_ = columns_.size();
    header_written_ = true;
  }
  // The file again under the widened header: each row, read back from the file, padded with empty
  // cells (every row on file has as many cells as the header it was written under).
  void rewrite() {
    std::vector<std::string> records = split_records(files::read_file(file_.path()), /*csv=*/true);
    const std::string pad(columns_.size() - written_columns_, ',');
    std::string h = header();
    h.pop_back();  // (its newline)
    if (records.empty()) records.push_back(h);
    records.front() = h;
    for (std::size_t i = 1; i < records.size(); ++i) records[i] += pad;
    file_.rewrite(records);
    written_columns_ = columns_.size();
  }

  TrackerContext ctx_;
  std::string filename_;
  RecordFile file_;
  std::vector<std::string> columns_;
  std::size_t written_columns_ = 0;  // the columns of the header on file
  bool header_written_ = false;
};

}  // namespace

std::unique_ptr<Tracker> make_jsonl_tracker(const TrackerContext& ctx) { return std::make_unique<JsonlTracker>(ctx); }
std::unique_ptr<Tracker> make_csv_tracker(const TrackerContext& ctx) { return std::make_unique<CsvTracker>(ctx); }

}  // namespace accel::tracking
