// Design note: the YAML document is walked against the key table rather than
// decoded into structs field by field. At each mapping the walker knows the
// dotted path it is at; a child is either a leaf key (its scalar text goes to
// the key's `set`), a section (walked recursively) or unknown (an error with
// a suggestion). Scalars are handed over as text, so a value from the file
// and the same value from `--set` are parsed by the same code.

#include "config/config_loader.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "config/config_schema.hpp"

namespace metronome {

namespace {

// -- suggestions -----------------------------------------------------------------

/// Optimal string alignment distance (Levenshtein plus adjacent swaps).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i)
    d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j)
    d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

size_t allowed_distance(std::string_view name) {
  return name.size() <= 4 ? 1 : name.size() <= 8 ? 2 : 3;
}

/// The closest of `candidates` within the allowed distance, or "". A
/// candidate whose length differs by the allowed distance or more cannot be
/// within it, and is not compared: a key of thousands of characters costs
/// nothing (the distance's table is the product of both lengths).
std::string closest(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = allowed_distance(name) + 1;
  for (const auto& c : candidates) {
    const size_t gap = name.size() > c.size() ? name.size() - c.size() : c.size() - name.size();
    if (gap >= best_d)
      continue;
    auto d = edit_distance(name, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    if (!out.empty())
      out += ", ";
    out += n;
  }
  return out;
}

std::string child_path(std::string_view section, std::string_view name) {
  return section.empty() ? std::string(name) : std::string(section) + "." + std::string(name);
}

// -- the YAML walk ---------------------------------------------------------------

std::string line_of(const YAML::Node& node) {
  auto mark = node.Mark();
  if (mark.is_null())
    return {};
  return " (line " + std::to_string(mark.line + 1) + ")";
}

std::string node_kind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "no value";
    default: return "a scalar";
  }
}

void set_leaf(server_config& cfg, const config_key& key, const YAML::Node& key_node,
              const YAML::Node& value, const std::string& source) {
  std::string problem;
  if (key.kind == value_kind::list && (value.IsSequence() || value.IsNull())) {
    std::vector<std::string> items;
    for (const auto& item : value) {
      if (!item.IsScalar())
        throw config_error(source, key.path,
                           "expected " + key.allowed + ", got " + node_kind(item) + " in the list"
                             + line_of(item));
      items.push_back(item.Scalar());
    }
    problem = key.set_list(cfg, items);
  } else if (value.IsScalar()) {
    problem = key.set(cfg, value.Scalar());
  } else if (value.IsNull() && (key.kind == value_kind::text || key.kind == value_kind::choice)) {
    // `path:` with nothing after it means the empty string, where one is allowed.
    problem = key.set(cfg, "");
    if (!problem.empty())
      problem = "expected " + key.allowed + ", got no value";
  } else {
    problem = "expected " + key.allowed + ", got " + node_kind(value);
  }
  if (!problem.empty())
    throw config_error(source, key.path, problem + line_of(key_node));
}

void walk(server_config& cfg, const YAML::Node& map, const std::string& section,
          const std::string& source) {
  std::set<std::string> seen;
  for (const auto& entry : map) {
    // Copies: the iterator's pairs are temporaries, nodes are handles.
    const YAML::Node key_node = entry.first;
    const YAML::Node value = entry.second;
    if (!key_node.IsScalar())
      throw config_error(source, section,
                         "keys must be plain names, got " + node_kind(key_node)
                           + line_of(key_node));
    auto path = child_path(section, key_node.Scalar());
    if (!seen.insert(key_node.Scalar()).second)
      throw config_error(source, path, "duplicate key" + line_of(key_node));
    if (const auto* key = find_config_key(path)) {
      set_leaf(cfg, *key, key_node, value, source);
    } else if (is_config_section(path)) {
      if (value.IsMap())
        walk(cfg, value, path, source);
      else if (!value.IsNull())
        throw config_error(source, path,
                           "expected a mapping of keys (" + join(config_children(path))
                             + "), got " + node_kind(value) + line_of(value));
    } else {
      throw config_error(source, path,
                         "unknown key" + unknown_key_hint(path) + line_of(key_node));
    }
  }
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error(path.string(), "", std::string("cannot open: ") + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad())
    throw config_error(path.string(), "", "cannot read the file");
  return text.str();
}

// -- shorthand flags -------------------------------------------------------------

