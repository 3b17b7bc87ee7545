#include "bench/serve/prompt_builder.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "model/tokenizer/tokenizer.hpp"

namespace metronome::bench {

std::filesystem::path default_corpus_path() {
  if (const char* v = std::getenv("METRONOME_TESTDATA"); v && *v)
    return std::filesystem::path(v) / "corpora" / "moby_dick.txt";
  return std::filesystem::path(METRONOME_BENCH_TESTDATA) / "corpora" / "moby_dick.txt";
}

prompt_builder::prompt_builder(std::shared_ptr<const tokenizer> tok, const std::string& corpus,
                               bool with_special_tokens)
  : tok_(std::move(tok)), with_special_(with_special_tokens) {
  stream_ = tok_->encode(corpus, {.add_special_tokens = false, .parse_special = false});
  if (stream_.size() < 2)
    throw std::invalid_argument("the corpus has fewer than 2 tokens");
  specials_ = count("");
}

prompt_builder prompt_builder::from_file(std::shared_ptr<const tokenizer> tok,
                                         const std::filesystem::path& file,
                                         bool with_special_tokens, size_t max_bytes) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw std::runtime_error(file.string() + ": cannot read the corpus");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (max_bytes > 0 && text.size() > max_bytes) {
    const auto nl = text.rfind('\n', max_bytes);
    text.resize(nl == std::string::npos ? max_bytes : nl + 1);
  }
  try {
    return prompt_builder(std::move(tok), text, with_special_tokens);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(file.string() + ": " + e.what());
  }
}

int32_t prompt_builder::count(const std::string& text) const {
  return int32_t(
    tok_->encode(text, {.add_special_tokens = with_special_, .parse_special = false}).size());
}

prompt_builder::prompt prompt_builder::make(int32_t tokens, int64_t offset) const {
  const int32_t target = std::max(tokens, min_tokens());
  const int64_t n = corpus_tokens();
  auto window = [&](int64_t start, int64_t k) {
    std::vector<int32_t> ids;
    ids.reserve(size_t(k));
    for (int64_t i = 0; i < k; ++i)
      ids.push_back(stream_[size_t((start + i) % n)]);
    return tok_->decode(ids, true);
  };
  int64_t start = ((offset % n) + n) % n;
  for (int shift = 0; shift < 16; ++shift, start = (start + 1) % n) {
    int64_t k = target - specials_;
    std::set<int64_t> tried;
    for (int step = 0; step < 24 && k >= 1 && tried.insert(k).second; ++step) {
      auto text = window(start, k);
      const int32_t got = count(text);
      if (got == target)
        return {std::move(text), got};
      k += target - got;
    }
  }
  throw std::runtime_error(
    fmt::format("cannot cut a prompt of exactly {} tokens from the corpus near token {}", target,
                offset));
}

} // namespace metronome::bench
