#include "actors/request_actor.hpp"

#include <algorithm>
#include <cctype>

#include <spdlog/spdlog.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/scoped_monitors.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "model/tokenizer/unicode.hpp"

namespace metronome {

// -- chat prompts -------------------------------------------------------------------

namespace {

bool has_special_text(const tokenizer& tok, std::string_view text) {
  for (auto id : tok.encode(text, {false, true}))
    if (tok.is_special(id))
      return true;
  return false;
}

std::vector<chat_message> to_chat(const std::vector<chat_turn>& turns) {
  std::vector<chat_message> out;
  out.reserve(turns.size());
  for (const auto& t : turns)
    out.push_back({t.role, t.content});
  return out;
}

} // namespace

std::vector<int32_t> encode_chat(const tokenizer& tok, const chat_template& tmpl,
                                 const std::vector<chat_turn>& messages,
                                 bool add_generation_prompt) {
  auto chat = to_chat(messages);
  const auto text = tmpl.apply(chat, add_generation_prompt);
  const bool injected = std::any_of(messages.begin(), messages.end(), [&](const chat_turn& t) {
    return has_special_text(tok, t.content);
  });
  if (!injected) // the common case: exactly what apply_chat_template(tokenize=True) gives
    return tok.encode(text, {false, true});
  // A content holds special-token text: render with placeholders, encode the
  // template's parts with special tokens and the contents as plain text.
  std::vector<std::string> marks;
  for (size_t i = 0; i < chat.size(); ++i) {
    marks.push_back("\xEE\x80\x80" + std::to_string(i) + "\xEE\x80\x81"); // U+E000 i U+E001
    chat[i].content = marks.back();
  }
  const auto skeleton = tmpl.apply(chat, add_generation_prompt);
  const bool trims = tmpl.kind() != chat_template::format::chatml
                     && tmpl.kind() != chat_template::format::mistral
                     && tmpl.kind() != chat_template::format::plain;
  std::vector<int32_t> ids;
  size_t pos = 0;
  for (size_t i = 0; i < marks.size(); ++i) {
    const auto at = skeleton.find(marks[i], pos);
    if (at == std::string::npos)
      continue; // the template dropped this message
    auto part = tok.encode(std::string_view(skeleton).substr(pos, at - pos), {false, true});
    ids.insert(ids.end(), part.begin(), part.end());
    std::string_view content = messages[i].content;
    if (trims) {
      while (!content.empty() && std::isspace(static_cast<unsigned char>(content.front())))
        content.remove_prefix(1);
      while (!content.empty() && std::isspace(static_cast<unsigned char>(content.back())))
        content.remove_suffix(1);
    }
    auto plain = tok.encode(content, {false, false});
    ids.insert(ids.end(), plain.begin(), plain.end());
    pos = at + marks[i].size();
  }
  auto tail = tok.encode(std::string_view(skeleton).substr(pos), {false, true});
  ids.insert(ids.end(), tail.begin(), tail.end());
  return ids;
}

// -- the request actor -----------------------------------------------------------------

namespace {

struct request_state {
  std::shared_ptr<const request_context> ctx;
  generate_request req;
  request_sink_actor sink;
  uint64_t seq = 0;
  std::unique_ptr<incremental_decoder> decoder;
  /// Decoded text not yet sent: it might still be the start of a stop string.
  std::string held;
  /// Log-probabilities of tokens not yet reported (sent with the next delta).
  std::vector<position_logprobs> held_logprobs;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  sched_time arrival{0};
  sched_time first_token{0};
  sched_time last_token{0};
  double queue_s = 0;
  int32_t first_batch = 0;
  int32_t cached_tokens = 0; // prompt tokens the prefix cache held
  /// The KV overflow supervision's last word on this request (token_msg).
  kv_fallback kv_overflow = kv_fallback::none;
  bool sent_first = false;
  bool admitted = false;
  /// What was admitted, kept to admit it again if its worker is lost
  /// before its first token (replica_lost).
  admit_msg admission;
  int32_t reruns = 0;
  /// Schedulers of lost workers: what still comes from them is dropped.
  std::vector<caf::actor_addr> lost;
  /// The sink and the scheduler, watched while the request lives. The state
  /// is destroyed on every way the actor ends, and with it these monitors:
  /// the scheduler (and a sink that outlives the request) keep no record of
  /// a finished request (scoped_monitors.hpp).
  scoped_monitors monitors;
  /// The deadline: a request to ourselves that is never answered, so its
  /// timeout fires at the deadline (see request_behavior()). Kept here until
  /// the state goes, not dropped, so that a CAF that reports dropped
  /// promises (0.18+: broken_promise) would not end the wait early.
  caf::response_promise deadline;
  static inline const char* name = "request";
};

using self_ptr = request_actor::stateful_pointer<request_state>;

double seconds(sched_time d) {
  return std::chrono::duration<double>(d).count();
}

void fail(self_ptr self, request_errc code, std::string message, std::string param = {}) {
  auto& st = self->state;
  if (st.ctx->metrics)
    st.ctx->metrics->on_error(to_string(code));
  self->send(st.sink, generation_error{st.req.request_id, code, std::move(message), std::move(param)});
  self->quit();
}

void cancel_in_scheduler(self_ptr self, finish_kind reason) {
  auto& st = self->state;
  if (st.admitted)
    self->send(st.ctx->scheduler, cancel_atom::value, st.seq, reason);
  st.admitted = false;
}

void emit(self_ptr self, std::string text, std::vector<int32_t> ids) {
  auto& st = self->state;
  if (text.empty() && st.sent_first && st.held_logprobs.empty())
    return;
  text_delta d{st.req.request_id, std::move(text), std::move(ids), {}, 0, st.prompt_tokens,
               st.completion_tokens};
  d.logprobs.swap(st.held_logprobs);
  d.kv_overflow = std::string(to_string(st.kv_overflow));
  if (!st.sent_first) {
    d.first_token_batch_size = st.first_batch;
    st.sent_first = true;
  }
  self->send(st.sink, std::move(d));
}

void finish(self_ptr self, finish_kind reason) {
  auto& st = self->state;
  generation_done done;
  done.request_id = st.req.request_id;
  done.finish_reason = reason;
  done.prompt_tokens = st.prompt_tokens;
  done.cached_tokens = st.cached_tokens;
  done.completion_tokens = st.completion_tokens;
  done.queue_s = st.queue_s;
  done.ttft_s = st.completion_tokens > 0 ? seconds(st.first_token - st.arrival) : 0.0;
  done.e2e_s = st.completion_tokens > 0 ? seconds(st.last_token - st.arrival) : 0.0;
  done.first_token_batch_size = st.first_batch;
  done.kv_overflow = std::string(to_string(st.kv_overflow));
  if (st.ctx->metrics)
    st.ctx->metrics->on_finish(reason, done.e2e_s, done.prompt_tokens, done.completion_tokens,
                               done.queue_s, done.ttft_s);
  self->send(st.sink, std::move(done));
  self->quit();
}

/// Moves what is certain to be output from `held` to the sink. Returns true
/// if a stop string was found (everything before it was sent).
bool release_text(self_ptr self, std::vector<int32_t> ids, bool final) {
  auto& st = self->state;
  const auto& stops = st.req.stop;
  size_t cut = std::string::npos;
  for (const auto& s : stops)
    if (!s.empty())
      cut = std::min(cut, st.held.find(s));
  if (cut != std::string::npos) {
    emit(self, st.held.substr(0, cut), std::move(ids));
    st.held.clear();
    return true;
  }
  size_t keep = 0; // longest suffix of held that starts some stop string
  if (!final)
    for (const auto& s : stops)
      for (size_t n = std::min(s.size() - 1, st.held.size()); n > keep; --n)
        if (st.held.compare(st.held.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
  emit(self, st.held.substr(0, st.held.size() - keep), std::move(ids));
  st.held.erase(0, st.held.size() - keep);
  return false;
}

token_text_logprob with_text(const tokenizer& tok, token_logprob t) {
  auto bytes = tok.token_bytes(t.token);
  auto text = unicode::to_valid_utf8(bytes);
  return {std::move(text), std::move(bytes), t.logprob};
}

void on_tokens(self_ptr self, const token_msg& m) {
  auto& st = self->state;
  const auto now = engine_now(self);
  if (st.completion_tokens == 0) {
    st.first_token = now;
    st.first_batch = m.batch_size;
    st.cached_tokens = m.cached_tokens;
    st.queue_s = m.queue_ns >= 0 ? double(m.queue_ns) / 1e9 : 0.0;
    if (st.ctx->metrics)
      st.ctx->metrics->on_first_token(st.queue_s, seconds(now - st.arrival));
  } else if (st.ctx->metrics) {
    st.ctx->metrics->on_token_gap(seconds(now - st.last_token));
  }
  st.last_token = now;
  st.kv_overflow = m.kv_overflow;
  for (const auto& lps : m.logprobs) {
    if (lps.empty())
      continue;
    position_logprobs p;
    p.sampled = with_text(*st.ctx->tokens, lps.front());
    for (size_t k = 1; k < lps.size(); ++k)
      p.top.push_back(with_text(*st.ctx->tokens, lps[k]));
    st.held_logprobs.push_back(std::move(p));
  }
  for (size_t i = 0; i < m.tokens.size(); ++i) {
    ++st.completion_tokens;
    const bool stop_token = m.finish_reason == finish_kind::stop && i + 1 == m.tokens.size();
    if (!stop_token)
      st.held += st.decoder->push(m.tokens[i]);
  }
  const bool last = m.finish_reason != finish_kind::none;
  if (last)
    st.held += st.decoder->finish();
  if (release_text(self, m.tokens, last)) {
    cancel_in_scheduler(self, finish_kind::stop);
    finish(self, finish_kind::stop);
    return;
  }
  if (last) {
    st.admitted = false; // the scheduler already let go of it
    finish(self, m.finish_reason);
  }
}

/// Admissions of one request at most, the first included: a request whose
/// workers keep dying is not passed around forever.
constexpr int32_t max_admissions = 3;

/// The worker running the request is gone (the router says so). Nothing of
/// it reached the client yet: admit it again (under a new sequence id, so
/// that late tokens of the lost admission are told apart); the router
/// places it on a replica that is up. Otherwise it fails: the client has
/// part of an answer, and a second run would not continue it.
void on_replica_lost(self_ptr self, const replica_lost& l) {
  auto& st = self->state;
  if (l.scheduler)
    st.lost.push_back(l.scheduler);
  if (!st.admitted)
    return;
  if (st.completion_tokens == 0 && st.reruns + 1 < max_admissions) {
    ++st.reruns;
    st.seq = st.ctx->next_seq_id->fetch_add(1);
    auto again = st.admission;
    again.seq_id = st.seq;
    spdlog::info("request {}: its worker was lost ({}); admitted again", st.req.request_id,
                 l.reason);
    if (st.ctx->metrics)
      st.ctx->metrics->on_rerun();
    self->send(st.ctx->scheduler, std::move(again));
    return;
  }
  st.admitted = false;
  fail(self, request_errc::engine_failure,
       st.completion_tokens == 0
         ? "the workers running this request were lost " + std::to_string(st.reruns + 1)
             + " times (last: " + l.reason + ")"
         : "the worker running this request was lost after " + std::to_string(st.completion_tokens)
             + " tokens (" + l.reason + ")");
}

/// Tokenizes and checks the request; false (after failing it) when invalid.
bool prepare(self_ptr self, std::vector<int32_t>& prompt) {
  auto& st = self->state;
  auto& req = st.req;
  const auto& ctx = *st.ctx;
  std::string prompt_param = req.chat ? "messages" : "prompt";
  try {
    if (req.chat) {
      if (req.messages.empty()) {
        fail(self, request_errc::invalid_request, "messages must not be empty", "messages");
        return false;
      }
      prompt = encode_chat(*ctx.tokens, *ctx.chat, req.messages, req.add_generation_prompt);
    } else if (!req.prompt_ids.empty()) {
      prompt = req.prompt_ids;
    } else {
      prompt = ctx.tokens->encode(req.prompt, {true, false});
    }
  } catch (const std::invalid_argument& e) {
    fail(self, request_errc::invalid_request, e.what(), prompt_param);
    return false;
  }
  if (prompt.empty()) {
    fail(self, request_errc::invalid_request, "the prompt is empty", prompt_param);
    return false;
  }
  for (auto id : prompt)
    if (id < 0 || id >= ctx.vocab_size) {
      fail(self, request_errc::invalid_request,
           "token id " + std::to_string(id) + " is outside the vocabulary (0.."
             + std::to_string(ctx.vocab_size - 1) + ")",
           prompt_param);
      return false;
    }
  const int32_t n = int32_t(prompt.size());
  auto& max_tokens = req.params.max_tokens;
  if (n >= ctx.max_model_len || (max_tokens > 0 && n + max_tokens > ctx.max_model_len)) {
    std::string msg = "This model's maximum context length is " + std::to_string(ctx.max_model_len)
                      + " tokens. However, you requested "
                      + std::to_string(n + std::max(max_tokens, 0)) + " tokens (" + std::to_string(n)
                      + " in the " + prompt_param + ", " + std::to_string(std::max(max_tokens, 0))
                      + " in the completion). Please reduce the length of the " + prompt_param
                      + " or completion.";
    fail(self, request_errc::context_length, msg, n >= ctx.max_model_len ? prompt_param : "max_tokens");
    return false;
  }
  if (max_tokens <= 0)
    max_tokens = ctx.max_model_len - n; // unset: up to the context
  if (auto problem = req.params.validate(); !problem.empty()) {
    auto param = problem.substr(0, problem.find(':'));
    fail(self, request_errc::invalid_request, problem, param);
    return false;
  }
  for (const auto& s : req.stop)
    if (s.empty()) {
      fail(self, request_errc::invalid_request, "stop strings must not be empty", "stop");
      return false;
    }
  st.prompt_tokens = n;
  return true;
}

float non_alnum_share(const generate_request& req) {
  size_t total = 0, other = 0;
  auto count = [&](const std::string& s) {
    for (unsigned char c : s) {
      if (std::isspace(c))
        continue;
      ++total;
      if (!std::isalnum(c))
        ++other;
    }
  };
  count(req.prompt);
  for (const auto& m : req.messages)
    count(m.content);
  return total == 0 ? 0.0f : float(other) / float(total);
}

request_actor::behavior_type request_behavior(self_ptr self,
                                              std::shared_ptr<const request_context> ctx,
                                              generate_request req, request_sink_actor sink) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.req = std::move(req);
  st.sink = std::move(sink);
  st.arrival = engine_now(self);
  // Whatever goes wrong in here, the sink hears of it: it waits for exactly
  // one generation_done or generation_error.
  self->set_exception_handler([=](caf::scheduled_actor*, std::exception_ptr& ep) -> caf::error {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      // keep the generic text
    }
    auto& s = self->state;
    cancel_in_scheduler(self, finish_kind::failed);
    self->send(s.sink, generation_error{s.req.request_id, request_errc::engine_failure,
                                        "the request failed: " + what, ""});
    return caf::make_error(caf::sec::runtime_error, what);
  });
  st.monitors.add(self, st.sink);
  st.monitors.add(self, st.ctx->scheduler);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (dm.source == s.sink.address()) {
      cancel_in_scheduler(self, finish_kind::cancelled); // the client went away
      if (s.ctx->metrics)
        s.ctx->metrics->on_finish(finish_kind::cancelled, 0.0, s.prompt_tokens,
                                  s.completion_tokens);
      self->quit();
    } else if (dm.source == s.ctx->scheduler.address()) {
      s.admitted = false;
      fail(self, request_errc::unavailable, "the engine is shutting down");
    }
  });
  std::vector<int32_t> prompt;
  if (!prepare(self, prompt))
    return request_actor::behavior_type::make_empty_behavior(); // failed and quit
  st.seq = st.ctx->next_seq_id->fetch_add(1);
  st.decoder = std::make_unique<incremental_decoder>(st.ctx->tokens, st.req.skip_special_tokens);
  admit_msg admit;
  admit.seq_id = st.seq;
  admit.prompt = std::move(prompt);
  admit.params = st.req.params;
  admit.seed = st.req.params.seed.value_or(fresh_seed());
  admit.arrival_ns = st.arrival.count();
  admit.request_class = st.req.request_class;
  admit.non_alnum_share = non_alnum_share(st.req);
  admit.kv_mode = st.req.kv_mode;
  admit.no_batch = st.req.no_batch;
  admit.max_context = st.req.max_context;
  st.admission = admit;
  self->send(st.ctx->scheduler, std::move(admit));
  st.admitted = true;
  const auto timeout = st.req.timeout.count() > 0 ? std::min(st.req.timeout, st.ctx->default_timeout)
                                                  : st.ctx->default_timeout;
  // The deadline is the timeout of a request to ourselves that we never
  // answer, not a delayed_send: CAF 0.17 cannot cancel a delayed message,
  // and its clock entry holds strong references to the receiver and the
  // sender until it fires, so every finished request's actor would stay
  // allocated for the whole timeout (10 minutes by default). A request's
  // timeout is cancelled when the actor ends (local_actor::cleanup ->
  // clock().cancel_timeouts), which frees it at once.
  self->request(request_actor{self}, timeout, timeout_atom::value)
    .then([] { /* never answered */ },
          [=](caf::error&) { // sec::request_timeout: the deadline has passed
            cancel_in_scheduler(self, finish_kind::timeout);
            fail(self, request_errc::timeout,
                 "the request did not finish within " + std::to_string(timeout.count()) + " ms");
          });
  return {
    [=](token_msg& m) {
      if (m.seq_id == self->state.seq) // not for an admission lost with its worker
        on_tokens(self, m);
    },
    [=](generation_error& e) {
      auto& s = self->state;
      if (std::find(s.lost.begin(), s.lost.end(), self->current_sender()) != s.lost.end())
        return;
      s.admitted = false;
      fail(self, e.code, std::move(e.message), std::move(e.param));
    },
    [=](replica_lost& l) { on_replica_lost(self, l); },
    [=](timeout_atom) -> caf::result<void> {
      // Our own deadline request (above): held, never delivered.
      self->state.deadline = self->make_response_promise();
      return self->state.deadline;
    },
  };
}

} // namespace

