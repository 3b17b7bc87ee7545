// Native renderers of the chat templates of Llama 3, Llama 3.1+, Llama 2,
// Mistral, ChatML (Qwen 1.5/2/2.5), Qwen3 and plain text (recognition of the template
// text is in chat_template_recognition.cpp).
//
// Design note: each renderer transcribes one Jinja template statement by
// statement, including its quirks (Llama 3 trims content, Llama 2 strips it
// and folds the system prompt into the first user turn, Mistral checks that
// roles alternate, Qwen3 moves <think> blocks), and Python's string methods
// (str.strip() strips Unicode white space) where the template calls them.

#include "model/tokenizer/chat_template.hpp"

#include <ctime>
#include <stdexcept>

#include "model/tokenizer/unicode.hpp"

namespace metronome {

namespace {


// -- Python string helpers (Jinja runs on Python strings) --------------------------

/// str.strip() / lstrip() / rstrip() without arguments: Unicode white space.
std::string py_strip(std::string_view s, bool left = true, bool right = true) {
  size_t begin = 0, end = s.size();
  if (left)
    while (begin < end) {
      size_t i = begin;
      if (!unicode::is_python_space(unicode::next_code_point(s, i)))
        break;
      begin = i;
    }
  if (right)
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
        --start;
      size_t i = start;
      if (!unicode::is_python_space(unicode::next_code_point(s, i)))
        break;
      end = start;
    }
  return std::string(s.substr(begin, end - begin));
}

/// str.strip(c) / lstrip(c) / rstrip(c) with one ASCII character.
std::string py_strip_char(std::string_view s, char c, bool left = true, bool right = true) {
  size_t begin = 0, end = s.size();
  if (left)
    while (begin < end && s[begin] == c)
      ++begin;
  if (right)
    while (end > begin && s[end - 1] == c)
      --end;
  return std::string(s.substr(begin, end - begin));
}

/// s.split(sep)[0] and s.split(sep)[-1].
std::string_view before_first(std::string_view s, std::string_view sep) {
  auto pos = s.find(sep);
  return pos == std::string_view::npos ? s : s.substr(0, pos);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  auto pos = s.rfind(sep);
  return pos == std::string_view::npos ? s : s.substr(pos + sep.size());
}

void check_roles(const std::vector<chat_message>& messages) {
  if (messages.empty())
    throw std::invalid_argument("the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      throw std::invalid_argument("message " + std::to_string(i) + ": unknown role '" + r
                                  + "' (expected system, user or assistant)");
  }
}

} // namespace

// -- construction ----------------------------------------------------------------------

chat_template::chat_template(format f, std::string bos_token, std::string eos_token)
  : format_(f), bos_(std::move(bos_token)), eos_(std::move(eos_token)) {
  fixed_date_ = "26 Jul 2024";
}

std::string chat_template::name() const {
  switch (format_) {
    case format::llama3:
      return "llama3";
    case format::llama31:
      return "llama3.1";
    case format::llama2:
      return "llama2";
    case format::mistral:
      return "mistral";
    case format::chatml:
      return "chatml";
    case format::qwen3:
      return "qwen3";
    case format::plain:
      return "plain";
  }
  return "unknown";
}

// -- rendering -----------------------------------------------------------------------------

std::string chat_template::apply(const std::vector<chat_message>& messages,
                                 bool add_generation_prompt, const render_options& o) const {
  check_roles(messages);
  switch (format_) {
    case format::llama3:
      return render_llama3(messages, add_generation_prompt);
    case format::llama31:
      return render_llama31(messages, add_generation_prompt, o);
    case format::llama2:
      return render_llama2(messages);
    case format::mistral:
      return render_mistral(messages);
    case format::chatml:
      return render_chatml(messages, add_generation_prompt);
    case format::qwen3:
      return render_qwen3(messages, add_generation_prompt, o);
    case format::plain:
      return render_plain(messages);
  }
  throw std::logic_error("chat_template: unknown format");
}

