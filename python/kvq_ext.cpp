// kvq._kvq: the C++ side of the Python package. python/kvq/__init__.py is the API users call (it
// checks arrays, converts float16, builds dicts); this module is a thin layer over the same
// functions the CLI calls, so a Python result and a `kvq` command's agree bit for bit.
//
// Arrays come in as float32, C order (the Python side guarantees it) and are read in place where
// the C++ API takes a pointer; results leave as numpy arrays that own the C++ buffer (no copy).
// Long calls release the GIL; model calls check for Ctrl-C between chunks and tokens.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cache/round_trip.h"
#include "cache/side.h"
#include "core/error.h"
#include "core/footprint.h"
#include "core/gguf.h"
#include "core/io.h"
#include "core/schemes.h"
#include "core/spec.h"
#include "evaluation/defaults.h"
#include "evaluation/kv_input.h"
#include "evaluation/model_eval.h"
#include "evaluation/model_files.h"
#include "evaluation/planner.h"
#include "evaluation/report.h"
#include "evaluation/ruler.h"
#include "fp8/scale.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kivi.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "reference_cpu/attention.h"

namespace nb = nanobind;

namespace kvq::py {
namespace {

using FloatIn = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using FloatOut = nb::ndarray<nb::numpy, float>;

/// Thrown (without the GIL) when Python has a pending KeyboardInterrupt; becomes one.
struct Interrupted {};

// Between units of long work: takes the GIL and runs Python's signal handlers.
void poll_signals() {
  nb::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    PyErr_Clear();
    throw Interrupted{};
  }
}

// A numpy array that owns `v` (moved to the heap, freed with the array).
FloatOut to_numpy(std::vector<float>&& v, const std::vector<int64_t>& shape) {
  auto* p = new std::vector<float>(std::move(v));
  nb::capsule owner(p, [](void* q) noexcept { delete static_cast<std::vector<float>*>(q); });
  std::vector<size_t> s(shape.begin(), shape.end());
  return FloatOut(p->data(), s.size(), s.data(), owner);
}

std::vector<int64_t> shape_of(const FloatIn& a) {
  std::vector<int64_t> s(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) s[i] = static_cast<int64_t>(a.shape(i));
  return s;
}

Role parse_role(const std::string& r) {
  if (r == "key") return Role::Key;
  if (r == "value") return Role::Value;
  fail("role '{}' is not known; use 'key' or 'value'", r);
}

nlohmann::json spec_json(const SchemeSpec& s) {
  nlohmann::json j;
  j["canonical"] = s.canonical();
  if (s.split()) {
    j["kind"] = "split";
    j["key"] = spec_json(s.side(Role::Key));
    j["value"] = spec_json(s.side(Role::Value));
    return j;
  }
  for (const SchemeField& f : scheme_traits(s).fields(s))  // its family's (core/schemes.h)
    std::visit([&](const auto& v) { j[std::string(f.name)] = v; }, f.value);
  if (s.rot.on) j["rot"] = s.rot.seeded ? fmt::format("hadamard:{}", s.rot.seed) : "hadamard";
  if (s.sink > 0) j["sink"] = s.sink;
  return j;
}

// core/schemes.h's registry, in its order: per family its names, the keys each of its examples'
// schemes takes with their defaults (a flag: false), its canonical examples and --help lines.
std::string schemes_json() {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const SchemeTraits* t : scheme_families()) {
    using S = std::string;
    nlohmann::ordered_json kinds = nlohmann::ordered_json::array(),
                           aliases = nlohmann::ordered_json::array(),
                           examples = nlohmann::ordered_json::array(),
                           keys = nlohmann::ordered_json::object();
    for (const SchemeKindName& k : t->kinds) kinds.push_back(S(k.label));
    for (const SchemeAlias& a : t->aliases)
      aliases.push_back(
          {{"name", S(a.name)}, {"means", S(a.means)}, {"rewrite", a.rewrite != nullptr}});
    for (const std::string_view e : t->examples) {
      examples.push_back(S(e));
      const std::string name(e.substr(0, e.find(':')));
      if (keys.contains(name)) continue;
      nlohmann::ordered_json k = nlohmann::ordered_json::object();
      for (const SchemeKey& key : t->keys(parse_spec(name)))
        k[std::string(key.name)] =
            key.flag ? nlohmann::ordered_json(false) : nlohmann::ordered_json(S(key.value));
      keys[name] = std::move(k);
    }
    out.push_back({{"family", S(t->family)},
                   {"kinds", kinds},
                   {"names", S(t->names)},
                   {"keys", keys},
                   {"aliases", aliases},
                   {"examples", examples},
                   {"keys_help", S(t->keys_help)},
                   {"description", S(t->description)}});
  }
  return out.dump();
}

