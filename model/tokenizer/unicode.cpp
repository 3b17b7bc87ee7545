// UTF-8 helpers and the Unicode normalization forms.
//
// Design note: normalization follows UAX #15 directly. A quick check first
// scans for code points that may not stay unchanged in the target form (a
// table generated from Unicode data) and for out-of-order combining marks; on
// typical text (ASCII, CJK, composed Latin) it proves the input normalized and
// returns it as is. Otherwise the text is fully decomposed (precomputed full
// decompositions plus the Hangul algorithm), combining marks are put in
// canonical order (stable sort by combining class), and for NFC/NFKC composed
// again with the primary-composite table (which already leaves out the
// composition exclusions) and the Hangul algorithm.

#include "model/tokenizer/unicode.hpp"

#include <algorithm>
#include <vector>

#include "model/tokenizer/unicode_data.hpp"

namespace metronome::unicode {

namespace {

// -- Hangul syllables (Unicode 3.12) --------------------------------------------

constexpr char32_t s_base = 0xAC00, l_base = 0x1100, v_base = 0x1161, t_base = 0x11A7;
constexpr char32_t l_count = 19, v_count = 21, t_count = 28;
constexpr char32_t n_count = v_count * t_count, s_count = l_count * n_count;

template <class T>
const T* find_range(const T* table, size_t n, char32_t cp) noexcept {
  auto end = table + n;
  auto it = std::upper_bound(table, end, cp, [](char32_t c, const T& r) { return c < r.first; });
  if (it == table)
    return nullptr;
  --it;
  return cp <= it->last ? it : nullptr;
}

const data::decomposition* find_mapping(const data::decomposition* table, size_t n,
                                        char32_t cp) noexcept {
  auto end = table + n;
  auto it = std::lower_bound(table, end, cp,
                             [](const data::decomposition& d, char32_t c) { return d.cp < c; });
  return it != end && it->cp == cp ? it : nullptr;
}

uint8_t combining_class(char32_t cp) noexcept {
  if (cp < 0x300)
    return 0;
  auto r = find_range(data::ccc_ranges, data::ccc_range_count, cp);
  return r ? r->ccc : 0;
}

void decompose_into(char32_t cp, bool compat, std::vector<char32_t>& out) {
  if (cp >= s_base && cp < s_base + s_count) {
    const char32_t s = cp - s_base;
    out.push_back(l_base + s / n_count);
    out.push_back(v_base + (s % n_count) / t_count);
    if (s % t_count != 0)
      out.push_back(t_base + s % t_count);
    return;
  }
  if (cp >= 0xA0) {
    const data::decomposition* d = nullptr;
    if (compat)
      d = find_mapping(data::compatibility_decompositions,
                       data::compatibility_decomposition_count, cp);
    if (!d)
      d = find_mapping(data::canonical_decompositions, data::canonical_decomposition_count, cp);
    if (d) {
      // Compatibility entries are full NFKD results, which may contain Hangul
      // syllables' jamo already; canonical entries are full NFD results.
      out.insert(out.end(), data::decomposition_pool + d->offset,
                 data::decomposition_pool + d->offset + d->length);
      return;
    }
  }
  out.push_back(cp);
}

char32_t compose_pair(char32_t a, char32_t b) noexcept {
  // Hangul LV and LVT.
  if (a >= l_base && a < l_base + l_count && b >= v_base && b < v_base + v_count)
    return s_base + ((a - l_base) * v_count + (b - v_base)) * t_count;
  if (a >= s_base && a < s_base + s_count && (a - s_base) % t_count == 0 && b > t_base
      && b < t_base + t_count)
    return a + (b - t_base);
  auto end = data::compositions + data::composition_count;
  auto it = std::lower_bound(data::compositions, end, std::pair{a, b},
                             [](const data::composition& c, const std::pair<char32_t, char32_t>& k) {
                               return c.first < k.first
                                      || (c.first == k.first && c.second < k.second);
                             });
  if (it != end && it->first == a && it->second == b)
    return it->composite;
  return 0;
}

bool quick_check(std::string_view s, normal_form form) {
  const data::range* table = nullptr;
  size_t n = 0;
  switch (form) {
    case normal_form::nfc:
      table = data::nfc_quick_check_no, n = data::nfc_quick_check_no_count;
      break;
    case normal_form::nfd:
      table = data::nfd_quick_check_no, n = data::nfd_quick_check_no_count;
      break;
    case normal_form::nfkc:
      table = data::nfkc_quick_check_no, n = data::nfkc_quick_check_no_count;
      break;
    case normal_form::nfkd:
      table = data::nfkd_quick_check_no, n = data::nfkd_quick_check_no_count;
      break;
  }
  const char32_t first_no = n > 0 ? table[0].first : 0x110000;
  uint8_t last_ccc = 0;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      last_ccc = 0;
      continue;
    }
    const char32_t cp = next_code_point(s, i);
    if (cp < first_no && cp < 0x300) {
      last_ccc = 0;
      continue;
    }
    const uint8_t ccc = combining_class(cp);
    if (ccc != 0 && last_ccc > ccc)
      return false;
    if (find_range(table, n, cp))
      return false;
    last_ccc = ccc;
  }
  return true;
}

} // namespace

