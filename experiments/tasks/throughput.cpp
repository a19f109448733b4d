// [throughput]: decode attention and prefill quantization per op x backend x context x batch x
// scheme (evaluation/throughput.h), with bf16 timed in every group as the speed-up's baseline.
// Rows: context, then op, then backend, then batch, every scheme of a case together (bf16 first);
// shards take whole cases.
#include "evaluation/throughput.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "experiments/commands.h"
#include "experiments/run_task.h"

namespace kvq::cli::run {
namespace {

struct ThroughputPlan final : TaskPlan {
  std::vector<int64_t> contexts{1024, 4096, 16384}, batches{1, 16};
  std::vector<std::string> backends{"ref", "cpu"}, ops{"decode", "quantize"};
  eval::ThroughputShape shape;
  eval::ThroughputOptions opt;
  std::string int_mode = "exact";
  json settings;  // shared by every row; the row's own op, backend, context and batch are added
  struct Case {
    std::string op, backend;
    int64_t context, batch;
  };
  // Context outermost: run_throughput builds each context's K/V (a gigabyte at 128k) once.
  std::vector<Case> cases() const {
    std::vector<Case> out;
    for (int64_t c : contexts)
      for (const auto& op : ops)
        for (const auto& b : backends)
          // quantize rows: the host backends' (backend cuda's quantize kernels have their benches)
          if (op == "decode" || backend_info(parse_backend(b)).host)
            for (int64_t n : op == "quantize" ? std::vector<int64_t>{1} : batches)
              out.push_back({op, b, c, n});
    return out;
  }
  json case_settings(const Case& c) const {
    return with_fields(
        settings,
        {{"op", c.op}, {"backend", c.backend}, {"context", c.context}, {"batch", c.batch}});
  }
  std::vector<json> case_settings() const override {
    std::vector<json> out;
    for (const auto& c : cases()) out.push_back(case_settings(c));
    return out;
  }
  void list() const override;
  void check_machine(const std::string& config) const override;
  void run(const std::filesystem::path& out, const Shard& shard,
           ModelSource& source) const override;
  std::vector<std::string> plots() const override { return {"plot_throughput.py"}; }
};

ThroughputPlan read_table(const toml::table& tt, const Where& w) {
  check_keys(tt, w,
             {"contexts", "batch", "backends", "ops", "heads", "head_dim", "gqa", "threads",
              "repeats", "int_mode", "schemes"});
  ThroughputPlan p;
  auto ints = [&](const char* key, std::vector<int64_t> def, int64_t lo, int64_t hi) {
    const auto* n = tt.get(key);
    if (!n) return def;
    const auto* a = n->as_array();
    KVQ_CHECK(a && !a->empty(), "{}: {} must be a non-empty array of integers", w.at(*n),
              w.key(key));
    std::vector<int64_t> out;
    for (const auto& e : *a) {
      const auto v = e.value_exact<int64_t>();
      KVQ_CHECK(v.has_value(), "{}: {} must hold integers (an element is {})", w.at(e), w.key(key),
                type_of(e));
      KVQ_CHECK(*v >= lo && *v <= hi, "{}: {} {} is outside [{}, {}]", w.at(e), w.key(key), *v, lo,
                hi);
      out.push_back(*v);
    }
    return out;
  };
  auto words = [&](const char* key, std::vector<std::string> def,
                   const std::vector<std::string>& allowed) {
    if (!tt.get(key)) return def;
    auto out = string_list(tt, w, key);
    KVQ_CHECK(!out.empty(), "{}: {} must be a non-empty array", w.file, w.key(key));
    for (const auto& x : out) {
      if (std::string_view(key) == "backends") {  // kernels/backend.h: the one list
        try {
          const BackendInfo& b = backend_info(parse_backend(x));
          KVQ_CHECK(b.id != AttentionBackend::kCpuInt8,
                    "backend {} is backend cpu with int_mode = \"int8\" here (the task's "
                    "int_mode key sets it for every backend cpu row)",
                    b.name);
        } catch (const Error& e) {
          fail("{}: {} \"{}\": {}", w.file, w.key(key), x, e.what());
        }
        continue;
      }
      KVQ_CHECK(std::find(allowed.begin(), allowed.end(), x) != allowed.end(),
                "{}: {} \"{}\" is not one of: {}", w.file, w.key(key), x, fmt::join(allowed, ", "));
    }
    return out;
  };
  p.contexts = ints("contexts", p.contexts, 1, int64_t{1} << 20);
  p.batches = ints("batch", p.batches, 1, 4096);
  p.backends = words("backends", p.backends, {});
  p.ops = words("ops", p.ops, {"decode", "quantize"});
  p.shape.heads = get_or<int64_t>(tt, w, "heads", 8);
  p.shape.head_dim = get_or<int64_t>(tt, w, "head_dim", 128);
  p.shape.gqa = get_or<int64_t>(tt, w, "gqa", 4);
  const int64_t threads = get_or<int64_t>(tt, w, "threads", 1),
                repeats = get_or<int64_t>(tt, w, "repeats", 5);
  for (const auto& [k, v] : std::initializer_list<std::pair<const char*, int64_t>>{
           {"heads", p.shape.heads}, {"head_dim", p.shape.head_dim}, {"gqa", p.shape.gqa}})
    KVQ_CHECK(v >= 1 && v <= 1024, "{}: {} must be between 1 and 1024, got {}", w.file, w.key(k),
              v);
  KVQ_CHECK(threads >= 1 && threads <= 256, "{}: {} must be between 1 and 256, got {}", w.file,
            w.key("threads"), threads);
  KVQ_CHECK(repeats >= 1 && repeats <= 1000, "{}: {} must be between 1 and 1000, got {}", w.file,
            w.key("repeats"), repeats);
  p.opt.threads = static_cast<int>(threads);
  p.opt.repeats = static_cast<int>(repeats);
  // int_mode = "int8": every backend cpu row runs backend cpu-int8 (kernels/backend.h)
  p.int_mode = get_or<std::string>(tt, w, "int_mode", "exact");
  KVQ_CHECK(p.int_mode == "exact" || p.int_mode == "int8",
            "{}: {} \"{}\" is not one of: exact, int8", w.file, w.key("int_mode"), p.int_mode);
  // The largest context's float32 K and V are held while its caches are built.
  const int64_t biggest = *std::max_element(p.contexts.begin(), p.contexts.end());
  KVQ_CHECK(biggest * p.shape.heads * p.shape.head_dim <= (int64_t{1} << 30),
            "{}: {} x heads x head_dim = {} values per tensor; at most 2^30 (4 GiB of float32 for "
            "K, as much for V)",
            w.file, w.key("contexts"), biggest * p.shape.heads * p.shape.head_dim);
  p.settings = {{"heads", p.shape.heads},   {"head_dim", p.shape.head_dim},
                {"gqa", p.shape.gqa},       {"threads", p.opt.threads},
                {"repeats", p.opt.repeats}, {"int_mode", p.int_mode}};
  return p;
}

// --smoke: one small context and batch, one repeat.
void shrink(ThroughputPlan& p) {
  p.contexts = {std::min<int64_t>(*std::min_element(p.contexts.begin(), p.contexts.end()), 256)};
  p.batches = {std::min<int64_t>(*std::min_element(p.batches.begin(), p.batches.end()), 2)};
  p.opt.repeats = 1;
  p.opt.pool_bytes = 1 << 20;
  p.settings["repeats"] = 1;
  p.settings["smoke"] = true;
}

// kernels/backend.h's support table: every backend's shape and decode schemes (one error each).
void check_support(const ThroughputPlan& p, std::vector<std::string>& errors) {
  for (const auto& b : p.backends) {
    const AttentionBackend be = parse_backend(b);
    if (const std::string why =
            unsupported_shape(be, p.shape.heads, p.shape.head_dim, p.shape.heads * p.shape.gqa);
        !why.empty())
      errors.push_back(
          fmt::format("[throughput] backend {} cannot run decode attention over {}", b, why));
    if (std::find(p.ops.begin(), p.ops.end(), "decode") == p.ops.end()) continue;
    for (const auto& s : p.specs) try {
        require_supported(be, s, AttentionOp::kDecode);
      } catch (const Error& e) {
        errors.push_back(fmt::format("[throughput] {}", e.what()));
      }
  }
}

std::unique_ptr<TaskPlan> plan(const toml::table& t, const TaskContext& c) {
  auto p = std::make_unique<ThroughputPlan>(read_table(t, Where{c.config, "throughput"}));
  if (c.smoke) shrink(*p);
  p->specs =
      fitting(c.rows(t, "throughput"), "throughput", p->shape.heads, p->shape.head_dim, *c.errors);
  // bf16 is every group's baseline: first, and added when the config does not name it.
  const SchemeSpec bf16 = parse_spec("bf16");
  std::erase_if(p->specs, [](const SchemeSpec& x) { return x.canonical() == "bf16"; });
  p->specs.insert(p->specs.begin(), bf16);
  check_support(*p, *c.errors);
  return p;
}

void ThroughputPlan::list() const {
  list_rows("throughput", specs);
  fmt::print(
      "throughput rows repeat for each op ({}) x backend ({}) x context ({}) x batch ({}; decode "
      "only): "
      "{} rows\n",
      fmt::join(ops, ", "), fmt::join(backends, ", "), fmt::join(contexts, ", "),
      fmt::join(batches, ", "), cases().size() * specs.size());
}

// A device backend needs its device (--check does not: configs are checked anywhere).
void ThroughputPlan::check_machine(const std::string& config) const {
  for (const auto& b : backends) require_available_here(Where{config, "throughput"}, "backends", b);
}

// The limits, each measured once per run before its first row, so every ratio is in-run: the
// host's memcpy for the host backends, a device-to-device cudaMemcpy for backend cuda.
struct Limits {
  double copy_gbps = 0, device_copy_gbps = 0;
  std::optional<DeviceReport> dev;  // backend cuda's GPU (name, driver, peak bandwidth)

