// Loading a tokenizer folder and the encode / decode pipelines.
//
// Design note: encode follows the reference pipeline stage by stage:
// (1) added tokens whose `normalized` flag is false are cut out of the raw
// text; (2) each remaining segment is normalized and cut again at added
// tokens marked `normalized`; (3) the pre-tokenizer splits segments into
// words; (4) the BPE model turns each word into ids; (5) the post-processor
// adds BOS/EOS. Decode maps ids to token strings (added tokens included,
// special ones skipped on request) and runs the decoder chain over all of
// them, as the reference (transformers.js, the source of our test vectors)
// does.

#include "model/tokenizer/tokenizer.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/tokenizer/bpe_model.hpp"
#include "model/tokenizer/byte_level.hpp"
#include "model/tokenizer/pattern.hpp"
#include "model/tokenizer/components.hpp"
#include "model/tokenizer/unicode.hpp"

namespace metronome {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw model_error(file.string(), "", "cannot be opened");
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::exception& e) {
    throw model_error(file.string(), "", std::string("not valid JSON: ") + e.what());
  }
}

/// bos_token / eos_token in tokenizer_config.json: a string, an AddedToken
/// object {"content": ...}, or null.
std::string config_token(const json& cfg, const char* key, const json_origin& at) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null())
    return {};
  if (it->is_string())
    return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  at.at(key).fail("expected a string, {\"content\": ...} or null");
}

bool flag(const json& j, const char* key, const json_origin& at, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return fallback;
  if (!it->is_boolean())
    at.at(key).fail("expected true or false");
  return it->get<bool>();
}