constexpr std::array<config_flag, 23> flags = {{
  {"--host", "server.host", "Address to listen on"},
  {"--port", "server.port", "TCP port (0 = any free port)"},
  {"--model", "model.path", "Hugging Face model folder (unset: the shipped metronome-tiny)"},
  {"--device", "model.device", "Where the model runs"},
  {"--data-parallel", "model.data_parallel", "Replicas of the model behind one router"},
  {"--tensor-parallel", "model.tensor_parallel", "CUDA devices one model is split over"},
  {"--worker-listen", "workers.listen",
   "HOST:PORT where `metronome worker` processes attach as more replicas"},
  {"--served-model-name", "model.served_model_name",
   "Model name in the API (unset: the model's id or folder name)"},
  {"--chat-template", "model.chat_template",
   "Chat prompt format (unset: the template in tokenizer_config.json)"},
  {"--max-model-len", "model.max_model_len", "Longest prompt + output in tokens (0 = the model's)"},
  {"--quantize", "model.quantize",
   "Quantize a float model at load (int4: round to nearest, AWQ layout, group 128)"},
  {"--max-batch-size", "engine.max_batch_size", "Cap on running sequences"},
  {"--max-num-batched-tokens", "engine.max_num_batched_tokens", "Token budget per step"},
  {"--page-size", "engine.page_size", "Tokens per KV-cache page"},
  {"--kv-cache-tokens", "engine.kv_cache_tokens", "KV-cache capacity in tokens (0 = auto)"},
  {"--gpu-memory-fraction", "engine.gpu_memory_fraction", "Share of GPU memory to use"},
  {"--kv-cache-dtype", "engine.kv_cache_dtype", "KV-cache element type (fp8: CUDA only; fp8_e5m2: CUDA, or the CPU reference)"},
  {"--policy", "engine.policy", "Scheduling policy"},
  {"--io-threads", "server.io_threads", "Network threads"},
  {"--log-level", "logging.level", "Log verbosity"},
  {"--log-format", "logging.format", "Log lines on stderr as text or one JSON object a line"},
  {"--api-key", "server.api_keys",
   "API key(s) clients must send, comma-separated (visible to ps: prefer METRONOME_API_KEY or "
   "server.api_keys_file)"},
  {"--allowed-origins", "server.allowed_origins",
   "Browser origins that may call the API (CORS) and open /v1/ws besides the server's own, "
   "comma-separated; * = any"},
}};

} // namespace

// -- public functions --------------------------------------------------------------

std::string unknown_key_hint(std::string_view key_path) {
  auto dot = key_path.rfind('.');
  auto section = dot == std::string_view::npos ? std::string_view{} : key_path.substr(0, dot);
  auto name = dot == std::string_view::npos ? key_path : key_path.substr(dot + 1);
  if (is_config_section(section)) {
    // The same name in another section (engine.min_batch_size -> batching.).
    std::string dotted = ".";
    dotted += name;
    for (const auto& k : config_keys())
      if (k.path.ends_with(dotted))
        return " (did you mean " + k.path + "?)";
    // A sibling spelt almost the same.
    if (auto best = closest(name, config_children(section)); !best.empty())
      return " (did you mean " + best + "?)";
    auto children = config_children(section);
    return std::string(section.empty() ? " (known sections: " : " (known keys here: ")
           + join(children) + ")";
  }
  // The section itself is wrong: compare whole paths.
  std::vector<std::string> paths;
  for (const auto& k : config_keys())
    paths.push_back(k.path);
  if (auto best = closest(key_path, paths); !best.empty())
    return " (did you mean " + best + "?)";
  return " (known sections: " + join(config_children("")) + ")";
}

namespace {

/// Counts a parse's events and throws once there are more than any input
/// of `bytes` bytes can give: yaml-cpp 0.7 (Debian 12) never returns on some
/// malformed input, emitting nodes until memory runs out. Found by
/// tests/fuzz/config_yaml_fuzz.cpp; "&a,b" is one such input (a ',' after a
/// top-level anchor, tag or flow collection).
class bounded_events final : public YAML::EventHandler {
public:
  explicit bounded_events(size_t bytes) : limit_(4 * bytes + 16) {}

  struct exceeded {};

  void OnDocumentStart(const YAML::Mark&) override { tick(); }
  void OnDocumentEnd() override { tick(); }
  void OnNull(const YAML::Mark&, YAML::anchor_t) override { tick(); }
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override { tick(); }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {
    tick();
  }
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    tick();
  }
  void OnSequenceEnd() override { tick(); }
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    tick();
  }
  void OnMapEnd() override { tick(); }

private:
  void tick() {
    if (++count_ > limit_)
      throw exceeded{};
  }

  size_t count_ = 0;
  const size_t limit_;
};