// -- UTF-8 ---------------------------------------------------------------------------

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

/// Length of the valid sequence at s[i], or 0 with `subpart` set to the
/// length of the maximal subpart of an ill-formed one (at least 1).
size_t check_sequence(std::string_view s, size_t i, size_t& subpart) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  subpart = 1;
  if (b0 < 0x80)
    return 1;
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0)
      lo = 0xA0;
    else if (b0 == 0xED)
      hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0)
      lo = 0x90;
    else if (b0 == 0xF4)
      hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      subpart = k;
      return 0;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      subpart = k;
      return 0;
    }
  }
  return need + 1;
}

} // namespace

size_t valid_utf8_prefix(std::string_view s) noexcept {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t subpart = 0;
    const size_t n = check_sequence(s, i, subpart);
    if (n == 0)
      return i;
    i += n;
  }
  return i;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    size_t subpart = 0;
    const size_t n = check_sequence(s, i, subpart);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      append_utf8(out, replacement_char);
      i += subpart;
    }
  }
  return out;
}

size_t incomplete_suffix(std::string_view s) noexcept {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t i = s.size() - back;
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80)
      return 0;
    if (b >= 0xC0) {
      size_t subpart = 0;
      if (check_sequence(s, i, subpart) == 0 && subpart == back && sequence_length(b) > back)
        return back;
      return 0;
    }
  }
  return 0;
}

// -- normalization -----------------------------------------------------------------

std::string normalize(std::string_view s, normal_form form) {
  if (quick_check(s, form))
    return std::string(s);
  const bool compat = form == normal_form::nfkc || form == normal_form::nfkd;
  const bool compose = form == normal_form::nfc || form == normal_form::nfkc;
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();)
    decompose_into(next_code_point(s, i), compat, cps);
  // Canonical ordering: stable-sort each run of non-starters by class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0)
      ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j, [](char32_t a, char32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
  if (compose && !cps.empty()) {
    // Canonical composition: each character may combine with the last
    // starter unless a character in between blocks it.
    size_t starter = SIZE_MAX;
    size_t out = 0;
    int last_ccc = -1;
    for (size_t i = 0; i < cps.size(); ++i) {
      const char32_t cp = cps[i];
      const int ccc = combining_class(cp);
      if (starter != SIZE_MAX && (last_ccc < ccc || (last_ccc == 0 && out == starter + 1))) {
        if (char32_t c = compose_pair(cps[starter], cp); c != 0) {
          cps[starter] = c;
          continue;
        }
      }
      if (ccc == 0) {
        starter = out;
        last_ccc = 0;
      } else {
        last_ccc = ccc;
      }
      cps[out++] = cp;
    }
    cps.resize(out);
  }
  std::string result;
  result.reserve(s.size() + 8);
  for (char32_t cp : cps)
    append_utf8(result, cp);
  return result;
}

const char* unicode_version() noexcept {
  return data::version;
}

// -- character classes ----------------------------------------------------------------

category general_category(char32_t cp) noexcept {
  auto r = find_range(data::category_ranges, data::category_range_count, cp);
  return r ? static_cast<category>(r->category) : category::other;
}

bool is_white_space(char32_t cp) noexcept {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680
         || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F
         || cp == 0x205F || cp == 0x3000;
}

bool is_python_space(char32_t cp) noexcept {
  return is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b + 32) : static_cast<char>(b));
      ++i;
      continue;
    }
    const char32_t cp = next_code_point(s, i);
    if (auto m = find_mapping(data::lowercase_mappings, data::lowercase_mapping_count, cp)) {
      for (uint32_t k = 0; k < m->length; ++k)
        append_utf8(out, data::lowercase_pool[m->offset + k]);
    } else {
      append_utf8(out, cp);
    }
  }
  return out;
}

} // namespace metronome::unicode