nlohmann::json footprint_json(const Footprint& f) {
  return {{"code_bytes", f.code_bytes},
          {"scale_bytes", f.scale_bytes},
          {"zero_bytes", f.zero_bytes},
          {"residual_bytes", f.residual_bytes},
          {"total_bytes", f.total_bytes()},
          {"quantized_elements", f.quantized_elements},
          {"residual_elements", f.residual_elements},
          {"effective_bits", f.effective_bits()},
          {"overall_bits", f.overall_bits()}};
}

// x as a [T, H, D] tensor (checked as `kvq quant` checks its input; one copy).
cli::KvInput as_tensor(const FloatIn& x, const std::string& name) {
  const float* p = x.data();
  return cli::as_kv(name, shape_of(x), std::vector<float>(p, p + x.size()));
}

std::pair<FloatOut, std::string> quantize(const FloatIn& x, const std::string& spec_text,
                                          const std::string& role_text, int layer) {
  const SchemeSpec spec = parse_spec(spec_text).for_layer(layer);  // SPEC@L=..: this layer's
  const Role role = parse_role(role_text);
  cli::KvInput in = as_tensor(x, "x");
  RoundTrip r;
  std::string stats;
  {
    nb::gil_scoped_release release;
    r = round_trip(spec, role, in.tensor, layer);
    stats = cli::error_report(spec, role, in.tensor, r).dump();
  }
  return {to_numpy(std::move(r.values.data), in.file_shape), stats};
}

std::vector<std::string> compare(const FloatIn& x, const std::vector<std::string>& spec_texts,
                                 const std::string& role_text) {
  std::vector<SchemeSpec> specs;
  // every spec before any work; a per-layer spec is layer 0's scheme here (one tensor)
  for (const auto& s : spec_texts) specs.push_back(parse_spec(s).for_layer(0));
  const Role role = parse_role(role_text);
  const cli::KvInput in = as_tensor(x, "x");
  nb::gil_scoped_release release;
  std::vector<std::string> rows;
  for (const auto& spec : specs)
    rows.push_back(
        cli::error_report(spec, role, in.tensor, round_trip(spec, role, in.tensor)).dump());
  return rows;
}

// One layer's cache: a K side and a V side, appended together, attended on any backend
// (kernels/backend.h: ref, cpu, cpu-int8 in host memory; cuda in device memory, decode only).
class Cache {
 public:
  Cache(const std::string& spec_text, int64_t heads, int64_t dim, const std::string& backend,
        int layer, const std::string& int_mode, int threads)
      : spec_(parse_spec(spec_text).for_layer(layer)),  // one layer's cache: its scheme
        heads_(heads),
        dim_(dim),
        threads_(threads) {
    KVQ_CHECK(heads >= 1, "heads must be at least 1, got {}", heads);
    KVQ_CHECK(dim >= 1, "head_dim must be at least 1, got {}", dim);
    KVQ_CHECK(threads >= 0, "threads must be 0 (all cores) or more, got {}", threads);
    b_ = parse_backend(backend);  // kernels/backend.h: the one list
    KVQ_CHECK(int_mode == "exact" || int_mode == "int8",
              "int_mode '{}' is not known; use one of: exact, int8", int_mode);
    KVQ_CHECK(int_mode == "exact" || b_ == AttentionBackend::kCpu || b_ == AttentionBackend::kCpuInt8,
              "int_mode='int8' is a backend cpu path; use backend='cpu'");
    // backend cpu with int_mode='int8' is backend cpu-int8
    if (b_ == AttentionBackend::kCpu && int_mode == "int8") b_ = AttentionBackend::kCpuInt8;
    // host backends: backend cpu's quantizers (the reference's bytes, bit for bit); cuda: device
    // memory through the CUDA quantize kernels (the same bytes)
    k_ = make_backend_side(b_, spec_, Role::Key, heads, dim, layer);
    v_ = make_backend_side(b_, spec_, Role::Value, heads, dim, layer);
    backend_ = backend;
  }

