// Chat templates: output equal to what the Jinja templates of the model
// folders render (expected strings worked out from the template text, and
// the Llama 2 example of the transformers chat-template documentation).

#include <fstream>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "tests/test_env.hpp"
#include "tests/tokenizer/tokenizer_test_util.hpp"

namespace metronome::test {
namespace {

using msgs = std::vector<chat_message>;

std::filesystem::path scratch(const std::string& name) {
  auto dir = work_dir() / "chat_template_test" / name;
  std::filesystem::create_directories(dir);
  return dir;
}

std::filesystem::path folder_with_template(const std::string& name, const std::string& tmpl) {
  auto dir = scratch(name);
  nlohmann::json cfg = {{"chat_template", tmpl}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  return dir;
}

TEST(chat_template, llama3_folder) {
  auto t = chat_template::from_folder(tokenizer_dir("llama3"));
  EXPECT_EQ(t.name(), "llama3");
  const msgs m = {{"system", "You are a bot."},
                  {"user", " Hi there \n"},
                  {"assistant", "Hello!"},
                  {"user", "Bye"}};
  const std::string expected =
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a bot.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(t.apply(m, true), expected);
  // This release of the template prints the assistant header unconditionally.
  EXPECT_EQ(t.apply(m, false), expected);

  // Encoding the prompt: BOS comes from the text, exactly once.
  auto tok = load_tokenizer("llama3");
  const auto ids = tok->encode(expected, {.add_special_tokens = false, .parse_special = true});
  EXPECT_EQ(ids.front(), 128000);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 128000), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 128009), 4);
  EXPECT_EQ(tok->decode(ids, false), expected);
}

TEST(chat_template, qwen3_folder) {
  auto t = chat_template::from_folder(tokenizer_dir("qwen3"));
  EXPECT_EQ(t.name(), "qwen3");
  const msgs m = {{"system", "S"},
                  {"user", "Q1"},
                  {"assistant", "<think>\nr1\n</think>\n\nA1"},
                  {"user", "Q2"}};
  EXPECT_EQ(t.apply(m, true),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
            "<|im_start|>assistant\n");
  // A final assistant turn after the last question gets the think block.
  EXPECT_EQ(t.apply({{"user", "Q"}, {"assistant", "A"}}, false),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA"
            "<|im_end|>\n");
  chat_template::render_options no_think;
  no_think.enable_thinking = false;
  EXPECT_EQ(t.apply({{"user", "Q"}}, true, no_think),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(chat_template, llama2_documentation_example) {
  auto t = chat_template::from_folder(tokenizer_dir("llama2"), "llama2");
  EXPECT_EQ(t.name(), "llama2");
  const msgs m = {
    {"system", "You are a friendly chatbot who always responds in the style of a pirate"},
    {"user", "Hello, how are you?"},
    {"assistant", "I'm doing great. How can I help you today?"},
    {"user", "I'd like to show off how chat templating works!"}};
  EXPECT_EQ(t.apply(m, true),
            "<s>[INST] <<SYS>>\nYou are a friendly chatbot who always responds in the style of "
            "a pirate\n<</SYS>>\n\nHello, how are you? [/INST] I'm doing great. How can I help "
            "you today? </s><s>[INST] I'd like to show off how chat templating works! [/INST]");
  EXPECT_THROW(t.apply({{"assistant", "first"}}, true), std::invalid_argument);
  EXPECT_THROW(t.apply({{"user", "a"}, {"user", "b"}}, true), std::invalid_argument);
}

TEST(chat_template, mistral_forced) {
  // The Mistral folder ships no template: an error unless one is configured.
  try {
    chat_template::from_folder(tokenizer_dir("mistral"));
    FAIL() << "expected model_error";
  } catch (const model_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos);
  }
  auto t = chat_template::from_folder(tokenizer_dir("mistral"), "mistral");
  const msgs m = {{"user", "Hello, how are you?"},
                  {"assistant", "I'm doing great. How can I help you today?"},
                  {"user", "I'd like to show off how chat templating works!"}};
  EXPECT_EQ(t.apply(m, true),
            "<s> [INST] Hello, how are you? [/INST] I'm doing great. How can I help you "
            "today?</s> [INST] I'd like to show off how chat templating works! [/INST]");
  EXPECT_EQ(t.apply({{"system", "Be brief."}, {"user", "Hi"}}, true),
            "<s> [INST] Be brief.\n\nHi [/INST]");
  EXPECT_THROW(t.apply({{"system", "a"}, {"assistant", "b"}}, true), std::invalid_argument);
  // Encoding: BOS from the text, not added twice.
  auto tok = load_tokenizer("mistral");
  const auto ids = tok->encode(t.apply(m, true), {.add_special_tokens = false});
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1);
  EXPECT_EQ(ids.front(), 1);
}

