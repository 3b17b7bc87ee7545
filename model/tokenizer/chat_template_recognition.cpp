// Recognising the chat template of a tokenizer_config.json.
//
// Design note: the template text is canonicalised (comments and white space
// outside string literals dropped, Jinja's '-' trim markers and quote styles
// unified, message.x and message['x'] spelled one way) and must then hold the
// fragments that decide the output of the renderer for its family (Llama 3,
// Llama 3.1+, Llama 2, Mistral, ChatML, Qwen3); the plain-text template must
// be all there is. A template of a known family that differs in such a
// fragment is refused, so a model never silently gets a prompt in a format it
// was not trained on; the operator can then name the format explicitly.

#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/tokenizer/chat_template.hpp"

namespace metronome {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// -- template recognition ------------------------------------------------------------

/// Canonical form of a Jinja template for fragment matching.
std::string canonical(std::string_view source) {
  // Comments first: they may hold apostrophes ("we're").
  std::string t;
  t.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source.compare(i, 2, "{#") == 0) {
      const size_t end = source.find("#}", i + 2);
      if (end == std::string_view::npos)
        break;
      i = end + 1;
      continue;
    }
    t += source[i];
  }
  std::string out;
  out.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '\'' || c == '"') {
      // A string literal: keep its text, write it with single quotes when
      // it holds none.
      size_t j = i + 1;
      std::string body;
      while (j < t.size() && t[j] != c) {
        if (t[j] == '\\' && j + 1 < t.size()) {
          body += t[j];
          body += t[j + 1];
          j += 2;
          continue;
        }
        // A raw line break in a literal is the same string as "\n".
        if (t[j] == '\n')
          body += "\\n";
        else if (t[j] == '\t')
          body += "\\t";
        else
          body += t[j];
        ++j;
      }
      const char q = body.find('\'') == std::string::npos ? '\'' : c;
      out += q;
      out += body;
      out += q;
      i = j;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c)))
      continue;
    out += c;
  }
  // Trim markers and attribute spellings.
  auto replace_all = [&](const std::string& from, const std::string& to) {
    for (size_t pos = out.find(from); pos != std::string::npos; pos = out.find(from, pos + to.size()))
      out.replace(pos, from.size(), to);
  };
  replace_all("{%-", "{%");
  replace_all("-%}", "%}");
  replace_all("{{-", "{{");
  replace_all("-}}", "}}");
  replace_all("{%+", "{%");
  replace_all("+%}", "%}");
  replace_all("message['role']", "message.role");
  replace_all("message['content']", "message.content");
  replace_all("messages[0]['role']", "messages[0].role");
  replace_all("messages[0]['content']", "messages[0].content");
  return out;
}

bool has(const std::string& canon, std::string_view fragment) {
  return canon.find(fragment) != std::string::npos;
}

std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char e = s[++i];
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end())
    return {};
  if (it->is_string())
    return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return {};
}

/// `file` (a tokenizer_config.json) as JSON; an empty object when there is
/// none.
json read_tokenizer_config(const fs::path& file) {
  if (!fs::exists(file))
    return json::object();
  std::ifstream in(file, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::exception& e) {
    throw model_error(file.string(), "", std::string("not valid JSON: ") + e.what());
  }
}

/// The families recognise() knows, as its errors list them.
constexpr const char* recognised_formats =
  "Llama 3, Llama 3.1+, Llama 2, Mistral, ChatML/Qwen, Qwen3, plain text";

std::optional<chat_template::format> parse_format(const std::string& name) {
  using f = chat_template::format;
  if (name == "llama3")
    return f::llama3;
  if (name == "llama3.1" || name == "llama31" || name == "llama3.2" || name == "llama3.3")
    return f::llama31;
  if (name == "llama2")
    return f::llama2;
  if (name == "mistral")
    return f::mistral;
  if (name == "chatml")
    return f::chatml;
  if (name == "qwen3")
    return f::qwen3;
  if (name == "plain")
    return f::plain;
  return std::nullopt;
}

} // namespace