request_actor spawn_request(caf::actor_system& sys, std::shared_ptr<const request_context> ctx,
                            generate_request request, request_sink_actor sink) {
  auto status = ctx->status;
  if (status)
    ++status->live_requests;
  auto a = sys.spawn(request_behavior, std::move(ctx), std::move(request), std::move(sink));
  if (status)
    a->attach_functor([status] { --status->live_requests; });
  return a;
}

namespace {

/// The frontend: turns each generate_request into a request actor whose
/// sink is the sender.
frontend_actor::behavior_type frontend(frontend_actor::pointer self,
                                       std::shared_ptr<const request_context> ctx) {
  return {
    [=](generate_request& req) {
      // The sender is the request's sink (interfaces.hpp: request_sink_actor).
      auto sink = caf::actor_cast<request_sink_actor>(self->current_sender());
      if (!sink)
        return; // an anonymous request has nowhere to stream
      if (ctx->status && ctx->status->degraded) {
        self->send(sink, generation_error{req.request_id, request_errc::unavailable,
                                          "the engine is unavailable: its executor keeps failing",
                                          ""});
        return;
      }
      spawn_request(self->system(), ctx, std::move(req), std::move(sink));
    },
  };
}

} // namespace

frontend_actor spawn_frontend(caf::actor_system& sys, std::shared_ptr<const request_context> ctx) {
  return sys.spawn(frontend, std::move(ctx));
}

} // namespace metronome
