#include "model/model_card.hpp"

#include <cctype>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"

namespace metronome {

std::optional<model_card> read_model_card(const std::filesystem::path& dir) {
  const auto path = dir / model_card_file;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (std::filesystem::exists(path))
      throw model_error(path.string(), "", "cannot open file");
    return std::nullopt;
  }
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw model_error(path.string(), "", std::string("malformed JSON: ") + e.what());
  }
  if (!doc.is_object())
    throw model_error(path.string(), "", "expected a JSON object");
  auto text = [&](const char* key) -> std::string {
    auto it = doc.find(key);
    if (it == doc.end() || it->is_null())
      return {};
    if (!it->is_string())
      throw model_error(path.string(), key, "expected a string");
    return it->get<std::string>();
  };
  model_card card{text("id"), text("description")};
  if (!card.id.empty()) {
    bool ok = card.id.size() <= 128;
    for (unsigned char c : card.id)
      ok = ok && (std::isalnum(c) || c == '.' || c == '_' || c == '-' || c == ':' || c == '/');
    if (!ok)
      throw model_error(path.string(), "id",
                        "expected 1-128 characters of letters, digits, '.', '_', '-', ':', '/'");
  }
  if (card.description.size() > 500)
    throw model_error(path.string(), "description", "longer than 500 bytes");
  for (unsigned char c : card.description)
    if (c < 0x20 || c == 0x7f)
      throw model_error(path.string(), "description", "has a control character");
  return card;
}

} // namespace metronome
