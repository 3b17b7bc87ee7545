// incremental_decoder: streaming detokenization of one sequence.
//
// Design note: the decoder keeps a small window of ids: those from `prefix_`
// to `read_` were emitted already and give the context (a leading-space
// Strip, a Metaspace first token) that the new ids are decoded in. Each push
// decodes the window with the new id; if the text grew and does not end in
// U+FFFD (bytes still incomplete) the growth is emitted and the window moves
// on. Decoding a window gives the same text as decoding the whole sequence
// because the window starts where all earlier bytes formed whole characters.
// One exception: Llama 2 and Mistral spell rare characters as byte tokens
// ("<0xE4>"), and their ByteFallback decoder turns a whole run of those into
// U+FFFD per byte when the run is not valid UTF-8, so a later byte can make
// an emitted valid prefix of the run (say "m" from <0x6D>) read as U+FFFD.
// Text cannot be taken back; the decoder keeps what it emitted and goes on
// after the run (see push()).

#include "model/tokenizer/tokenizer.hpp"

namespace metronome {

incremental_decoder::incremental_decoder(std::shared_ptr<const tokenizer> tok,
                                         bool skip_special_tokens)
  : tok_(std::move(tok)), skip_special_(skip_special_tokens) {}

std::string incremental_decoder::window_text(size_t begin, size_t end) const {
  return tok_->decode(std::span<const int32_t>(ids_.data() + begin, end - begin),
                      tokenizer::decode_options{skip_special_, false});
}

std::string incremental_decoder::push(int32_t id) {
  ids_.push_back(id);
  std::string text = window_text(prefix_, ids_.size());
  if (text.compare(0, prefix_text_.size(), prefix_text_) != 0) {
    // The window no longer reads as what was emitted: a byte-fallback run
    // that was valid UTF-8 got a byte that makes it invalid, and decode()
    // now gives U+FFFD for all of it. What was emitted stands; decode the
    // ids not emitted yet on their own from here on (they start with that
    // byte token, so no context is lost), or every later id would fail this
    // comparison and the rest of the sequence would never come out.
    prefix_ = read_;
    prefix_text_.clear();
    text = window_text(prefix_, ids_.size());
  }
  constexpr std::string_view replacement = "\xEF\xBF\xBD";
  const bool incomplete = text.size() >= 3 && text.compare(text.size() - 3, 3, replacement) == 0;
  if (text.size() <= prefix_text_.size() || incomplete)
    return {};
  std::string out = text.substr(prefix_text_.size());
  prefix_ = read_;
  read_ = ids_.size();
  prefix_text_ = window_text(prefix_, read_);
  if (prefix_ > 4096) {
    ids_.erase(ids_.begin(), ids_.begin() + std::ptrdiff_t(prefix_));
    read_ -= prefix_;
    prefix_ = 0;
  }
  return out;
}

std::string incremental_decoder::finish() {
  std::string text = window_text(prefix_, ids_.size());
  std::string out;
  if (text.compare(0, prefix_text_.size(), prefix_text_) != 0)
    out = window_text(read_, ids_.size()); // as in push()
  else if (text.size() > prefix_text_.size())
    out = text.substr(prefix_text_.size());
  ids_.clear();
  prefix_ = read_ = 0;
  prefix_text_.clear();
  return out;
}

} // namespace metronome
