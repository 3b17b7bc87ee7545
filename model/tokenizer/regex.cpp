// PCRE2 wrapper.
//
// Design note: tokenizer.json patterns are written for Oniguruma (the regex
// engine of the Hugging Face tokenizers library). PCRE2 in UTF + UCP mode
// reads them the same way except for `\s`/`\S`, which PCRE2 widens with
// U+180E; the pattern is therefore rewritten to spell out White_Space.
// Matching uses the JIT with a per-thread match block and JIT stack, so the
// compiled pattern is shared by all threads without locks; when the JIT stack
// runs out the interpreter takes over for that match.

#include "model/tokenizer/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

namespace metronome {

namespace {

constexpr const char* white_space_items =
  "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
  "\\x{202F}\\x{205F}\\x{3000}";

std::string translate(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        out += in_class ? std::string(white_space_items)
                        : std::string("[") + white_space_items + "]";
      } else if (e == 'S' && !in_class) {
        out += std::string("[^") + white_space_items + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < p.size() && p[i + 1] == ']') {
        out += ']';
        ++i;
      }
      continue;
    }
    if (in_class && c == ']')
      in_class = false;
    out += c;
  }
  return out;
}

struct thread_state {
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;

  thread_state() {
    match = pcre2_match_data_create(4, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && stack)
      pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~thread_state() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match);
  }
};

thread_state& state() {
  thread_local thread_state s;
  return s;
}

} // namespace

regex::regex(const std::string& pattern) : pattern_(pattern) {
  const std::string p = translate(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset,
                             nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof msg);
    throw std::invalid_argument("regex '" + pattern + "' does not compile at offset "
                                + std::to_string(offset) + ": "
                                + reinterpret_cast<const char*>(msg));
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

regex::~regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto& st = state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE pos = 0;
  while (pos <= text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, st.match, st.context)
                  : PCRE2_ERROR_JIT_BADOPTION;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION)
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       st.match, st.context);
    if (rc == PCRE2_ERROR_NOMATCH)
      return;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw std::runtime_error("regex '" + pattern_ + "': " + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.match);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      pos = end;
    } else {
      // Empty match: step over one character.
      if (begin >= text.size())
        return;
      size_t next = begin + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80)
        ++next;
      pos = next;
    }
  }
}

std::string regex::escape(std::string_view literal) {
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos)
      out += '\\';
    out += c;
  }
  return out;
}

} // namespace metronome