void clean_up(std::string& s) {
  static const std::pair<const char*, const char*> rules[] = {
    {" .", "."},     {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
    {" n't", "n't"}, {" 'm", "'m"},   {" 's", "'s"},   {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : rules) {
    const std::string_view f(from), t(to);
    std::string out;
    size_t prev = 0;
    for (size_t pos = s.find(f); pos != std::string::npos; pos = s.find(f, prev)) {
      out.append(s, prev, pos - prev);
      out.append(t);
      prev = pos + f.size();
    }
    out.append(s, prev);
    s = std::move(out);
  }
}

} // namespace

tokenizer::tokenizer() = default;
tokenizer::~tokenizer() = default;

std::shared_ptr<const tokenizer> tokenizer::load(const fs::path& dir) {
  const fs::path file = dir / "tokenizer.json";
  if (!fs::exists(file))
    throw model_error(file.string(), "", "no such file (the tokenizer of the model)");
  const json j = read_json(file);
  const json_origin root{file.string(), ""};
  if (!j.is_object())
    root.fail("expected a JSON object");
  auto tok = std::shared_ptr<tokenizer>(new tokenizer());
  tok->dir_ = dir;
  if (!j.contains("model"))
    root.at("model").fail("missing");
  tok->model_ = bpe_model::make(j["model"], root.at("model"));
  tok->normalizer_ = normalizer::make(j.value("normalizer", json()), root.at("normalizer"));
  tok->pre_tokenizer_ =
    pre_tokenizer::make(j.value("pre_tokenizer", json()), root.at("pre_tokenizer"));
  if (tok->pre_tokenizer_)
    if (auto plan = tok->pre_tokenizer_->streaming()) {
      tok->streaming_ = true;
      tok->stream_split_ = plan->split;
      tok->stream_bytes_ = plan->byte_level;
    }
  tok->decoder_ = decoder::make(j.value("decoder", json()), root.at("decoder"));
  tok->post_processor_ =
    post_processor::make(j.value("post_processor", json()), root.at("post_processor"));

  // -- added tokens --------------------------------------------------------------
  int32_t max_id = tok->model_->max_id();
  if (auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) {
    if (!it->is_array())
      root.at("added_tokens").fail("expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& a = (*it)[i];
      const auto at = root.at("added_tokens").at(i);
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer()
          || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() > INT32_MAX)
        at.at("id").fail("missing or not a non-negative integer");
      added_token t;
      t.id = a["id"].get<int32_t>();
      t.content = read_string(a, "content", at);
      if (t.content.empty())
        at.at("content").fail("empty");
      t.special = flag(a, "special", at, false);
      t.lstrip = flag(a, "lstrip", at, false);
      t.rstrip = flag(a, "rstrip", at, false);
      t.single_word = flag(a, "single_word", at, false);
      t.normalized = flag(a, "normalized", at, !t.special);
      max_id = std::max(max_id, t.id);
      tok->added_.tokens.push_back(std::move(t));
    }
  }
  std::vector<std::string> normalized_keys;
  for (const auto& t : tok->added_.tokens) {
    std::string key = t.content;
    if (t.normalized && tok->normalizer_)
      tok->normalizer_->normalize(key);
    normalized_keys.push_back(std::move(key));
  }
  tok->added_.build(normalized_keys);
  tok->vocab_size_ = max_id + 1;

  // -- tokenizer_config.json ----------------------------------------------------------
  const fs::path config_file = dir / "tokenizer_config.json";
  if (fs::exists(config_file)) {
    const json cfg = read_json(config_file);
    const json_origin croot{config_file.string(), ""};
    if (!cfg.is_object())
      croot.fail("expected a JSON object");
    tok->bos_token_ = config_token(cfg, "bos_token", croot);
    tok->eos_token_ = config_token(cfg, "eos_token", croot);
    if (!tok->bos_token_.empty()) {
      tok->bos_id_ = tok->token_to_id(tok->bos_token_);
      if (!tok->bos_id_)
        croot.at("bos_token").fail("'" + tok->bos_token_ + "' is not a token of tokenizer.json");
    }
    if (!tok->eos_token_.empty()) {
      tok->eos_id_ = tok->token_to_id(tok->eos_token_);
      if (!tok->eos_id_)
        croot.at("eos_token").fail("'" + tok->eos_token_ + "' is not a token of tokenizer.json");
    }
    tok->clean_up_spaces_ = flag(cfg, "clean_up_tokenization_spaces", croot, false);
    // transformers' LlamaTokenizer(Fast) rebuilds the post-processor from
    // add_bos_token / add_eos_token (defaults true / false) when it loads.
    const auto cls = cfg.value("tokenizer_class", std::string());
    if (cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast") {
      const bool add_bos = flag(cfg, "add_bos_token", croot, true);
      const bool add_eos = flag(cfg, "add_eos_token", croot, false);
      if (add_bos && !tok->bos_id_)
        croot.at("add_bos_token").fail("true, but there is no bos_token");
      if (add_eos && !tok->eos_id_)
        croot.at("add_eos_token").fail("true, but there is no eos_token");
      std::vector<int32_t> prefix, suffix;
      if (add_bos)
        prefix.push_back(*tok->bos_id_);
      if (add_eos)
        suffix.push_back(*tok->eos_id_);
      tok->post_processor_ = post_processor::wrap(std::move(prefix), std::move(suffix));
    }
  }
  return tok;
}

// -- encode ------------------------------------------------------------------------------

std::vector<int32_t> tokenizer::encode(std::string_view text, encode_options options) const {
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<added_split> splits;
  added_.raw.split(text, added_.tokens, !options.parse_special, splits);
  for (const auto& s : splits) {
    if (s.token)
      ids.push_back(*s.token);
    else
      encode_normalized(text.substr(s.begin, s.end - s.begin), s.begin == 0,
                        options.parse_special, ids);
  }
  if (options.add_special_tokens && post_processor_)
    post_processor_->process(ids);
  return ids;
}