std::string chat_template::render_llama3(const std::vector<chat_message>& m, bool gen) const {
  std::string out;
  for (size_t i = 0; i < m.size(); ++i) {
    if (i == 0)
      out += bos_;
    out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" + py_strip(m[i].content)
           + "<|eot_id|>";
  }
  if (gen || generation_prompt_always_)
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string chat_template::render_llama31(const std::vector<chat_message>& m, bool gen,
                                          const render_options& o) const {
  std::string date = fixed_date_;
  if (date_from_clock_) {
    // strftime_now("%d %b %Y") in transformers: the local date.
    const std::time_t t = std::chrono::system_clock::to_time_t(
      o.now.value_or(std::chrono::system_clock::now()));
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
    date = buf;
  }
  size_t first = 0;
  std::string system;
  if (m[0].role == "system") {
    system = py_strip(m[0].content);
    first = 1;
  }
  std::string out = bos_;
  out += "<|start_header_id|>system<|end_header_id|>\n\n";
  out += "Cutting Knowledge Date: December 2023\n";
  out += "Today Date: " + date + "\n\n";
  out += system + "<|eot_id|>";
  for (size_t i = first; i < m.size(); ++i)
    out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" + py_strip(m[i].content)
           + "<|eot_id|>";
  if (gen)
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string chat_template::render_llama2(const std::vector<chat_message>& m) const {
  size_t first = 0;
  std::optional<std::string> system;
  if (m[0].role == "system") {
    system = m[0].content;
    first = 1;
  }
  std::string out;
  for (size_t i = first; i < m.size(); ++i) {
    const size_t k = i - first;
    const auto& msg = m[i];
    if ((msg.role == "user") != (k % 2 == 0))
      throw std::invalid_argument(
        "Conversation roles must alternate user/assistant/user/assistant/...");
    std::string content = msg.content;
    if (k == 0 && system)
      content = "<<SYS>>\n" + *system + "\n<</SYS>>\n\n" + msg.content;
    if (msg.role == "user")
      out += bos_ + "[INST] " + py_strip(content) + " [/INST]";
    else if (msg.role == "system" && llama2_system_branch_)
      out += "<<SYS>>\n" + py_strip(content) + "\n<</SYS>>\n\n";
    else if (msg.role == "assistant")
      out += " " + py_strip(content) + " " + eos_;
  }
  return out;
}

std::string chat_template::render_mistral(const std::vector<chat_message>& m) const {
  size_t first = 0;
  std::optional<std::string> system;
  if (m[0].role == "system") {
    system = m[0].content;
    first = 1;
  }
  std::string out = bos_;
  for (size_t i = first; i < m.size(); ++i) {
    const size_t k = i - first;
    const auto& msg = m[i];
    if ((msg.role == "user") != (k % 2 == 0))
      throw std::invalid_argument("After the optional system message, conversation roles must "
                                  "alternate user/assistant/user/assistant/...");
    if (msg.role == "user") {
      if (k == 0 && system)
        out += " [INST] " + *system + "\n\n" + msg.content + " [/INST]";
      else
        out += " [INST] " + msg.content + " [/INST]";
    } else if (msg.role == "assistant") {
      out += " " + msg.content + eos_;
    } else {
      throw std::invalid_argument("Only user and assistant roles are supported, with the "
                                  "exception of an initial optional system message!");
    }
  }
  return out;
}

std::string chat_template::render_chatml(const std::vector<chat_message>& m, bool gen) const {
  std::string out;
  if (!default_system_.empty() && m[0].role != "system")
    out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
  for (const auto& msg : m)
    out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
  if (gen)
    out += "<|im_start|>assistant\n";
  return out;
}

std::string chat_template::render_qwen3(const std::vector<chat_message>& m, bool gen,
                                        const render_options& o) const {
  std::string out;
  if (m[0].role == "system")
    out += "<|im_start|>system\n" + m[0].content + "<|im_end|>\n";
  // The last user turn that is not a tool response.
  size_t last_query = m.size() - 1;
  for (size_t k = m.size(); k-- > 0;) {
    const auto& c = m[k].content;
    const bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (m[k].role == "user" && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const auto& msg = m[i];
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
    } else if (msg.role == "assistant") {
      std::string content = msg.content;
      std::string reasoning;
      if (msg.content.find("</think>") != std::string::npos) {
        content = py_strip_char(after_last(msg.content, "</think>"), '\n', true, false);
        reasoning = py_strip_char(
          after_last(py_strip_char(before_first(msg.content, "</think>"), '\n', false, true),
                     "<think>"),
          '\n', true, false);
      }
      const bool last = i + 1 == m.size();
      if (i > last_query && (last || !reasoning.empty()))
        out += "<|im_start|>" + msg.role + "\n<think>\n" + py_strip_char(reasoning, '\n')
               + "\n</think>\n\n" + py_strip_char(content, '\n', true, false);
      else
        out += "<|im_start|>" + msg.role + "\n" + content;
      out += "<|im_end|>\n";
    }
  }
  if (gen) {
    out += "<|im_start|>assistant\n";
    if (o.enable_thinking && !*o.enable_thinking)
      out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// -- plain text ----------------------------------------------------------------------------

// {{ bos_token }}{% for message in messages %}{{ message['content'] + eos_token }}{% endfor %}
// The generation prompt adds nothing: after an EOS the model starts a new
// paragraph.
std::string chat_template::render_plain(const std::vector<chat_message>& m) const {
  std::string out = bos_;
  for (const auto& msg : m)
    out += msg.content + eos_;
  return out;
}

} // namespace metronome
