// Post-processors of tokenizer.json: TemplateProcessing (single sequences),
// BertProcessing, RobertaProcessing, ByteLevel (nothing to do on ids) and
// Sequence.

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/tokenizer/components.hpp"

namespace metronome {

namespace {

using nlohmann::json;

class wrap_processor final : public post_processor {
public:
  wrap_processor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
    : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  }

private:
  std::vector<int32_t> prefix_, suffix_;
};

class sequence_processor final : public post_processor {
public:
  explicit sequence_processor(std::vector<std::unique_ptr<post_processor>> parts)
    : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_)
      p->process(ids);
  }

private:
  std::vector<std::unique_ptr<post_processor>> parts_;
};

std::unique_ptr<post_processor> make_template(const json& j, const json_origin& at) {
  auto single = j.find("single");
  if (single == j.end() || !single->is_array())
    at.at("single").fail("missing or not an array");
  const json specials = j.value("special_tokens", json::object());
  std::vector<int32_t> prefix, suffix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const auto& item = (*single)[i];
    const auto here = at.at("single").at(i);
    if (item.contains("Sequence")) {
      if (seen_sequence)
        here.fail("a single-sequence template may hold one sequence only");
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id"))
      here.fail("expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    const auto name = item["SpecialToken"]["id"].get<std::string>();
    auto it = specials.find(name);
    if (it == specials.end() || !it->contains("ids") || !(*it)["ids"].is_array())
      at.at("special_tokens").fail("no ids for '" + name + "'");
    auto& target = seen_sequence ? suffix : prefix;
    for (const auto& id : (*it)["ids"])
      target.push_back(id.get<int32_t>());
  }
  return std::make_unique<wrap_processor>(std::move(prefix), std::move(suffix));
}

int32_t pair_id(const json& j, const char* key, const json_origin& at) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer())
    at.at(key).fail("expected [token, id]");
  return (*it)[1].get<int32_t>();
}

} // namespace

std::unique_ptr<post_processor> post_processor::wrap(std::vector<int32_t> prefix,
                                                     std::vector<int32_t> suffix) {
  return std::make_unique<wrap_processor>(std::move(prefix), std::move(suffix));
}

std::unique_ptr<post_processor> post_processor::make(const json& j, const json_origin& at) {
  if (j.is_null())
    return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    at.fail("expected an object with a \"type\"");
  const auto type = j["type"].get<std::string>();
  if (type == "ByteLevel")
    return nullptr;
  if (type == "TemplateProcessing")
    return make_template(j, at);
  if (type == "BertProcessing" || type == "RobertaProcessing")
    return std::make_unique<wrap_processor>(std::vector<int32_t>{pair_id(j, "cls", at)},
                                            std::vector<int32_t>{pair_id(j, "sep", at)});
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array())
      at.at("processors").fail("missing or not an array");
    std::vector<std::unique_ptr<post_processor>> parts;
    for (size_t i = 0; i < it->size(); ++i)
      if (auto p = make((*it)[i], at.at("processors").at(i)))
        parts.push_back(std::move(p));
    return std::make_unique<sequence_processor>(std::move(parts));
  }
  at.at("type").fail("unsupported post-processor '" + type + "'");
}

} // namespace metronome
