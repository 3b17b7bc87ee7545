#include "net/json_reader.hpp"

#include <cstdint>
#include <string>

#include <simdjson.h>

namespace metronome::net {

namespace {

using json = nlohmann::json;
using simdjson::dom::element;
using simdjson::dom::element_type;

/// The nlohmann value of `e`, as nlohmann's parser types it: non-negative
/// integers unsigned, negative ones signed.
json convert(element e) {
  switch (e.type()) {
    case element_type::ARRAY: {
      json out = json::array();
      auto& items = out.get_ref<json::array_t&>();
      const simdjson::dom::array arr = e.get_array().value_unsafe();
      items.reserve(arr.size());
      for (element item : arr)
        items.push_back(convert(item));
      return out;
    }
    case element_type::OBJECT: {
      json out = json::object();
      auto& fields = out.get_ref<json::object_t&>();
      const simdjson::dom::object obj = e.get_object().value_unsafe();
      for (auto field : obj)
        fields.insert_or_assign(std::string(field.key), convert(field.value));
      return out;
    }
    case element_type::STRING:
      return json(std::string(e.get_string().value_unsafe()));
    case element_type::INT64: {
      const int64_t v = e.get_int64().value_unsafe();
      return v >= 0 ? json(uint64_t(v)) : json(v);
    }
    case element_type::UINT64:
      return json(e.get_uint64().value_unsafe());
    case element_type::DOUBLE:
      return json(e.get_double().value_unsafe());
    case element_type::BOOL:
      return json(e.get_bool().value_unsafe());
    case element_type::NULL_VALUE:
    default:
      return json(nullptr);
  }
}

} // namespace

/// What a thread's parser keeps between bodies; one that grew past it for a
/// large body gives its buffers back, so an io thread does not hold several
/// times the largest body ever sent for the rest of its life.
constexpr size_t kept_capacity = size_t(1) << 20;

std::optional<json> read_json(std::string_view text) {
  thread_local simdjson::dom::parser parser;
  std::optional<json> out;
  // simdjson reads up to SIMDJSON_PADDING bytes past the text: it copies the
  // text into a padded buffer of its own when asked to (realloc_if_needed).
  simdjson::dom::element root;
  if (parser.parse(text.data(), text.size(), true).get(root) == simdjson::SUCCESS) {
    try {
      out = convert(root);
    } catch (const std::exception&) {
      // Allocation failure: let nlohmann try (and report) below.
    }
  }
  if (parser.capacity() > kept_capacity)
    parser = simdjson::dom::parser();
  if (out)
    return out;
  json fallback = json::parse(text, nullptr, false);
  if (fallback.is_discarded())
    return std::nullopt;
  return fallback;
}

void dispose_json(json& doc) noexcept {
  if (doc.is_array()) {
    json::array_t items;
    items.swap(doc.get_ref<json::array_t&>());
    for (auto& item : items)
      if (item.is_structured())
        dispose_json(item);
    // `items` now holds scalars and empty containers: each dies in place.
  } else if (doc.is_object()) {
    json::object_t fields;
    fields.swap(doc.get_ref<json::object_t&>());
    for (auto& [key, value] : fields)
      if (value.is_structured())
        dispose_json(value);
  }
  doc = nullptr;
}

} // namespace metronome::net