/// YAML::LoadAll, after a first pass that makes sure the parse ends (see
/// bounded_events; every event of a YAML text stands for at least a byte
/// of it, but for a few per document). Throws YAML::Exception like LoadAll,
/// or config_error for a text the parser would loop on.
std::vector<YAML::Node> load_all_bounded(const std::string& text, const std::string& source) {
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    bounded_events events(text.size());
    while (parser.HandleNextDocument(events)) {
    }
  } catch (const bounded_events::exceeded&) {
    throw config_error(source, "",
                       "invalid YAML: the parser does not terminate on this text (a ',' "
                       "outside brackets after an anchor, a tag or a [...] or {...}?)");
  }
  return YAML::LoadAll(text);
}

} // namespace

void merge_config_yaml(server_config& cfg, std::string_view yaml, const std::string& source) {
  std::vector<YAML::Node> docs;
  try {
    docs = load_all_bounded(std::string(yaml), source);
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null())
      where = " at line " + std::to_string(e.mark.line + 1) + ", column "
              + std::to_string(e.mark.column + 1);
    throw config_error(source, "", "invalid YAML" + where + ": " + e.msg);
  }
  if (docs.size() > 1)
    throw config_error(source, "", "expected one YAML document, found " + std::to_string(docs.size()));
  if (docs.empty() || docs[0].IsNull())
    return; // An empty file keeps every default.
  const auto& root = docs[0];
  if (!root.IsMap())
    throw config_error(source, "",
                       "expected a mapping of sections (" + join(config_children(""))
                         + ") at the top level, got " + node_kind(root));
  walk(cfg, root, "", source);
}

server_config load_config_string(std::string_view yaml, const std::string& source) {
  server_config cfg;
  merge_config_yaml(cfg, yaml, source);
  validate(cfg, source);
  return cfg;
}

server_config load_config_file(const std::filesystem::path& path) {
  return load_config_string(read_file(path), path.string());
}

void apply_override(server_config& cfg, std::string_view key_path, std::string_view value,
                    const std::string& source) {
  const auto* key = find_config_key(key_path);
  if (key == nullptr) {
    if (!key_path.empty() && is_config_section(key_path))
      throw config_error(source, std::string(key_path),
                         "is a section; set one of its keys ("
                           + join(config_children(key_path)) + ")");
    throw config_error(source, std::string(key_path), "unknown key" + unknown_key_hint(key_path));
  }
  if (auto problem = key->set(cfg, value); !problem.empty())
    throw config_error(source, key->path, problem);
}

void apply_set(server_config& cfg, std::string_view assignment, const std::string& source) {
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0)
    throw config_error(source, "",
                       "expected key.path=value, got \"" + std::string(assignment) + "\"");
  apply_override(cfg, assignment.substr(0, eq), assignment.substr(eq + 1), source);
}

std::span<const config_flag> config_flags() {
  return flags;
}

std::optional<std::string_view> flag_key_path(std::string_view flag) {
  for (const auto& f : flags)
    if (f.flag == flag || f.flag.substr(2) == flag)
      return f.key_path;
  return std::nullopt;
}

server_config load_config(const std::optional<std::filesystem::path>& file,
                          const std::vector<config_override>& overrides) {
  server_config cfg;
  std::string source;
  if (file) {
    source = file->string();
    merge_config_yaml(cfg, read_file(*file), source);
  }
  for (const auto& o : overrides)
    apply_override(cfg, o.key_path, o.value, o.source);
  if (!overrides.empty())
    source = source.empty() ? "command line" : source + " with command-line overrides";
  validate(cfg, source.empty() ? "defaults" : source);
  return cfg;
}

std::string to_yaml(const server_config& cfg, bool with_docs) {
  std::string out = "# Metronome server configuration\n";
  std::vector<std::string> open; // the sections the previous key was in
  for (const auto& key : config_keys()) {
    std::vector<std::string> parts;
    std::string_view rest = key.path;
    for (auto dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
      parts.emplace_back(rest.substr(0, dot));
      rest.remove_prefix(dot + 1);
    }
    size_t common = 0;
    while (common < open.size() && common < parts.size() && open[common] == parts[common])
      ++common;
    for (size_t level = common; level < parts.size(); ++level) {
      if (level == 0)
        out += "\n";
      out += std::string(2 * level, ' ') + parts[level] + ":\n";
    }
    open = parts;
    auto indent = std::string(2 * parts.size(), ' ');
    if (with_docs)
      out += indent + "# " + key.doc + "\n";
    out += indent + std::string(rest) + ": " + key.get(cfg) + "\n";
  }
  return out;
}

} // namespace metronome