  void append(const FloatIn& k, const FloatIn& v) {
    check_kv(k, "k");
    check_kv(v, "v");
    KVQ_CHECK(k.shape(0) == v.shape(0), "k has {} tokens but v has {}", k.shape(0), v.shape(0));
    const int64_t n = static_cast<int64_t>(k.shape(0));
    KVQ_CHECK(n >= 1, "append needs at least one token");
    nb::gil_scoped_release release;
    // The exact values causal attention over this append reads: the window before it + the chunk
    // (every backend runs causal attention; backend cuda uploads them for the call).
    const TailSpace space = tail_space(b_);  // what attend reads
    kbeg_ = gather_exact_tail(*k_, k.data(), n, ktail_, space);
    vbeg_ = gather_exact_tail(*v_, v.data(), n, vtail_, space);
    k_->append(k.data(), n);
    v_->append(v.data(), n);
    last_ = n;
  }

  // q [q_heads, dim]: decode over the whole cache (the last position). q [n, q_heads, dim]: causal
  // attention of the last n tokens (all from the latest append), each seeing the cache a
  // token-by-token decode would hold at its position.
  FloatOut attend(const FloatIn& q) {
    KVQ_CHECK(q.ndim() == 2 || q.ndim() == 3,
              "q must be [q_heads, head_dim] (decode) or [n, q_heads, head_dim] (causal), got {} "
              "dimensions",
              q.ndim());
    const bool causal = q.ndim() == 3;
    const int64_t n = causal ? static_cast<int64_t>(q.shape(0)) : 1;
    const int64_t qh = static_cast<int64_t>(q.shape(causal ? 1 : 0));
    KVQ_CHECK(static_cast<int64_t>(q.shape(q.ndim() - 1)) == dim_,
              "q has head_dim {} but the cache {}", q.shape(q.ndim() - 1), dim_);
    KVQ_CHECK(qh >= 1 && qh % heads_ == 0,
              "q has {} heads, not a multiple of the cache's {} kv heads (GQA)", qh, heads_);
    KVQ_CHECK(tokens() > 0, "the cache is empty: append before attend");
    if (causal)
      KVQ_CHECK(n >= 1 && n <= last_,
                "causal attend covers the latest append's tokens ({}), got {} positions; "
                "append, then attend with q [n <= {}, q_heads, head_dim]",
                last_, n, last_);
    if (causal) require_supported(b_, spec_, AttentionOp::kCausal);
    std::vector<float> out(static_cast<size_t>(n * qh * dim_));
    {
      nb::gil_scoped_release release;
      const int64_t T = tokens(), t_begin = T - n;
      // A decode step is the causal call for the last position: the same code as prefill, so
      // the two agree bit for bit (as in the model's forward pass).
      const ExactTail ke{ktail_.data(), kbeg_}, ve{vtail_.data(), vbeg_};
      const CausalArgs a{q.data(), n, qh, t_begin, k_.get(), v_.get(), ke, ve};
      attend_causal(b_, a, out.data(), threads_);
    }
    return causal ? to_numpy(std::move(out), {n, qh, dim_}) : to_numpy(std::move(out), {qh, dim_});
  }

  std::pair<FloatOut, FloatOut> dequantize() const {
    Tensor3 k, v;
    {
      nb::gil_scoped_release release;
      k = k_->dequantize();
      v = v_->dequantize();
    }
    const std::vector<int64_t> s{tokens(), heads_, dim_};
    return {to_numpy(std::move(k.data), s), to_numpy(std::move(v.data), s)};
  }

  std::string footprint() const {
    return nlohmann::json{{"key", footprint_json(k_->footprint())},
                          {"value", footprint_json(v_->footprint())}}
        .dump();
  }

