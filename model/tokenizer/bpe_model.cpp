// Byte-pair encoding of one word.
//
// Design note: a word starts as one symbol per character (or per byte with
// byte_fallback, or an unknown token). Symbols form a doubly linked list; a
// min-heap holds the candidate merges ordered by (rank, position), so the
// lowest-ranked pair is merged first and ties go to the leftmost pair, as in
// the Hugging Face implementation. Stale heap entries (a side already merged
// away) are skipped when popped. This is O(n log n) in the word length, so a
// megabyte-long word costs seconds at worst, never minutes. Results for words
// shorter than cache_max_word bytes are cached in sharded maps (one mutex per
// shard) because natural text repeats the same words over and over.
//
// SentencePiece-style tokenizers (Llama 2, Mistral) have no pre-tokenizer:
// the whole text is one "word" of a million symbols. When no token of the
// vocabulary contains U+2581 after another character, no merge can join
// across the point before a U+2581 that follows another character, so the
// word is cut there and the parts (cached like words) give the same result
// as the whole.

#include "model/tokenizer/bpe_model.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/tokenizer/unicode.hpp"

namespace metronome {

namespace {

using nlohmann::json;

struct symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len; ///< bytes; 0 once merged into its left neighbour
};

struct candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  bool operator>(const candidate& o) const noexcept {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

uint64_t pair_key(int32_t a, int32_t b) noexcept {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

} // namespace

std::unique_ptr<bpe_model> bpe_model::make(const json& j, const json_origin& at) {
  if (!j.is_object())
    at.fail("expected an object");
  const auto type = j.value("type", std::string("BPE"));
  if (type != "BPE")
    at.at("type").fail("unsupported model '" + type
                       + "' (this runtime implements BPE, the model of Llama, Mistral and Qwen)");
  auto m = std::unique_ptr<bpe_model>(new bpe_model());
  auto vocab = j.find("vocab");
  if (vocab == j.end() || !vocab->is_object())
    at.at("vocab").fail("missing or not an object");
  int32_t max_id = -1;
  m->vocab_.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0
        || it.value().get<int64_t>() > INT32_MAX)
      at.at("vocab").at(it.key()).fail("expected a non-negative id");
    const auto id = it.value().get<int32_t>();
    m->vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  m->tokens_.resize(size_t(max_id + 1));
  m->has_token_.assign(size_t(max_id + 1), false);
  for (const auto& [token, id] : m->vocab_) {
    m->tokens_[size_t(id)] = token;
    m->has_token_[size_t(id)] = true;
  }

  auto opt_string = [&](const char* key) -> std::string {
    auto it = j.find(key);
    if (it == j.end() || it->is_null())
      return {};
    if (!it->is_string())
      at.at(key).fail("expected a string or null");
    return it->get<std::string>();
  };
  m->prefix_ = opt_string("continuing_subword_prefix");
  m->suffix_ = opt_string("end_of_word_suffix");
  if (auto unk = opt_string("unk_token"); !unk.empty()) {
    auto id = m->token_to_id(unk);
    if (!id)
      at.at("unk_token").fail("'" + unk + "' is not in the vocabulary");
    m->unk_id_ = id;
  }
  m->fuse_unk_ = j.value("fuse_unk", false);
  m->byte_fallback_ = j.value("byte_fallback", false);
  m->ignore_merges_ = j.value("ignore_merges", false);

  auto merges = j.find("merges");
  if (merges == j.end() || !merges->is_array())
    at.at("merges").fail("missing or not an array");
  m->merges_.reserve(merges->size());
  std::string joined;
  for (size_t i = 0; i < merges->size(); ++i) {
    const auto& item = (*merges)[i];
    std::string_view a, b;
    if (item.is_string()) {
      const std::string_view s = item.get_ref<const std::string&>();
      const auto space = s.find(' ');
      if (space == std::string_view::npos || s.find(' ', space + 1) != std::string_view::npos)
        at.at("merges").at(i).fail("expected \"a b\" with exactly one space");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (item.is_array() && item.size() == 2 && item[0].is_string() && item[1].is_string()) {
      a = item[0].get_ref<const std::string&>();
      b = item[1].get_ref<const std::string&>();
    } else {
      at.at("merges").at(i).fail("expected \"a b\" or [\"a\", \"b\"]");
    }
    joined.assign(a);
    joined.append(b);
    auto ia = m->token_to_id(a), ib = m->token_to_id(b), ic = m->token_to_id(joined);
    if (!ia || !ib || !ic)
      at.at("merges").at(i).fail("'" + std::string(a) + "' + '" + std::string(b)
                                 + "' uses a token not in the vocabulary");
    // The first occurrence of a pair wins, as in the reference.
    m->merges_.emplace(pair_key(*ia, *ib), merge{int32_t(i), *ic});
  }

  // Cutting before "▁" is exact when no token has "▁" after another
  // character (see the design note) and words have no prefix/suffix.
  const std::string meta = "\u2581";
  bool meta_inside = false;
  for (const auto& [token, id] : m->vocab_) {
    for (size_t pos = token.find(meta, 1); pos != std::string::npos; pos = token.find(meta, pos + 1))
      if (pos < meta.size() || token.compare(pos - meta.size(), meta.size(), meta) != 0) {
        meta_inside = true;
        break;
      }
    if (meta_inside)
      break;
  }
  m->split_at_metaspace_ = !meta_inside && m->vocab_.count(meta) && m->prefix_.empty()
                           && m->suffix_.empty() && !m->ignore_merges_;

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    m->byte_ids_[size_t(b)] = m->token_to_id(name).value_or(-1);
  }
  m->char_ids_.fill(-1);
  for (char32_t cp = 0; cp < m->char_ids_.size(); ++cp) {
    std::string s;
    unicode::append_utf8(s, cp);
    m->char_ids_[cp] = m->token_to_id(s).value_or(-1);
  }
  return m;
}

std::optional<int32_t> bpe_model::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end())
    return std::nullopt;
  return it->second;
}

