// Trackers (src/tracking/, Accelerator::init_trackers/log/get_tracker/end_training) at 1 and 2 ranks:
// a custom tracker sees every call in order (on the main process only, unless it says otherwise),
// the CSV header widens when new names appear, CRC32C against its published check value, and the
// bad inputs (unknown name, no project_dir, unwritable directory, unknown options) fail with
// messages that say what to change. The built-in trackers' files as the tensorboard package reads
// them are checked by gpt_lm_trackers.sh.
#include "accelerator/accelerator.h"
#include "base/files.h"
#include "support/errors.h"
#include "test_world.h"
#include "tracking/crc32c.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

namespace accel::test {
namespace {

#define EXPECT_HAS(msg, part)                                                                \
  do {                                                                                       \
    const std::string m_ = (msg);                                                            \
    EXPECT_NE(m_.find(part), std::string::npos) << "expected '" << (part) << "' in: " << m_; \
  } while (0)

using tracking::Value;
using tracking::Values;

// A directory every rank agrees on, empty at the start of the test (rank 0 clears it). POSIX calls
// (base/files.h): std::filesystem::remove_all crashes in processes linked with libtorch.
std::string shared_dir(const std::string& name) {
  auto w = world();
  const std::string dir = "/tmp/accel_tracking_np" + std::to_string(w->size()) + "/" + name;
  if (w->rank() == 0) {
    files::remove_tree(dir);
    files::make_dirs(dir);
  }
  w->barrier();
  return dir;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

AcceleratorOptions quiet() {
  AcceleratorOptions o;
  o.report_ignored_keys = false;
  return o;
}

// Writes down every call it receives.
class Recorder : public tracking::Tracker {
 public:
  Recorder(std::vector<std::string>* out, bool main_only) : out_(out), main_only_(main_only) {}
  std::string name() const override { return main_only_ ? "recorder" : "everywhere"; }
  bool main_process_only() const override { return main_only_; }
  void start() override { out_->push_back("start"); }
  void store_init_configuration(const Values& c) override { out_->push_back("config " + text(c)); }
  void log(const Values& v, std::int64_t step) override {
    out_->push_back("log " + std::to_string(step) + " " + text(v));
  }
  void log_histogram(const std::string& tag, const std::vector<double>& v, std::int64_t step) override {
    double sum = 0;
    for (double x : v) sum += x;
    out_->push_back("hist " + std::to_string(step) + " " + tag + " n=" + std::to_string(v.size()) +
                    " sum=" + Value(sum).to_string());
  }
  void finish() override { out_->push_back("finish"); }

 private:
  static std::string text(const Values& v) {
    std::string s;
    for (const auto& [k, x] : v) s += (s.empty() ? "" : " ") + k + "=" + x.to_string();
    return s;
  }
  std::vector<std::string>* out_;
  bool main_only_;
};

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(tracking::crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value (RFC 3720, B.4)
  const std::string zeros(32, '\0');
  EXPECT_EQ(tracking::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  const std::uint32_t c = tracking::crc32c("123456789", 9);
  EXPECT_EQ(tracking::masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TrackerValue, ReadsBackAsWritten) {
  EXPECT_EQ(Value(0.1).to_string(), "0.1");
  EXPECT_EQ(Value(3).to_string(), "3");
  EXPECT_EQ(Value(true).to_string(), "true");
  EXPECT_EQ(Value("adamw").to_string(), "adamw");
  EXPECT_EQ(Value(std::nan("")).to_string(), "nan");
  EXPECT_EQ(Value(-INFINITY).to_string(), "-inf");
  const double third = 1.0 / 3;
  EXPECT_EQ(std::stod(Value(third).to_string()), third);
  EXPECT_TRUE(std::isnan(Value("x").number()));
  EXPECT_EQ(tracking::split_names("tensorboard, jsonl,,csv"),
            (std::vector<std::string>{"tensorboard", "jsonl", "csv"}));
}

TEST(TrackerRegistry, UnknownNamesSayWhatIsKnown) {
  const std::string m = message_of<std::invalid_argument>([] { tracking::tracker_info("tensorbord"); });
  EXPECT_HAS(m, "unknown tracker 'tensorbord' (did you mean 'tensorboard'?)");
  EXPECT_HAS(m, "known trackers: csv, jsonl, tensorboard");
  EXPECT_HAS(message_of<std::invalid_argument>([] { tracking::register_tracker("all", {}); }), "cannot name");
}

// CSV: a record with a new name rewrites the file under the widened header; earlier rows get empty
// cells; a text with a comma is quoted; appending goes on after the rewrite.
TEST(CsvTracker, NewNamesWidenTheHeader) {
  const std::string dir = shared_dir("csv") + "/rank" + std::to_string(world()->rank());
  tracking::TrackerContext ctx{"run", dir, {}, 0};
  auto t = tracking::tracker_info("csv").make(ctx);
  t->start();
  t->log({{"a", 1.5}}, 1);
  t->log({{"a", 2}, {"b", "x,y"}}, 2);
  t->log({{"b", 3}}, 3);
  t->finish();
  const auto l = lines_of(dir + "/metrics.csv");
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0], "step,wall_time,a,b");
  auto without_time = [](const std::string& row) {  // "1,<t>,..." -> "1,..."
    const auto a = row.find(','), b = row.find(',', a + 1);
    return row.substr(0, a) + row.substr(b);
  };
  EXPECT_EQ(without_time(l[1]), "1,1.5,");
  EXPECT_EQ(without_time(l[2]), "2,2,\"x,y\"");
  EXPECT_EQ(without_time(l[3]), "3,,3");
  EXPECT_FALSE(files::exists(dir + "/metrics.csv.tmp"));
}

TEST(JsonlTracker, RecordFieldsAreReservedAndNonFiniteIsNull) {
  const std::string dir = shared_dir("jsonl") + "/rank" + std::to_string(world()->rank());
  auto t = tracking::tracker_info("jsonl").make({"run", dir, {{"filename", "m.jsonl"}}, 0});
  t->start();
  t->log({{"loss", std::nan("")}, {"ok", true}}, 7);
  EXPECT_HAS(message_of<std::invalid_argument>([&] { t->log({{"step", 1}}, 8); }), "'step' is the record's own field");
  EXPECT_HAS(message_of<std::invalid_argument>([&] { t->log({{"a", 1}, {"a", 2}}, 8); }), "'a' is logged twice");
  t->finish();
  const auto l = lines_of(dir + "/m.jsonl");
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].substr(0, 9), "{\"step\":7");
  EXPECT_HAS(l[0], "\"loss\":null,\"ok\":true}");
}

// The steps and losses of a JSONL or CSV file, in file order (CSV through its first two named columns).
std::vector<std::pair<long, double>> steps_and_losses(const std::string& path, bool csv) {
  std::vector<std::pair<long, double>> out;
  const auto lines = lines_of(path);
  for (std::size_t i = csv ? 1 : 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (csv) {  // step,wall_time,loss,...
      const auto a = l.find(','), b = l.find(',', a + 1), c = l.find(',', b + 1);
      out.emplace_back(std::stol(l.substr(0, a)), std::stod(l.substr(b + 1, c - b - 1)));
    } else {  // {"step":N,"wall_time":T,"loss":X...}
      const auto s = l.find("\"step\":") + 7, x = l.find("\"loss\":") + 7;
      out.emplace_back(std::stol(l.substr(s)), std::stod(l.substr(x)));
    }
  }
  return out;
}

// A resumed run keeps what the earlier run logged up to the resumed step and drops the rest (as
// TensorBoard purges), whether it learns the step when it starts (init_trackers after load_state) or
// afterwards (resume(): load_state after init_trackers); a new run starts the file empty; a record cut
// short by a crash is dropped; a resumed CSV keeps its header and still widens.
TEST(TextTrackers, AResumedRunKeepsTheStepsUpToItAndANewRunStartsEmpty) {
  for (const std::string kind : {"jsonl", "csv"}) {
    SCOPED_TRACE(kind);
    const bool csv = kind == "csv";
    const std::string dir = shared_dir("resume_" + kind) + "/rank" + std::to_string(world()->rank());
    const std::string path = dir + "/metrics." + kind;
    auto run = [&](std::int64_t resume_after, std::optional<std::int64_t> resume_call, int first, int last,
                   double offset) {
      auto t = tracking::tracker_info(kind).make({"run", dir, {}, 0, resume_after});
      t->start();
      if (resume_call) t->resume(*resume_call);
      for (int s = first; s <= last; ++s) {
        Values v{{"loss", offset + s}};
        if (s == 3) v.emplace_back("note", "x,y");  // widens the CSV header mid-run
        t->log(v, s);
      }
      t->finish();
    };
    using Rows = std::vector<std::pair<long, double>>;
    run(-1, std::nullopt, 1, 8, 0);  // steps 1-8, losses 1-8
    // Resumed after step 5, known at start: 6-8 of the first run go, 6-10 come from this one.
    run(5, std::nullopt, 6, 10, 100);
    EXPECT_EQ(steps_and_losses(path, csv),
              (Rows{{1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}, {6, 106}, {7, 107}, {8, 108}, {9, 109}, {10, 110}}));
    if (csv) EXPECT_EQ(lines_of(path).front(), "step,wall_time,loss,note");
    // Resumed after step 4, learned after start (load_state after init_trackers); one more column.
    {
      auto t = tracking::tracker_info(kind).make({"run", dir, {}, 0});
      t->start();
      t->resume(4);
      t->log({{"loss", 205}, {"extra", 1}}, 5);
      t->finish();
    }
    EXPECT_EQ(steps_and_losses(path, csv), (Rows{{1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 205}}));
    if (csv) {
      const auto l = lines_of(path);
      EXPECT_EQ(l.front(), "step,wall_time,loss,note,extra");
      auto separators = [](const std::string& row) {  // commas outside quotes
        int n = 0;
        bool quoted = false;
        for (char c : row) {
          if (c == '"') quoted = !quoted;
          n += c == ',' && !quoted;
        }
        return n;
      };
      for (std::size_t i = 1; i < l.size(); ++i)
        EXPECT_EQ(separators(l[i]), 4) << "row " << i << " not padded: " << l[i];
    }
    // A record cut short (a crash mid-write) is dropped when a resumed run settles the file; one that
    // resumes and logs nothing still settles it at finish.
    { std::ofstream(path, std::ios::app) << (csv ? "6,123" : "{\"step\":6,\"wall"); }
    run(5, std::nullopt, 1, 0, 0);
    EXPECT_EQ(steps_and_losses(path, csv), (Rows{{1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 205}}));
    // A new run into the same directory starts empty.
    run(-1, std::nullopt, 1, 2, 300);
    EXPECT_EQ(steps_and_losses(path, csv), (Rows{{1, 301}, {2, 302}}));
    EXPECT_FALSE(files::exists(path + ".tmp"));
  }
}

// Every call, in order, on the processes that run the tracker: a registered main-process-only one
// (built on every rank from the factory, started on rank 0 only) and an object that runs everywhere.
TEST(AcceleratorTrackers, CustomTrackerReceivesEveryCallInOrder) {
  static std::vector<std::string> registered, object_calls;
  registered.clear(), object_calls.clear();
  tracking::register_tracker("recorder", {[](const tracking::TrackerContext& ctx) {
                                            std::string kw;
                                            for (const auto& [k, v] : ctx.kwargs) kw += k + "=" + v;
                                            registered.push_back("built " + ctx.project_name + " '" + ctx.logging_dir +
                                                                 "' " + kw + " rank" +
                                                                 std::to_string(ctx.process_index));
                                            return std::make_unique<Recorder>(&registered, true);
                                          },
                                          false});
  AcceleratorOptions o = quiet();
  o.log_with = {"recorder", std::make_shared<Recorder>(&object_calls, false)};
  Accelerator acc(o);
  const int r = acc.process_index();
  acc.init_trackers("run", {{"lr", 0.1}, {"opt", "adamw"}}, {{"recorder", {{"k", "v"}}}});
  acc.log({{"loss", 1.5}}, 3);
  acc.log({{"loss", 1.25}, {"note", "x"}});  // no step: the optimizer's (0)
  acc.log_histogram("w", at::arange(1, 4, at::kFloat), 5);
  if (r == 0) {
    EXPECT_EQ(acc.get_tracker("recorder").name(), "recorder");
  } else {
    EXPECT_HAS(message_of<std::invalid_argument>([&] { acc.get_tracker("recorder"); }),
               "the built-in trackers run on the main process only");
  }
  EXPECT_EQ(acc.get_tracker("everywhere").name(), "everywhere");
  acc.end_training();
  const std::vector<std::string> calls = {
      "start", "config lr=0.1 opt=adamw", "log 3 loss=1.5", "log 0 loss=1.25 note=x", "hist 5 w n=3 sum=6", "finish"};
  std::vector<std::string> want_registered = {"built run '' k=v rank" + std::to_string(r)};
  if (r == 0) want_registered.insert(want_registered.end(), calls.begin(), calls.end());
  EXPECT_EQ(registered, want_registered);
  EXPECT_EQ(object_calls, calls);  // main_process_only false: every rank
}

// The built-in trackers from the config file (log_with, project_dir): only rank 0 writes, and the
// files are complete once end_training returns.
TEST(AcceleratorTrackers, FromTheConfigFileOnlyTheMainProcessWrites) {
  const std::string dir = shared_dir("from_config");
  const std::string cfg = dir + "/c.yaml";
  if (world()->rank() == 0)
    std::ofstream(cfg) << "distributed_type: MULTI_CPU\nlog_with: jsonl, csv\nproject_dir: " << dir << "/p\n";
  world()->barrier();
  AcceleratorOptions o = quiet();
  o.config_file = cfg;
  Accelerator acc(o);
  EXPECT_EQ(acc.config().log_with, (std::vector<std::string>{"jsonl", "csv"}));
  acc.init_trackers("run", {{"seed", 3}});
  EXPECT_EQ(acc.logging_dir(), dir + "/p/run");
  for (int s = 1; s <= 3; ++s) acc.log({{"loss", 1.0 / s}, {"rank", acc.process_index()}}, s);
  acc.end_training();
  if (acc.is_main_process()) {
    const auto jl = lines_of(dir + "/p/run/metrics.jsonl");
    ASSERT_EQ(jl.size(), 3u);  // rank 1 would have added its own records
    for (const auto& l : jl) EXPECT_HAS(l, "\"rank\":0");
    EXPECT_EQ(lines_of(dir + "/p/run/metrics.csv").size(), 4u);
    EXPECT_HAS(lines_of(dir + "/p/run/config.json")[1], "\"seed\": 3");
  }
}

TEST(AcceleratorTrackers, BadInputSaysWhatToChange) {
  AcceleratorOptions o = quiet();
  o.log_with = {"tensorbord"};
  std::string m = message_of<ConfigError>([&] { Accelerator acc(o); });
  EXPECT_HAS(m, "AcceleratorOptions::log_with: unknown tracker 'tensorbord' (did you mean 'tensorboard'?)");

  o.log_with = {"all"};
  m = message_of<ConfigError>([&] { Accelerator acc(o); });
  EXPECT_HAS(m, "tracker(s) tensorboard, jsonl, csv write files under <project_dir>/<project_name>");
  EXPECT_HAS(m, "set AcceleratorOptions::project_dir (or project_dir in the config file");

  // The YAML's names are checked too, naming the file.
  const std::string dir = shared_dir("bad");
  if (world()->rank() == 0) std::ofstream(dir + "/c.yaml") << "distributed_type: MULTI_CPU\nlog_with: [jsonl, csvv]\n";
  world()->barrier();
  AcceleratorOptions y = quiet();
  y.config_file = dir + "/c.yaml";
  m = message_of<ConfigError>([&] { Accelerator acc(y); });
  EXPECT_HAS(m, dir + "/c.yaml: log_with: unknown tracker 'csvv' (did you mean 'csv'?)");

  // An unwritable logging directory (a file where the directory should be): every rank throws, the
  // main process naming the path.
  if (world()->rank() == 0) std::ofstream(dir + "/file") << "x";
  world()->barrier();
  o.log_with = {"jsonl"};
  o.project_dir = dir + "/file";
  {
    Accelerator acc(o);
    m = message_of<std::runtime_error>([&] { acc.init_trackers("run"); });
    if (acc.is_main_process()) {
      EXPECT_HAS(m, "cannot create the logging directory " + dir + "/file/run");
      EXPECT_HAS(m, "choose a writable AcceleratorOptions::project_dir");
    } else {
      EXPECT_HAS(m, "a tracker failed to start on another process");
    }
    // Unknown options fail on every rank (the factories run everywhere), naming the good ones.
    o.project_dir = dir + "/ok";
  }
  Accelerator acc(o);
  EXPECT_HAS(message_of<std::runtime_error>([&] {
               acc.init_trackers("run", {}, {{"jsonl", {{"flename", "x"}}}});
             }),
             "init_kwargs for tracker 'jsonl': unknown option 'flename'; its options: filename");
  EXPECT_HAS(message_of<std::invalid_argument>([&] {
               acc.init_trackers("run", {}, {{"csv", {}}});
             }),
             "init_kwargs names 'csv', which is not among the trackers of log_with");
  EXPECT_HAS(message_of<std::invalid_argument>([&] { acc.init_trackers("a/b"); }), "cannot name a run");
  acc.end_training();
}

// DeepSpeed's monitor blocks: enabled true turns the tracker on; their paths are accel's own.
TEST(TrackerConfig, DeepSpeedMonitorsAndYamlKeys) {
  AcceleratorConfig c = parse_deepspeed_json(
      R"({"tensorboard": {"enabled": true, "output_path": "logs/", "job_name": "x"},
          "csv_monitor": {"enabled": false}, "wandb": {"enabled": true}})",
      "ds.json");
  EXPECT_EQ(c.log_with, (std::vector<std::string>{"tensorboard"}));
  auto ignored = [&](const std::string& key) {
    for (const auto& e : c.ignored)
      if (e.rfind(key + ":", 0) == 0) return e;
    return std::string();
  };
  EXPECT_HAS(ignored("tensorboard.output_path"), "<project_dir>/<project_name>");
  EXPECT_HAS(ignored("csv_monitor"), "enabled is not true");
  EXPECT_HAS(ignored("wandb"), "wandb sync --sync-tensorboard");
  EXPECT_HAS(message_of<ConfigError>([] { parse_deepspeed_json(R"({"tensorboard": {"enable": true}})", "ds.json"); }),
             "unknown key 'tensorboard.enable'; did you mean 'enabled'?");
  c = parse_accelerate_yaml("distributed_type: NO\nlog_with: [tensorboard, csv]\nproject_dir: /tmp/x\n", "c.yaml");
  EXPECT_EQ(c.log_with, (std::vector<std::string>{"tensorboard", "csv"}));
  EXPECT_EQ(c.project_dir, "/tmp/x");
  EXPECT_HAS(
      message_of<ConfigError>([] { parse_accelerate_yaml("distributed_type: NO\nlog_with: {a: 1}\n", "c.yaml"); }),
      "log_with");
}

}  // namespace
}  // namespace accel::test