  int64_t tokens() const { return k_->tokens(); }
  std::string spec() const { return spec_.canonical(); }
  const std::string& backend() const { return backend_; }
  int64_t heads() const { return heads_; }
  int64_t dim() const { return dim_; }

 private:
  void check_kv(const FloatIn& a, const char* name) const {
    KVQ_CHECK(a.ndim() == 3 && static_cast<int64_t>(a.shape(1)) == heads_ &&
                  static_cast<int64_t>(a.shape(2)) == dim_,
              "{} must be [n, {}, {}] (tokens, kv heads, head_dim), got shape {}", name, heads_,
              dim_, fmt::join(shape_of(a), "x"));
  }

  SchemeSpec spec_;
  int64_t heads_, dim_;
  int threads_;
  AttentionBackend b_ = AttentionBackend::kRef;  // backend cpu with int_mode='int8': kCpuInt8
  std::string backend_;
  std::unique_ptr<SideStore> k_, v_;
  std::vector<float> ktail_, vtail_;
  int64_t kbeg_ = 0, vbeg_ = 0, last_ = 0;
};

// kvq plan: the arguments as a JSON object with the CLI's names (see kvq.plan).
std::string plan(const std::string& args_json) {
  const auto a = nlohmann::json::parse(args_json);
  planner::ModelArgs m;
  auto opt = [&](const char* key) { return a.contains(key) && !a[key].is_null(); };
  if (opt("model")) m.preset = a["model"].get<std::string>();
  if (opt("layers")) m.layers = a["layers"].get<int64_t>();
  if (opt("kv_heads")) m.kv_heads = a["kv_heads"].get<int64_t>();
  if (opt("head_dim")) m.head_dim = a["head_dim"].get<int64_t>();
  if (opt("params")) m.params_billions = a["params"].get<double>();
  planner::PlanInput in;
  in.model = planner::resolve_model(m, opt("weights_gb"));
  in.gpu = planner::resolve_gpu(
      opt("gpu") ? std::optional<std::string>(a["gpu"].get<std::string>()) : std::nullopt,
      opt("bandwidth") ? std::optional<double>(a["bandwidth"].get<double>()) : std::nullopt);
  std::optional<std::string> mem;
  if (opt("mem"))
    mem = a["mem"].is_string() ? a["mem"].get<std::string>()
                               : fmt::format("{}", a["mem"].get<double>());
  planner::set_mem(in, mem, m, opt("gpu") || opt("bandwidth"));
  if (opt("weights_gb")) in.weight_bytes = a["weights_gb"].get<double>() * 1e9;
  if (opt("weights_dtype")) in.weights_dtype = a["weights_dtype"].get<std::string>();
  if (opt("ctx")) in.ctx = a["ctx"].get<int64_t>();
  if (opt("batch")) in.batch = a["batch"].get<int64_t>();
  if (opt("decode_ctx")) in.decode_ctx = a["decode_ctx"].get<int64_t>();
  if (opt("kv")) in.kv = a["kv"].get<std::vector<std::string>>();
  return planner::plan_json(planner::make_plan(in)).dump();
}

// The real model and its tokenizer.
class Model {
 public:
  // `backend`: the Python Model's default (kvq.Model(..., backend=)); checked before the load:
  // kernels/backend.h's one parser, then cuda's one line without a device.
  Model(const std::string& path, const std::string& weights, const std::string& backend) {
    const AttentionBackend b = parse_backend(backend);
    require_model(b);
    require_available(b);
    const std::string p = cli::model_path(path);
    const WeightStore store = parse_weight_store(weights);
    nb::gil_scoped_release release;
    m_ = std::make_unique<eval::LoadedModel>(eval::load_model(p, store));
    m_->model.set_backend(b);
    path_ = p;
  }

  std::string config() const {
    const LlamaConfig& c = m_->model.config();
    return nlohmann::json{{"path", path_},          {"layers", c.layers},
                          {"hidden", c.hidden},     {"heads", c.heads},
                          {"kv_heads", c.kv_heads}, {"head_dim", c.head_dim},
                          {"ffn", c.ffn},           {"vocab", c.vocab},
                          {"context", c.context},   {"weights", m_->model.weight_formats()},
                          {"family", c.family}}
        .dump();
  }