chat_template chat_template::from_folder(const fs::path& dir, std::optional<std::string> forced) {
  const fs::path file = dir / "tokenizer_config.json";
  const json cfg = read_tokenizer_config(file);
  std::string bos = config_token(cfg, "bos_token"), eos = config_token(cfg, "eos_token");
  if (forced) {
    auto f = parse_format(*forced);
    if (!f)
      throw model_error(file.string(), "chat_template",
                        "unknown chat template format '" + *forced
                          + "' (known: llama3, llama3.1, llama2, mistral, chatml, qwen3, "
                            "plain)");
    // Folders without a tokenizer_config.json get the family's usual tokens.
    if (bos.empty() && (*f == format::llama2 || *f == format::mistral))
      bos = "<s>";
    if (eos.empty() && (*f == format::llama2 || *f == format::mistral))
      eos = "</s>";
    if (bos.empty() && (*f == format::llama3 || *f == format::llama31))
      bos = "<|begin_of_text|>";
    chat_template t(*f, bos, eos);
    if (*f == format::llama2)
      t.llama2_system_branch_ = false;
    return t;
  }

  std::string source;
  if (auto it = cfg.find("chat_template"); it != cfg.end()) {
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      for (const auto& named : *it)
        if (named.value("name", std::string()) == "default" && named.contains("template")
            && named["template"].is_string())
          source = named["template"].get<std::string>();
    }
  }
  if (source.empty())
    throw model_error(file.string(), "chat_template",
                      "no chat template; configure one explicitly (llama3, llama3.1, llama2, "
                      "mistral, chatml, qwen3)");
  return recognise(source, bos, eos, file.string(), "chat_template",
                   std::string("recognised: ") + recognised_formats
                     + "; configure the format explicitly");
}

