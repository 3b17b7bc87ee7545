// tokenizer_bench: single-core encode throughput (MB/s) of a tokenizer on the
// public-domain corpora, on pathological inputs (a 1 MB word without spaces,
// 100k repeated emoji, 1 MB of digits, 1 MB of spaces), and streaming decode.
//
//   build/tokenizer_bench [--tokenizer DIR] [--testdata DIR] [--repeat N]
//
// Each figure is the best of N runs (default 3) on one thread; the BPE word
// cache is warm after the first run, as it is in a long-running server.
// MB/s is computed from the thread's CPU time, so that a busy machine (other
// processes taking turns on the core) does not distort the per-core figure;
// wall time is printed next to it.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

struct timing {
  double wall = 1e300; ///< elapsed seconds
  double cpu = 1e300;  ///< seconds this thread ran on a core (what a shared machine hides)
};

timing best_seconds(int repeat, const std::function<void()>& fn) {
  timing best;
  for (int r = 0; r < repeat; ++r) {
    const auto start = clock_type::now();
    const double cpu_start = thread_cpu_seconds();
    fn();
    best.cpu = std::min(best.cpu, thread_cpu_seconds() - cpu_start);
    best.wall = std::min(best.wall,
                         std::chrono::duration<double>(clock_type::now() - start).count());
  }
  return best;
}

void report(const char* what, size_t bytes, size_t tokens, timing t) {
  std::printf("%-32s %7.2f MB %8zu tok %7.3f s wall %7.3f s cpu %7.1f MB/s %9.0f tok/s\n", what,
              double(bytes) / 1e6, tokens, t.wall, t.cpu, double(bytes) / 1e6 / t.cpu,
              double(tokens) / t.cpu);
}

} // namespace

int main(int argc, char** argv) {
  fs::path testdata = METRONOME_BENCH_TESTDATA;
  fs::path dir;
  int repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer"))
      dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--testdata"))
      testdata = argv[i + 1];
    else if (!std::strcmp(argv[i], "--repeat"))
      repeat = std::max(1, std::atoi(argv[i + 1]));
  }
  if (dir.empty())
    dir = testdata / "tokenizers" / "llama3";

  const auto load_start = clock_type::now();
  auto tok = metronome::tokenizer::load(dir);
  std::printf("tokenizer %s loaded in %.2f s (vocab %d)\n", dir.c_str(),
              std::chrono::duration<double>(clock_type::now() - load_start).count(),
              tok->vocab_size());

  const metronome::tokenizer::encode_options plain{.add_special_tokens = false,
                                                   .parse_special = false};
  for (const char* corpus : {"moby_dick.txt", "kjv_bible.txt", "tinyshakespeare.txt",
                             "sotu_all.txt"}) {
    const auto text = read_all(testdata / "corpora" / corpus);
    size_t tokens = 0;
    const timing s = best_seconds(repeat, [&] { tokens = tok->encode(text, plain).size(); });
    report(corpus, text.size(), tokens, s);
  }

  struct pathological {
    const char* name;
    std::string text;
  };
  std::vector<pathological> cases;
  {
    std::string word(1 << 20, 'a');
    for (size_t i = 0; i < word.size(); ++i)
      word[i] = "abcdefghijklmnopqrstuvwxyz"[(i * 7 + i / 13) % 26];
    cases.push_back({"1 MB word, no spaces", word});
    cases.push_back({"4 MB word, no spaces (scaling)", word + word + word + word});
    std::string emoji;
    for (int i = 0; i < 100000; ++i)
      emoji += "\U0001F600";
    cases.push_back({"100k repeated emoji (400 KB)", emoji});
    std::string digits(1 << 20, '0');
    for (size_t i = 0; i < digits.size(); ++i)
      digits[i] = char('0' + (i * 31 + i / 7) % 10);
    cases.push_back({"1 MB digits", digits});
    cases.push_back({"1 MB spaces", std::string(1 << 20, ' ')});
    cases.push_back({"1 MB one letter", std::string(1 << 20, 'x')});
  }
  for (const auto& c : cases) {
    size_t tokens = 0;
    const timing s = best_seconds(1, [&] { tokens = tok->encode(c.text, plain).size(); });
    report(c.name, c.text.size(), tokens, s);
  }

  // Streaming decode of the Moby Dick encoding, one id at a time.
  const auto text = read_all(testdata / "corpora" / "moby_dick.txt");
  const auto ids = tok->encode(text, plain);
  size_t out_bytes = 0;
  const timing s = best_seconds(repeat, [&] {
    metronome::incremental_decoder dec(tok);
    out_bytes = 0;
    for (int32_t id : ids)
      out_bytes += dec.push(id).size();
    out_bytes += dec.finish().size();
  });
  report("incremental decode (moby_dick)", out_bytes, ids.size(), s);
  return 0;
}