void tokenizer::encode_normalized(std::string_view text, bool at_start, bool parse_special,
                                  std::vector<int32_t>& out) const {
  if (text.empty())
    return;
  std::string normalized(text);
  if (normalizer_)
    normalizer_->normalize(normalized);
  if (added_.normalized.empty()) {
    encode_segment(normalized, at_start, out);
    return;
  }
  std::vector<added_split> splits;
  added_.normalized.split(normalized, added_.tokens, !parse_special, splits);
  for (const auto& s : splits) {
    if (s.token)
      out.push_back(*s.token);
    else
      encode_segment(std::string_view(normalized).substr(s.begin, s.end - s.begin),
                     at_start && s.begin == 0, out);
  }
}

void tokenizer::encode_segment(std::string_view text, bool at_start,
                               std::vector<int32_t>& out) const {
  if (text.empty())
    return;
  if (!pre_tokenizer_) {
    model_->tokenize(text, out);
    return;
  }
  if (streaming_) {
    // Same words as pre_tokenize() would give, without building pieces.
    thread_local std::vector<std::pair<size_t, size_t>> matches;
    thread_local std::string mapped;
    matches.clear();
    if (stream_split_)
      stream_split_->find_all(text, matches);
    auto word = [&](size_t b, size_t e) {
      if (e <= b)
        return;
      if (stream_bytes_) {
        mapped.clear();
        byte_level::encode(text.substr(b, e - b), mapped);
        model_->tokenize(mapped, out);
      } else {
        model_->tokenize(text.substr(b, e - b), out);
      }
    };
    size_t prev = 0;
    for (auto [b, e] : matches) {
      word(prev, b);
      word(b, e);
      prev = e;
    }
    word(prev, text.size());
    return;
  }
  std::vector<text_piece> pieces;
  pieces.push_back({std::string(text), at_start});
  pre_tokenizer_->pre_tokenize(pieces);
  for (const auto& p : pieces)
    model_->tokenize(p.text, out);
}

// -- decode ------------------------------------------------------------------------------

std::string tokenizer::decode(std::span<const int32_t> ids, decode_options options) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const added_token* a = added_.find(id)) {
      if (!(options.skip_special_tokens && a->special))
        tokens.push_back(a->content);
    } else if (const std::string* t = model_->id_to_token(id)) {
      tokens.push_back(*t);
    }
  }
  std::string text = decode_tokens(std::move(tokens));
  if (options.clean_up_spaces)
    clean_up(text);
  return text;
}

std::string tokenizer::token_bytes(int32_t id) const {
  if (const added_token* a = added_.find(id))
    return a->content;
  const std::string* t = model_->id_to_token(id);
  if (!t)
    return {};
  if (!decoder_)
    return *t;
  // Decoders treat a text's first token apart (Metaspace and Strip drop its
  // leading space): decode behind an anchor that every decoder leaves as
  // it is, then take the anchor off.
  std::vector<std::string> tokens{"a", *t};
  decoder_->decode_chain_raw(tokens);
  std::string text;
  for (const auto& s : tokens)
    text += s;
  if (!text.empty() && text[0] == 'a')
    return text.substr(1);
  tokens.assign(1, *t);
  decoder_->decode_chain_raw(tokens);
  text.clear();
  for (const auto& s : tokens)
    text += s;
  return text;
}

std::string tokenizer::decode_tokens(std::vector<std::string> tokens) const {
  std::string text;
  if (decoder_) {
    decoder_->decode_chain(tokens);
    for (const auto& t : tokens)
      text += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0)
        text += ' ';
      text += tokens[i];
    }
  }
  return text;
}

// -- vocabulary ----------------------------------------------------------------------------

std::optional<int32_t> tokenizer::token_to_id(std::string_view token) const {
  if (const added_token* a = added_.find(token))
    return a->id;
  return model_->token_to_id(token);
}

std::optional<std::string> tokenizer::id_to_token(int32_t id) const {
  if (const added_token* a = added_.find(id))
    return a->content;
  if (const std::string* t = model_->id_to_token(id))
    return *t;
  return std::nullopt;
}

bool tokenizer::is_special(int32_t id) const {
  const added_token* a = added_.find(id);
  return a && a->special;
}

} // namespace metronome
