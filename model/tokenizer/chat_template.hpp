#pragma once
// Chat templates for /v1/chat/completions: turns a conversation into the
// prompt text a model was trained on, byte for byte what Hugging Face's
// apply_chat_template renders from the Jinja template in
// tokenizer_config.json for system/user/assistant conversations.
//
// The formats are rendered natively (no Jinja engine). from_folder()
// recognises the template text by the fragments that decide its output and
// refuses one it does not recognise, so a model never silently gets a prompt
// in the wrong format.
//
// Encoding the result: the rendered text starts with the BOS text where the
// template emits it (Llama 2/3, Mistral), so encode it with
// tokenizer::encode_options{.add_special_tokens = false, .parse_special = true};
// adding special tokens too would give a second BOS.

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace metronome {

struct chat_message {
  std::string role; ///< "system", "user" or "assistant"
  std::string content;
};

class chat_template {
public:
  enum class format {
    llama3,   ///< Meta-Llama-3 Instruct: headers, trimmed content, <|eot_id|>
    llama31,  ///< Llama 3.1/3.2/3.3: also a system block with knowledge/today dates
    llama2,   ///< Llama-2 chat: [INST] with <<SYS>> folded into the first turn
    mistral,  ///< Mistral Instruct: <s> [INST] ... [/INST] answer</s>
    chatml,   ///< <|im_start|>role\n...<|im_end|>\n (Qwen 1.5/2, with optional default system)
    qwen3,    ///< ChatML plus Qwen3's <think> handling of assistant turns
    /// Plain text: BOS, then each message's content followed by EOS, roles
    /// unmarked; for a model trained on text whose paragraphs end in EOS (the
    /// default model, docs/default-model.md). A turn is one paragraph.
    plain,
  };

  /// Reads chat_template, bos_token and eos_token from dir/tokenizer_config.json.
  /// `forced` ("llama3", "llama3.1", "llama2", "mistral", "chatml", "qwen3", "plain")
  /// picks the format instead of the file's template. Throws model_error
  /// naming the file when there is no template or it is not recognised and
  /// nothing is forced. Called once at start-up.
  static chat_template from_folder(const std::filesystem::path& dir,
                                   std::optional<std::string> forced = {});

  /// Reads a Jinja chat template from `file` (the text of
  /// tokenizer_config.json's chat_template, as Hugging Face also saves it
  /// on its own in chat_template.jinja) and recognises its format as
  /// from_folder() does; bos_token and eos_token come from
  /// dir/tokenizer_config.json, the model's. Throws model_error naming
  /// `file` when it cannot be read, is empty or its format is not
  /// recognised (the message lists the formats that are). Called once at
  /// start-up.
  static chat_template from_file(const std::filesystem::path& dir,
                                 const std::filesystem::path& file);

  /// Builds a template of `f` directly.
  chat_template(format f, std::string bos_token, std::string eos_token);

  struct render_options {
    /// The date for Llama 3.1-style templates that print "Today Date"
    /// from strftime_now (e.g. Llama 3.2); defaults to the current date.
    std::optional<std::chrono::system_clock::time_point> now;
    /// Qwen3's enable_thinking; false adds an empty <think></think> block
    /// after the generation prompt, as the template does.
    std::optional<bool> enable_thinking;
  };

  /// The prompt text. Throws std::invalid_argument with a clear message for
  /// conversations the template rejects or that this server does not accept
  /// (empty, unknown role, roles not alternating where the format requires
  /// it); the server answers those with HTTP 400. Thread-safe.
  std::string apply(const std::vector<chat_message>& messages, bool add_generation_prompt,
                    const render_options& options) const;
  std::string apply(const std::vector<chat_message>& messages, bool add_generation_prompt) const {
    return apply(messages, add_generation_prompt, render_options{});
  }

  /// "llama3", "llama3.1", "llama2", "mistral", "chatml", "qwen3" or "plain".
  std::string name() const;

  format kind() const noexcept {
    return format_;
  }

private:
  /// The format of template text `source`, or model_error(where, field,
  /// problem + "; " + advice) when it is not one recognised.
  static chat_template recognise(const std::string& source, const std::string& bos,
                                 const std::string& eos, const std::string& where,
                                 const std::string& field, const std::string& advice);

  std::string render_llama3(const std::vector<chat_message>& m, bool gen) const;
  std::string render_llama31(const std::vector<chat_message>& m, bool gen,
                             const render_options& o) const;
  std::string render_llama2(const std::vector<chat_message>& m) const;
  std::string render_mistral(const std::vector<chat_message>& m) const;
  std::string render_chatml(const std::vector<chat_message>& m, bool gen) const;
  std::string render_qwen3(const std::vector<chat_message>& m, bool gen,
                           const render_options& o) const;
  std::string render_plain(const std::vector<chat_message>& m) const;

  format format_;
  std::string bos_;
  std::string eos_;
  // Details that vary between releases of one format:
  bool generation_prompt_always_ = false; ///< llama3: the template ignores add_generation_prompt
  std::string fixed_date_;                ///< llama3.1: "26 Jul 2024" unless strftime_now is used
  bool date_from_clock_ = false;          ///< llama3.1: strftime_now("%d %b %Y")
  std::string default_system_;            ///< chatml: system text used when none is given
  bool llama2_system_branch_ = false;     ///< llama2: later system turns print a <<SYS>> block
};

} // namespace metronome
