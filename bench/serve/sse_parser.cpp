#include "bench/serve/sse_parser.hpp"

#include <nlohmann/json.hpp>

namespace metronome::bench {

namespace {

using json = nlohmann::json;

std::optional<int32_t> int_field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer())
    return std::nullopt;
  return it->get<int32_t>();
}

} // namespace

stream_chunk parse_stream_chunk(std::string_view data, api_endpoint endpoint) {
  stream_chunk c;
  if (data == "[DONE]") {
    c.done = true;
    return c;
  }
  json j = json::parse(data, nullptr, false);
  if (!j.is_object()) {
    c.error = "malformed stream event: " + std::string(data.substr(0, 200));
    return c;
  }
  if (auto e = j.find("error"); e != j.end()) {
    if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
      c.error = (*e)["message"].get<std::string>();
    else
      c.error = e->dump();
    return c;
  }
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    const auto& first = (*ch)[0];
    if (first.is_object()) {
      const json* text = nullptr;
      if (endpoint == api_endpoint::completions) {
        if (auto t = first.find("text"); t != first.end())
          text = &*t;
      } else if (auto d = first.find("delta"); d != first.end() && d->is_object()) {
        if (auto t = d->find("content"); t != d->end())
          text = &*t;
      }
      if (text && text->is_string())
        c.text = text->get<std::string>();
      if (auto f = first.find("finish_reason"); f != first.end() && f->is_string())
        c.finish_reason = f->get<std::string>();
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    c.prompt_tokens = int_field(*u, "prompt_tokens");
    c.completion_tokens = int_field(*u, "completion_tokens");
  }
  return c;
}

std::vector<stream_chunk> sse_parser::feed(std::string_view bytes) {
  std::vector<stream_chunk> out;
  for (char ch : bytes) {
    if (ch != '\n') {
      line_ += ch;
      continue;
    }
    if (!line_.empty() && line_.back() == '\r')
      line_.pop_back();
    if (line_.empty()) { // a blank line ends the event
      if (have_data_)
        out.push_back(parse_stream_chunk(data_, endpoint_));
      data_.clear();
      have_data_ = false;
    } else if (line_.starts_with("data:")) {
      std::string_view v(line_);
      v.remove_prefix(5);
      if (!v.empty() && v.front() == ' ')
        v.remove_prefix(1);
      if (have_data_)
        data_ += '\n'; // several data lines form one payload
      data_ += v;
      have_data_ = true;
    }
    line_.clear();
  }
  return out;
}

} // namespace metronome::bench