  // The limit of backend `be`'s rows, measured (with a line) at its first row.
  double of(AttentionBackend be, const eval::ThroughputOptions& opt) {
    const bool device = !backend_info(be).host;
    if (device && !dev) {
      dev = device_report(be);
      device_copy_gbps = ::kvq::device_copy_gbps(be, opt.pool_bytes, std::max(opt.repeats, 5));
      fmt::print(stderr,
                 "[throughput] {} (driver {}, runtime {}), peak {:.0f} GB/s ({}); device-to-device "
                 "cudaMemcpy of {} MiB: {:.2f} GB/s\n",
                 dev->name, dev->driver_version, dev->runtime_version, dev->peak_gbps,
                 dev->peak_formula, opt.pool_bytes / (1 << 20), device_copy_gbps);
    }
    if (!device && copy_gbps == 0) {
      copy_gbps = eval::memcpy_gbps(opt.pool_bytes, opt);
      fmt::print(stderr, "[throughput] memcpy of {} MiB: {:.2f} GB/s\n", opt.pool_bytes / (1 << 20),
                 copy_gbps);
    }
    return device ? device_copy_gbps : copy_gbps;
  }
};

void ThroughputPlan::run(const std::filesystem::path& out, const Shard& shard, ModelSource&) const {
  const ThroughputPlan& p = *this;
  ResultTable table(out, "throughput");
  const auto cases = p.cases();
  const size_t total = cases.size() * p.specs.size();
  Limits limits;
  std::optional<eval::ThroughputInput> in;
  size_t j = 0, ci = 0;
  for (const auto& c : cases) {
    // Shards take whole cases (every scheme of one op, backend, context and batch), so the bf16
    // row each speed-up divides by is measured in the same shard.
    if (!shard.take(ci++)) {
      j += p.specs.size();
      continue;
    }
    const json settings = p.case_settings(c);
    double bf16_us = 0;
    if (const json* r = table.find("bf16", settings)) bf16_us = r->value("time_us", 0.0);
    for (const auto& spec : p.specs) {
      const size_t row = j++;
      const std::string key = spec.canonical();
      if (table.find(key, settings)) continue;
      check_stop();
      // int_mode = "int8": backend cpu's rows run backend cpu-int8 (kernels/backend.h)
      const AttentionBackend be =
          parse_backend(c.backend == "cpu" && p.int_mode == "int8" ? "cpu-int8" : c.backend);
      const bool device = !backend_info(be).host;
      const double limit = limits.of(be, p.opt);
      const std::optional<DeviceReport>& dev = limits.dev;
      if (!in || in->context != c.context) {
        in.reset();
        in = eval::throughput_input(p.shape, c.context, 0);
      }
      const eval::Timing t = c.op == "decode" ? eval::time_decode(spec, *in, c.batch, be, p.opt)
                                              : eval::time_quantize(spec, *in, be, p.opt);
      const double gbps = t.bytes / (t.us * 1e-6) / 1e9;
      if (key == "bf16") bf16_us = t.us;
      json r = {{"key", key},
                {"scheme", key},
                {"settings", settings},
                {"op", c.op},
                {"backend", c.backend},
                {"context", c.context},
                {"batch", c.batch},
                {"time_us", t.us},
                {"bytes", t.bytes},
                {"gb_per_s", gbps},
                {"memcpy_gb_per_s", limit},
                {"of_memcpy", gbps / limit},
                {"stored_bytes_per_token", t.stored_bytes_per_token},
                {"page_faults", t.page_faults},
                {"clock", t.clock}};
      if (device) {  // the GPU, its driver and its peak, and the copy the limit is
        r["device"] = dev->name;
        r["driver_version"] = dev->driver_version;
        r["runtime_version"] = dev->runtime_version;
        r["peak_gb_per_s"] = dev->peak_gbps;
        r["peak_formula"] = dev->peak_formula;
        r["of_peak"] = gbps / dev->peak_gbps;
        r["memcpy"] =
            "device-to-device cudaMemcpy (bytes copied per second; DRAM moves twice that)";
      }
      r["speedup_vs_bf16"] = bf16_us > 0 ? json(bf16_us / t.us) : json(nullptr);
      if (c.op == "decode") r["distinct_caches"] = t.distinct_caches;
      fmt::print(stderr,
                 "[throughput {}/{}] {} {} ctx {} batch {} {}: {:.1f} us, {:.2f} GB/s ({:.0f}% of "
                 "memcpy){}\n",
                 row + 1, total, c.op, c.backend, c.context, c.batch, key, t.us, gbps,
                 100 * gbps / limit,
                 bf16_us > 0 ? fmt::format(", {:.2f}x bf16", bf16_us / t.us) : "");
      table.add(std::move(r));
    }
  }
}

}  // namespace

Task throughput_task() {
  return {"throughput", &plan,
          "decode-attention and quantize time per backend x context x batch (GB/s, share of a "
          "memcpy timed in the same run, speed-up over bf16)"};
}

}  // namespace kvq::cli::run