  std::vector<int32_t> encode(const std::string& text, int64_t max_tokens, bool chat) const {
    nb::gil_scoped_release release;
    if (chat) return m_->tok.encode(m_->tok.chat({{"user", text}}, true), true);
    return m_->tok.encode_first(text, max_tokens);
  }
  std::string decode(const std::vector<int32_t>& ids) const { return m_->tok.decode(ids); }
  int32_t eos() const { return m_->tok.eos(); }

  std::vector<std::string> ppl(const std::vector<int32_t>& tokens,
                               const std::vector<std::string>& kvs, int ctx, int stride, int chunk,
                               int threads, const std::string& backend) {
    std::vector<CacheOptions> caches;
    for (const auto& s : kvs) caches.push_back(CacheOptions{parse_spec(s)});
    const AttentionBackend b = parse_backend(backend);
    for (const CacheOptions& c : caches) require_model(b, c.spec);  // every scheme, before any work
    eval::PplOptions o;
    o.ctx = ctx;
    o.stride = stride;
    o.chunk = chunk;
    o.threads = threads;
    o.poll = poll_signals;
    std::vector<eval::PplResult> r;
    {
      nb::gil_scoped_release release;
      m_->model.set_backend(b);
      r = eval::perplexity(m_->model, caches, tokens, o);
    }
    std::vector<std::string> rows;
    for (size_t i = 0; i < r.size(); ++i) {
      nlohmann::json row{{"kv", caches[i].spec.canonical()},
                         {"windows", r[i].windows},
                         {"scored", r[i].scored},
                         {"ctx", ctx},
                         {"ci_blocks", r[i].ci_blocks},
                         {"seconds", r[i].seconds}};
      for (const auto& [name, value] : eval::result_fields(r[i])) row[name] = value;
      if (const std::string ref = eval::reference_field(b); !ref.empty()) row["reference"] = ref;
      rows.push_back(row.dump());
    }
    return rows;
  }

  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int n, const std::string& kv,
                                int threads, const std::string& backend) {
    const CacheOptions c{parse_spec(kv)};
    const AttentionBackend b = parse_backend(backend);
    KVQ_CHECK(n >= 1, "n must be at least 1, got {}", n);
    nb::gil_scoped_release release;
    m_->model.set_backend(b);
    return eval::generate(m_->model, c, prompt, n, {m_->tok.eos()}, threads,
                          [](int32_t) { poll_signals(); });
  }

  // Every position's next-token logits with the cache in `kv`, [T, vocab], as `kvq model logits`
  // (one forward pass over the whole text).
  FloatOut logits(const std::vector<int32_t>& ids, const std::string& kv, int threads,
                  const std::string& backend) {
    const CacheOptions co{parse_spec(kv)};
    const AttentionBackend b = parse_backend(backend);
    const LlamaConfig& c = m_->model.config();
    KVQ_CHECK(!ids.empty(), "the text is empty after tokenization");
    KVQ_CHECK(static_cast<int64_t>(ids.size()) <= c.context,
              "{} tokens exceed the model's context {}; give max_tokens <= {}", ids.size(),
              c.context, c.context);
    std::vector<float> out;
    {
      nb::gil_scoped_release release;
      m_->model.set_backend(b);
      LlamaCache cache(c, co);
      m_->model.forward(ids, cache, out, true, threads);
    }
    return to_numpy(std::move(out), {static_cast<int64_t>(ids.size()), c.vocab});
  }

  // Greedy outputs of two caches side by side, as `kvq model diverge` (its --json object).
  std::string diverge(const std::vector<int32_t>& prompt, const std::string& kv,
                      const std::string& vs, int n, int threads, const std::string& backend) {
    const CacheOptions test{parse_spec(kv)}, ref{parse_spec(vs)};
    const AttentionBackend b = parse_backend(backend);
    const int context = m_->model.config().context;
    KVQ_CHECK(n >= 1, "n must be at least 1, got {}", n);
    KVQ_CHECK(n < context, "n = {} leaves no room for a prompt in the model's context {}", n,
              context);
    eval::DivergeResult r;
    {
      nb::gil_scoped_release release;
      m_->model.set_backend(b);
      r = eval::diverge(m_->model, ref, test, prompt, n, threads);
    }
    return nlohmann::json{{"kv", test.spec.canonical()},
                          {"vs", ref.spec.canonical()},
                          {"backend", backend},
                          {"prompt_tokens", prompt.size()},
                          {"ref", r.ref},
                          {"test", r.test},
                          {"first_diff", r.first_diff},
                          {"top1", r.top1}}
        .dump();
  }

  // Passkey retrieval over ctx x depth x trials, as `kvq model needle` (its --json rows).
  std::vector<std::string> needle(const std::string& kv, const std::vector<int>& ctxs,
                                  const std::vector<double>& depths, int trials, uint64_t seed,
                                  const std::string& hay_text, int threads,
                                  const std::string& backend) {
    const AttentionBackend b = parse_backend(backend);
    const CacheOptions test{parse_spec(kv)}, ref{reference_spec(b)};  // fp32; bf16 on cuda
    const int context = m_->model.config().context;
    KVQ_CHECK(!ctxs.empty() && !depths.empty(), "ctx and depth: give at least one value each");
    for (int c : ctxs) KVQ_CHECK(c >= 256 && c <= context, "ctx {} outside [256, {}]", c, context);
    for (double d : depths) KVQ_CHECK(d >= 0 && d <= 1, "depth {} outside [0, 1]", d);
    KVQ_CHECK(trials >= 1, "trials must be at least 1, got {}", trials);
    std::vector<std::string> rows;
    const std::string reference = eval::reference_field(b);
    nb::gil_scoped_release release;
    m_->model.set_backend(b);
    eval::needle_grid(*m_, hay_text, ref, test, {ctxs, depths, trials, seed, threads},
                      [&](const eval::NeedleRow& r) {
                        nlohmann::json row{{"ctx", r.ctx},
                                           {"depth", r.depth},
                                           {"key", r.key},
                                           {"fp32_correct", r.ref.correct},
                                           {"fp32_logprob", r.ref.logprob},
                                           {"correct", r.test.correct},
                                           {"logprob", r.test.logprob}};
                        if (!reference.empty()) row["reference"] = reference;
                        rows.push_back(row.dump());
                        poll_signals();  // Ctrl-C between cases
                      });
    return rows;
  }

  // One RULER-style case (evaluation/ruler.h): (prompt ids, answers, gen_tokens), the case
  // `kvq run`'s [ruler] task builds for the same task, length, seed, sample and haystack.
  std::tuple<std::vector<int32_t>, std::vector<std::string>, int> ruler_case(
      const std::string& task, int length, uint64_t seed, int sample,
      const std::string& haystack) const {
    check_ruler(length, sample);
    eval::RulerCase c;
    {
      nb::gil_scoped_release release;
      c = eval::ruler_case(m_->tok, ruler_haystack(haystack), task, length, seed, sample);
    }
    return {c.prompt, c.answers, c.gen_tokens};
  }

  // The RULER-style suite over length x task x sample, each case answered greedily with the fp32
  // cache and with `kv`, as `kvq run`'s [ruler] rows (--json rows: its score, output and
  // fp32_score, fp32_output, answers, prompt_tokens, generated).
  std::vector<std::string> ruler(const std::string& kv, std::vector<std::string> tasks,
                                 const std::vector<int>& lengths, int samples, uint64_t seed,
                                 const std::string& haystack, int max_new, int threads,
                                 const std::string& backend) {
    const AttentionBackend b = parse_backend(backend);
    const CacheOptions test{parse_spec(kv)}, ref{reference_spec(b)};  // fp32; bf16 on cuda
    KVQ_CHECK(!lengths.empty(), "length: give at least one value");
    if (tasks.empty())  // every task, in RULER's order
      for (const auto& t : eval::ruler_tasks()) tasks.emplace_back(t.name);
    for (const auto& t : tasks) (void)eval::ruler_task(t);
    for (int l : lengths) check_ruler(l, 0);
    KVQ_CHECK(samples >= 1, "samples must be at least 1, got {}", samples);
    KVQ_CHECK(max_new >= 0, "max_new must be 0 (each task's budget) or more, got {}", max_new);
    std::vector<std::string> rows;
    const std::string reference = eval::reference_field(b);
    nb::gil_scoped_release release;
    m_->model.set_backend(b);
    const eval::RulerHaystack hay = ruler_haystack(haystack);
    for (int l : lengths)
      for (const auto& t : tasks)
        for (int i = 0; i < samples; ++i) {
          const eval::RulerCase c = eval::ruler_case(m_->tok, hay, t, l, seed, i);
          const eval::RulerOutput a =
              eval::ruler_trial(m_->model, m_->tok, ref, c, max_new, threads, poll_signals);
          const eval::RulerOutput r =
              eval::ruler_trial(m_->model, m_->tok, test, c, max_new, threads, poll_signals);
          nlohmann::json row{{"length", l},
                             {"task", t},
                             {"sample", i},
                             {"answers", c.answers},
                             {"prompt_tokens", c.prompt.size()},
                             {"fp32_score", a.score},
                             {"fp32_output", a.text},
                             {"score", r.score},
                             {"output", r.text},
                             {"generated", r.tokens}};
          if (!reference.empty()) row["reference"] = reference;
          rows.push_back(row.dump());
        }
    return rows;
  }

  // Per-layer, per-head amax of K and V, as `kvq model calibrate`: (model, source, k_amax [layers,
  // heads], v_amax); written to `out` (the CLI's file, byte for byte) when it is not empty.
  std::tuple<std::string, std::string, FloatOut, FloatOut> calibrate(
      const std::string& text, const std::string& text_name, int64_t max_tokens, int64_t skip,
      int ctx, bool pre_rope, int threads, const std::string& backend, const std::string& out) {
    const AttentionBackend b = parse_backend(backend);
    const int context = m_->model.config().context;
    KVQ_CHECK(ctx >= 1 && ctx <= context, "ctx {} outside [1, {}]", ctx, context);
    KVQ_CHECK(max_tokens >= 0 && skip >= 0, "max_tokens and skip_tokens must be 0 or more");
    eval::CalibrateOptions o;
    o.text_name = text_name;
    o.max_tokens = max_tokens;
    o.skip = skip;
    o.ctx = ctx;
    o.pre_rope = pre_rope;
    o.threads = threads;
    o.poll = poll_signals;
    fp8::Calibration cal;
    {
      nb::gil_scoped_release release;
      m_->model.set_backend(b);
      cal = eval::calibrate(*m_, text, o);
      if (!out.empty()) fp8::write_calibration(out, cal);
    }
    const auto table = [](const std::vector<std::vector<float>>& t) {
      std::vector<float> flat;
      for (const auto& row : t) flat.insert(flat.end(), row.begin(), row.end());
      return to_numpy(std::move(flat),
                      {static_cast<int64_t>(t.size()), static_cast<int64_t>(t.at(0).size())});
    };
    return {cal.model, cal.source, table(cal.k_amax), table(cal.v_amax)};
  }

  // Per layer: (k post-RoPE, k pre-RoPE, v), [T, kv_heads, head_dim] each, as `kvq model dump`.
  std::vector<std::tuple<FloatOut, FloatOut, FloatOut>> dump_kv(const std::vector<int32_t>& ids,
                                                                int threads) {
    std::vector<eval::LayerKv> kv;
    {
      nb::gil_scoped_release release;
      kv = eval::dump_kv(m_->model, ids, threads, poll_signals);
    }
    std::vector<std::tuple<FloatOut, FloatOut, FloatOut>> out;
    for (auto& l : kv) {
      const std::vector<int64_t> s{l.k.shape.tokens, l.k.shape.heads, l.k.shape.dim};
      out.emplace_back(to_numpy(std::move(l.k.data), s), to_numpy(std::move(l.k_pre.data), s),
                       to_numpy(std::move(l.v.data), s));
    }
    return out;
  }

 private:
  void check_ruler(int length, int sample) const {
    const int context = m_->model.config().context;
    KVQ_CHECK(length >= 1 && length <= context, "length {} outside [1, {}] (the model's context)",
              length, context);
    KVQ_CHECK(sample >= 0, "sample must be 0 or more, got {}", sample);
  }
  // "kjv" (or a text file: read_text) or "noise" (RULER's repeated sentences).
  eval::RulerHaystack ruler_haystack(const std::string& haystack) const {
    const bool noise = haystack == "noise";
    return eval::ruler_haystack(m_->tok, noise ? std::string() : cli::read_text(haystack), noise);
  }

  std::unique_ptr<eval::LoadedModel> m_;
  std::string path_;
};

}  // namespace
}  // namespace kvq::py