const std::string* bpe_model::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= tokens_.size() || !has_token_[size_t(id)])
    return nullptr;
  return &tokens_[size_t(id)];
}

const bpe_model::merge* bpe_model::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void bpe_model::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty())
    return;
  if (ignore_merges_)
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  if (split_at_metaspace_) {
    // Cut before each U+2581 (E2 96 81) that follows another character.
    constexpr std::string_view meta = "\xE2\x96\x81";
    size_t begin = 0;
    for (size_t pos = word.find(meta, 1); pos != std::string_view::npos;
         pos = word.find(meta, pos + 1)) {
      if (pos >= 3 && word.compare(pos - 3, 3, meta) == 0)
        continue;
      tokenize_cached(word.substr(begin, pos - begin), out);
      begin = pos;
    }
    tokenize_cached(word.substr(begin), out);
    return;
  }
  tokenize_cached(word, out);
}

void bpe_model::tokenize_cached(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty())
    return;
  if (word.size() >= cache_max_word) {
    merge_word(word, out);
    return;
  }
  auto& shard = cache_[string_hash{}(word) % cache_shards];
  {
    std::lock_guard<std::mutex> guard(shard.mutex);
    if (auto it = shard.words.find(word); it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t mark = out.size();
  merge_word(word, out);
  std::vector<int32_t> ids(out.begin() + std::ptrdiff_t(mark), out.end());
  std::lock_guard<std::mutex> guard(shard.mutex);
  if (shard.words.size() >= cache_shard_capacity)
    shard.words.clear();
  shard.words.emplace(std::string(word), std::move(ids));
}

void bpe_model::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<symbol> symbols;
  thread_local std::vector<candidate> heap_storage;
  symbols.clear();
  auto add = [&](int32_t id, uint32_t len) {
    const auto n = int32_t(symbols.size());
    symbols.push_back({id, n - 1, -1, len});
    if (n > 0)
      symbols[size_t(n - 1)].next = n;
  };

  // -- initial symbols ---------------------------------------------------------
  int32_t unk_id = -1; // a pending unknown token
  uint32_t unk_len = 0;
  std::string piece;
  const bool plain = prefix_.empty() && suffix_.empty();
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    const char32_t cp = unicode::next_code_point(word, i);
    const auto byte_len = uint32_t(i - start);
    int32_t id = -1;
    std::string_view s = word.substr(start, byte_len);
    if (plain && cp < char_ids_.size()) {
      id = char_ids_[cp];
    } else {
      piece.clear();
      if (start > 0)
        piece += prefix_;
      piece += s;
      if (i == word.size())
        piece += suffix_;
      s = piece;
      if (auto it = vocab_.find(s); it != vocab_.end())
        id = it->second;
    }
    if (id >= 0) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(id, byte_len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s)
        all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : s)
          add(byte_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_id >= 0 && fuse_unk_) {
        unk_len += byte_len;
      } else {
        if (unk_id >= 0)
          add(unk_id, unk_len);
        unk_id = *unk_id_;
        unk_len = byte_len;
      }
    }
  }
  if (unk_id >= 0)
    add(unk_id, unk_len);

  // -- merges ----------------------------------------------------------------------
  auto& heap = heap_storage;
  heap.clear();
  const auto push = [&](candidate c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k)
    if (const merge* m = find_merge(symbols[k].id, symbols[k + 1].id))
      heap.push_back({m->rank, int32_t(k), m->new_id});
  std::make_heap(heap.begin(), heap.end(), std::greater<>{});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const candidate top = heap.back();
    heap.pop_back();
    symbol& left = symbols[size_t(top.pos)];
    if (left.len == 0 || left.next < 0)
      continue;
    symbol& right = symbols[size_t(left.next)];
    const merge* m = find_merge(left.id, right.id);
    if (!m || m->new_id != top.new_id)
      continue;
    left.id = top.new_id;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0)
      symbols[size_t(left.next)].prev = top.pos;
    if (left.prev >= 0)
      if (const merge* pm = find_merge(symbols[size_t(left.prev)].id, left.id))
        push({pm->rank, left.prev, pm->new_id});
    if (left.next >= 0)
      if (const merge* nm = find_merge(left.id, symbols[size_t(left.next)].id))
        push({nm->rank, top.pos, nm->new_id});
  }
  for (int32_t k = symbols.empty() ? -1 : 0; k >= 0; k = symbols[size_t(k)].next)
    out.push_back(symbols[size_t(k)].id);
}

} // namespace metronome