TEST(chat_template, llama31_system_block) {
  chat_template t(chat_template::format::llama31, "<|begin_of_text|>", "<|eot_id|>");
  EXPECT_EQ(t.apply({{"system", " Sys \n"}, {"user", "Hi"}}, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "Sys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t.apply({{"user", "Hi"}}, false),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(chat_template, chatml_from_template_text) {
  auto dir = folder_with_template(
    "chatml",
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}");
  auto t = chat_template::from_folder(dir);
  EXPECT_EQ(t.name(), "chatml");
  EXPECT_EQ(t.apply({{"user", "Hi"}}, true),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.apply({{"user", "Hi"}}, false), "<|im_start|>user\nHi<|im_end|>\n");
}

// The default model's template (tools/train_default_model.py); what
// transformers renders from it is checked against the model's golden file in
// tests/model/default_model_test.cpp.
TEST(chat_template, plain_text_from_template_text) {
  auto dir = folder_with_template(
    "plain",
    "{{ bos_token }}{% for message in messages %}{{ message['content'] + eos_token }}"
    "{% endfor %}");
  auto t = chat_template::from_folder(dir);
  EXPECT_EQ(t.name(), "plain");
  EXPECT_EQ(t.kind(), chat_template::format::plain);
  const msgs conversation = {{"system", "Be brief. "}, {"user", " Hi\n"}, {"assistant", "Hello."},
                             {"user", "Bye"}};
  // Content as it is (no trimming), roles unmarked, nothing after the last EOS.
  EXPECT_EQ(t.apply(conversation, true), "<s>Be brief. </s> Hi\n</s>Hello.</s>Bye</s>");
  EXPECT_EQ(t.apply(conversation, false), t.apply(conversation, true));
  // Anything more (here a separator) is not the plain-text format.
  auto other = folder_with_template(
    "plain-with-separator",
    "{{ bos_token }}{% for message in messages %}{{ message['content'] + '\n\n' + eos_token }}"
    "{% endfor %}");
  EXPECT_THROW(chat_template::from_folder(other), model_error);
  auto forced = chat_template::from_folder(other, "plain");
  EXPECT_EQ(forced.apply({{"user", "Hi"}}, true), "<s>Hi</s>");
}

// -- templates from a file (--chat-template FILE) ------------------------------------------

/// The chat_template of `config` (a tokenizer_config.json) written alone to
/// `name`.jinja, as Hugging Face saves it in chat_template.jinja.
std::filesystem::path template_file(const std::string& name,
                                    const std::filesystem::path& config) {
  const auto cfg = nlohmann::json::parse(read_file(config));
  const auto file = scratch("files") / (name + ".jinja");
  std::ofstream(file, std::ios::binary) << cfg.at("chat_template").get<std::string>();
  return file;
}

/// The conversations the file and folder templates are compared on.
const std::vector<msgs>& conversations() {
  static const std::vector<msgs> all = {
    {{"user", "Hi"}},
    {{"system", " Be brief. \n"}, {"user", "Name three rivers."}},
    {{"system", "S"}, {"user", "Q1"}, {"assistant", "<think>\nr1\n</think>\n\nA1"}, {"user", "Q2"}},
    {{"user", " Hi there \n"}, {"assistant", "Hello!"}, {"user", "Bye"}, {"assistant", "Bye."}},
  };
  return all;
}

TEST(chat_template, a_template_file_renders_as_the_same_template_in_its_folder) {
  // The real templates of the test data and of the default model, each read
  // from a file of its own: the same format, the same prompts as the folder
  // (whose renders the tests above check against references).
  const std::vector<std::pair<std::string, std::filesystem::path>> folders = {
    {"llama3", tokenizer_dir("llama3")},
    {"qwen3", tokenizer_dir("qwen3")},
    {"metronome-tiny", std::filesystem::path(env("SOURCE_DIR")) / "models" / "metronome-tiny"},
  };
  for (const auto& [name, dir] : folders) {
    SCOPED_TRACE(name);
    const auto file = template_file(name, dir / "tokenizer_config.json");
    const auto from_file = chat_template::from_file(dir, file);
    const auto from_folder = chat_template::from_folder(dir);
    EXPECT_EQ(from_file.name(), from_folder.name());
    EXPECT_EQ(from_file.kind(), from_folder.kind());
    for (const auto& m : conversations())
      for (bool gen : {true, false})
        EXPECT_EQ(from_file.apply(m, gen), from_folder.apply(m, gen)) << m.size() << gen;
  }
}

TEST(chat_template, a_template_file_overrides_the_folders) {
  // Qwen3's template on the Llama 3 folder: Qwen3's prompts, whatever the
  // folder's own template says.
  const auto qwen3 = template_file("qwen3-on-llama3", tokenizer_dir("qwen3") / "tokenizer_config.json");
  const auto t = chat_template::from_file(tokenizer_dir("llama3"), qwen3);
  EXPECT_EQ(t.name(), "qwen3");
  const auto reference = chat_template::from_folder(tokenizer_dir("qwen3"));
  for (const auto& m : conversations())
    EXPECT_EQ(t.apply(m, true), reference.apply(m, true));
  // The Mistral folder has no template of its own; a file gives it one, with
  // the folder's BOS and EOS.
  const auto llama3 = template_file("llama3-on-mistral", tokenizer_dir("llama3") / "tokenizer_config.json");
  const auto m = chat_template::from_file(tokenizer_dir("mistral"), llama3);
  EXPECT_EQ(m.name(), "llama3");
  EXPECT_TRUE(m.apply({{"user", "Hi"}}, true).starts_with("<s><|start_header_id|>user"))
    << m.apply({{"user", "Hi"}}, true);
}

/// The message of the model_error from_file throws for `file`.
std::string refusal(const std::filesystem::path& file) {
  try {
    chat_template::from_file(tokenizer_dir("llama3"), file);
  } catch (const model_error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(chat_template, a_template_file_of_an_unknown_format_is_refused_naming_it) {
  auto write = [](const std::string& name, const std::string& text) {
    const auto file = scratch("files") / name;
    std::ofstream(file, std::ios::binary) << text;
    return file;
  };
  const auto formats = "the formats understood are Llama 3, Llama 3.1+, Llama 2, Mistral, "
                       "ChatML/Qwen, Qwen3, plain text";
  // No known family at all.
  const auto unknown = write("unknown.jinja", "{{ messages[0]['content'] }}");
  auto what = refusal(unknown);
  EXPECT_TRUE(what.starts_with(unknown.string() + ": not a chat template of a recognised format"))
    << what;
  EXPECT_NE(what.find(formats), std::string::npos) << what;
  EXPECT_NE(what.find("--chat-template llama3, llama2, mistral or chatml"), std::string::npos)
    << what;
  // Llama 3's template without the trimming of message content: another
  // prompt, so not taken for Llama 3.
  auto text = nlohmann::json::parse(read_file(tokenizer_dir("llama3") / "tokenizer_config.json"))
                .at("chat_template")
                .get<std::string>();
  const auto trim = text.find(" | trim");
  ASSERT_NE(trim, std::string::npos);
  const auto changed = write("llama3-untrimmed.jinja", text.erase(trim, 7));
  what = refusal(changed);
  EXPECT_TRUE(what.starts_with(changed.string() + ": not a recognised Llama 3 template")) << what;
  EXPECT_NE(what.find(formats), std::string::npos) << what;
  // Nothing to read.
  const auto missing = scratch("files") / "no-such-template.jinja";
  what = refusal(missing);
  EXPECT_TRUE(what.starts_with(missing.string() + ": cannot read the chat template: No such file"))
    << what;
  what = refusal(write("empty.jinja", " \n"));
  EXPECT_NE(what.find("the chat template is empty; " + std::string(formats)), std::string::npos)
    << what;
  EXPECT_NE(refusal(scratch("files")).find("a folder, not a chat template file"), std::string::npos);
}

TEST(chat_template, invalid_conversations_and_templates) {
  auto t = chat_template::from_folder(tokenizer_dir("llama3"));
  EXPECT_THROW(t.apply({}, true), std::invalid_argument);
  EXPECT_THROW(t.apply({{"tool", "x"}}, true), std::invalid_argument);
  auto dir = folder_with_template("unknown", "{{ messages[0]['content'] }}");
  EXPECT_THROW(chat_template::from_folder(dir), model_error);
  EXPECT_NO_THROW(chat_template::from_folder(dir, "chatml"));
  EXPECT_THROW(chat_template::from_folder(dir, "vicuna"), model_error);
}

} // namespace
} // namespace metronome::test