NB_MODULE(_kvq, m) {
  using namespace kvq::py;
  m.doc() = "kvq's C++ core; use the kvq package (python/kvq/__init__.py), not this module";
  nb::exception<kvq::Error>(m, "Error", PyExc_ValueError);
  m.attr("default_kv") = kvq::cli::kDefaultKv;
  m.attr("default_max_tokens") = kvq::cli::kDefaultMaxTokens;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Interrupted&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    }
  });
  m.def("spec_info", [](const std::string& s) { return spec_json(kvq::parse_spec(s)).dump(); });
  m.def("schemes", &schemes_json);
  // backend cpu's CPU paths (kernels/cpu/isa.h), as kvq --version's second line: compiled in,
  // run by this CPU, the one running and its instruction set
  m.def("cpu_paths", [] {
    return std::tuple(kvq::cpu::compiled_paths(), kvq::cpu::supported_paths(),
                      std::string(kvq::cpu::path().name), std::string(kvq::cpu::isa()));
  });
  // kernels/backend.h's table: what each backend runs, and whether it can run here
  m.def("backends", [] {
    nlohmann::json out = nlohmann::json::array();
    for (const kvq::BackendInfo& b : kvq::backends()) {
      const kvq::BackendSupport& s = b.support;
      out.push_back({{"name", b.name}, {"what", b.what}, {"host_memory", b.host},
                     {"decode", s.decode}, {"causal", s.causal}, {"model", s.model},
                     {"rot", s.rot}, {"sink", s.sink}, {"pre_rope", s.pre_rope},
                     {"unavailable",
                      b.id == kvq::AttentionBackend::kCuda ? kvq::cuda_unavailable() : ""}});
    }
    return out.dump();
  });
  m.def("quantize", &quantize);
  m.def("compare", &compare);
  m.def("plan", &plan);
  m.def("model_path", [](const std::string& p) { return kvq::cli::model_path(p); });
  m.def("text_path", [](const std::string& p) { return kvq::cli::text_path(p); });
  m.def("read_text", [](const std::string& p) { return kvq::cli::read_text(p); });
  nb::class_<Cache>(m, "Cache")
      .def(nb::init<const std::string&, int64_t, int64_t, const std::string&, int,
                    const std::string&, int>())
      .def("append", &Cache::append)
      .def("attend", &Cache::attend)
      .def("dequantize", &Cache::dequantize)
      .def("footprint", &Cache::footprint)
      .def_prop_ro("tokens", &Cache::tokens)
      .def_prop_ro("spec", &Cache::spec)
      .def_prop_ro("backend", &Cache::backend)
      .def_prop_ro("heads", &Cache::heads)
      .def_prop_ro("head_dim", &Cache::dim);
  nb::class_<Model>(m, "Model")
      .def(nb::init<const std::string&, const std::string&, const std::string&>())
      .def("config", &Model::config)
      .def("encode", &Model::encode)
      .def("decode", &Model::decode)
      .def_prop_ro("eos", &Model::eos)
      .def("ppl", &Model::ppl)
      .def("generate", &Model::generate)
      .def("dump_kv", &Model::dump_kv)
      .def("logits", &Model::logits)
      .def("diverge", &Model::diverge)
      .def("needle", &Model::needle)
      .def("ruler_case", &Model::ruler_case)
      .def("ruler", &Model::ruler)
      .def("calibrate", &Model::calibrate);
}