chat_template chat_template::from_file(const fs::path& dir, const fs::path& file) {
  if (fs::is_directory(file))
    throw model_error(file.string(), "", "a folder, not a chat template file");
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw model_error(file.string(), "",
                      std::string("cannot read the chat template: ") + std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string source = buffer.str();
  const std::string advice = std::string("the formats understood are ") + recognised_formats
                             + " (or name one: --chat-template llama3, llama2, mistral or "
                               "chatml)";
  if (source.find_first_not_of(" \t\r\n") == std::string::npos)
    throw model_error(file.string(), "", "the chat template is empty; " + advice);
  // The template's tokens: those of the model it is used with.
  const json cfg = read_tokenizer_config(dir / "tokenizer_config.json");
  return recognise(source, config_token(cfg, "bos_token"), config_token(cfg, "eos_token"),
                   file.string(), "", advice);
}

chat_template chat_template::recognise(const std::string& source, const std::string& bos,
                                       const std::string& eos, const std::string& where,
                                       const std::string& field, const std::string& advice) {
  const std::string c = canonical(source);
  // Plain text: the whole template, nothing else (a template that adds role
  // markers or separators is another format).
  if (c == "{{bos_token}}{%formessageinmessages%}{{message.content+eos_token}}{%endfor%}") {
    if (bos.empty() || eos.empty())
      throw model_error(where, field,
                        "the plain-text template needs bos_token and eos_token (in the model's "
                        "tokenizer_config.json)");
    return chat_template(format::plain, bos, eos);
  }
  auto unknown = [&](const std::string& family) -> model_error {
    return model_error(where, field,
                       "not a recognised " + family
                         + " template (it differs in a part that changes the prompt); "
                         + advice);
  };

  if (has(c, "<|start_header_id|>")) {
    if (has(c, "CuttingKnowledgeDate:December2023") || has(c, "Cutting Knowledge Date")) {
      if (!has(c, "'Cutting Knowledge Date: December 2023\\n'")
          || !has(c, "'Today Date: '+date_string+'\\n\\n'")
          || !has(c, "messages[0].content|trim") || !has(c, "{{system_message}}{{'<|eot_id|>'}}")
          || !has(c, "'<|start_header_id|>'+message.role+'<|end_header_id|>\\n\\n'+message.content|trim+'<|eot_id|>'")
          || !has(c, "{%ifadd_generation_prompt%}{{'<|start_header_id|>assistant<|end_header_id|>\\n\\n'}}")
          || c.rfind("{{bos_token}}", 0) != 0)
        throw unknown("Llama 3.1");
      chat_template t(format::llama31, bos, eos);
      t.date_from_clock_ = has(c, "strftime_now(");
      static const std::regex date_re(R"(setdate_string='([^']*)')");
      std::smatch m;
      if (std::regex_search(c, m, date_re))
        t.fixed_date_ = m[1].str();
      return t;
    }
    if (!has(c, "'<|start_header_id|>'+message.role+'<|end_header_id|>\\n\\n'+message.content|trim+'<|eot_id|>'")
        || !has(c, "{%ifloop.index0==0%}{%setcontent=bos_token+content%}{%endif%}{{content}}")
        || !has(c, "{{'<|start_header_id|>assistant<|end_header_id|>\\n\\n'}}"))
      throw unknown("Llama 3");
    chat_template t(format::llama3, bos, eos);
    t.generation_prompt_always_ = !has(c, "add_generation_prompt");
    return t;
  }
  if (has(c, "<|im_start|>")) {
    if (has(c, "</think>") || has(c, "reasoning_content")) {
      if (!has(c, "{{'<|im_start|>system\\n'+messages[0].content+'<|im_end|>\\n'}}")
          || !has(c, "{{'<|im_start|>'+message.role+'\\n'+message.content+'<|im_end|>'+'\\n'}}")
          || !has(c, "'<|im_start|>'+message.role+'\\n<think>\\n'+reasoning_content.strip('\\n')+'\\n</think>\\n\\n'+content.lstrip('\\n')")
          || !has(c, "{%ifadd_generation_prompt%}{{'<|im_start|>assistant\\n'}}"))
        throw unknown("Qwen3");
      return chat_template(format::qwen3, bos, eos);
    }
    const bool per_message =
      has(c, "{{'<|im_start|>'+message.role+'\\n'+message.content+'<|im_end|>'+'\\n'}}")
      || has(c, "{{'<|im_start|>'+message.role+'\\n'+message.content+'<|im_end|>\\n'}}");
    if (!per_message || !has(c, "{%ifadd_generation_prompt%}{{'<|im_start|>assistant\\n'}}"))
      throw unknown("ChatML");
    chat_template t(format::chatml, bos, eos);
    static const std::regex default_re(R"('<\|im_start\|>system\\n([^']*)<\|im_end\|>\\n')");
    std::smatch m;
    if (std::regex_search(c, m, default_re)) {
      // The default system turn of Qwen 2/2.5 (printed when the first message
      // is not a system message): needs to come with that condition.
      if (!has(c, "messages[0].role!='system'") && !has(c, "{%ifmessages[0].role=='system'%}"))
        throw unknown("ChatML");
      t.default_system_ = unescape(m[1].str());
    }
    return t;
  }
  if (has(c, "[INST]")) {
    if (has(c, "<<SYS>>")) {
      if (!has(c, "{{bos_token+'[INST] '+content.strip()+' [/INST]'}}")
          || !has(c, "{{' '+content.strip()+' '+eos_token}}")
          || !has(c, "{%setcontent='<<SYS>>\\n'+system_message+'\\n<</SYS>>\\n\\n'+message.content%}")
          || has(c, "loop_messages|length==0"))
        throw unknown("Llama 2");
      chat_template t(format::llama2, bos, eos);
      t.llama2_system_branch_ = has(c, "{%elifmessage.role=='system'%}");
      return t;
    }
    if (!has(c, "{{' [INST] '+system_message+'\\n\\n'+message.content+' [/INST]'}}")
        || !has(c, "{{' [INST] '+message.content+' [/INST]'}}")
        || !has(c, "{{' '+message.content+eos_token}}") || c.find("{{bos_token}}") == std::string::npos)
      throw unknown("Mistral");
    return chat_template(format::mistral, bos, eos);
  }
  throw model_error(where, field, "not a chat template of a recognised format; " + advice);
}

} // namespace metronome
