// metronome tokenize: encode text (or decode ids) with a model folder's
// tokenizer, to check what the model will see.

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.hpp"
#include "tools/metronome/command.hpp"

namespace metronome::cli {

namespace {

struct tokenize_args {
  std::string tokenizer;
  std::optional<std::string> text;
  std::optional<std::string> file;
  std::optional<std::string> decode;
  bool no_special = false;
  bool plain_special = false;
  bool json = false;
};

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used])))
      ++used;
    if (item.empty() || used != item.size() || value < INT32_MIN || value > INT32_MAX)
      throw command_error("--decode: '" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

void run(const tokenize_args& a) {
  const int inputs = int(a.text.has_value()) + int(a.file.has_value()) + int(a.decode.has_value());
  if (inputs != 1)
    throw command_error("give exactly one of --text, --file and --decode");
  auto tok = tokenizer::load(a.tokenizer);
  if (a.decode) {
    const auto ids = parse_id_list(*a.decode);
    for (auto id : ids)
      if (id < 0 || id >= tok->vocab_size())
        throw command_error("--decode: id " + std::to_string(id) + " outside the vocabulary (0.."
                            + std::to_string(tok->vocab_size() - 1) + ")");
    const auto text = tok->decode(ids, a.no_special);
    if (a.json) {
      nlohmann::json j = {{"ids", ids}, {"text", text}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("%s\n", text.c_str());
    }
    return;
  }
  std::string text;
  if (a.text) {
    text = *a.text;
  } else {
    std::ifstream in(*a.file, std::ios::binary);
    if (!in)
      throw command_error("--file: cannot read '" + *a.file + "'");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const auto ids = tok->encode(text, {.add_special_tokens = !a.no_special,
                                      .parse_special = !a.plain_special});
  if (a.json) {
    nlohmann::json tokens = nlohmann::json::array();
    for (auto id : ids)
      tokens.push_back(tok->id_to_token(id).value_or(""));
    nlohmann::json j = {{"ids", ids}, {"tokens", tokens}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::string line;
    for (auto id : ids) {
      if (!line.empty())
        line += ',';
      line += std::to_string(id);
    }
    std::printf("%s\n", line.c_str());
    std::fprintf(stderr, "[%zu tokens]\n", ids.size());
  }
}

void setup(CLI::App& app) {
  auto a = std::make_shared<tokenize_args>();
  auto* cmd = app.add_subcommand("tokenize", "Encode text or decode ids with a tokenizer");
  cmd->add_option("--tokenizer", a->tokenizer,
                  "Folder with tokenizer.json (a model folder or a tokenizer folder)")
    ->type_name("PATH")
    ->required();
  cmd->add_option("--text", a->text, "Text to encode");
  cmd->add_option("--file", a->file, "File whose contents to encode")->type_name("PATH");
  cmd->add_option("--decode", a->decode, "Comma-separated ids to decode")->type_name("ID,...");
  cmd->add_flag("--no-special", a->no_special,
                "Encode without BOS/EOS; decode without special tokens");
  cmd->add_flag("--plain-special", a->plain_special,
                "Treat special-token text in the input as plain text");
  cmd->add_flag("--json", a->json, "Print {\"ids\": [...]} (and \"text\" when decoding)");
  cmd->callback([a] { run(*a); });
}

const int registered = register_command(30, &setup);

} // namespace

} // namespace metronome::cli
