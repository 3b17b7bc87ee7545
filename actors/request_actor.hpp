#pragma once
// The request actor: one per request, its identity inside the engine.
//
// It tokenizes the prompt (rendering the chat template for chat requests),
// admits itself to the scheduler, turns the tokens it receives back into text
// with an incremental decoder, holds back text that could still become a
// stop string, and pushes text_delta events to its client sink, then one
// generation_done or generation_error. It monitors the sink (a dead sink
// cancels the request) and the scheduler, and gives up after its timeout.
//
// A finished request leaves nothing behind, however it ended: its monitors
// of the sink and the scheduler are removed and its deadline cancelled when
// the actor ends, so no long-lived actor or timer keeps the dead actor's
// memory (tests/actors/request_lifecycle_test.cpp).

#include <atomic>
#include <chrono>
#include <memory>

#include "actors/interfaces.hpp"

namespace metronome {

class tokenizer;
class chat_template;
class engine_metrics;
struct engine_status;

/// What all request actors of one engine share. Immutable after creation.
struct request_context {
  /// The scheduler, or with several replicas the router in front of theirs.
  admission_actor scheduler;
  std::shared_ptr<const tokenizer> tokens;
  std::shared_ptr<const chat_template> chat;
  std::shared_ptr<engine_status> status;
  std::shared_ptr<engine_metrics> metrics;
  int32_t max_model_len = 0;
  int32_t vocab_size = 0;
  std::chrono::milliseconds default_timeout{std::chrono::minutes(10)};
  std::shared_ptr<std::atomic<uint64_t>> next_seq_id = std::make_shared<std::atomic<uint64_t>>(1);
};

/// Spawns the request actor for `request`, streaming to `sink`. Any thread.
request_actor spawn_request(caf::actor_system& sys, std::shared_ptr<const request_context> ctx,
                            generate_request request, request_sink_actor sink);

/// Spawns the engine's frontend (frontend_actor in interfaces.hpp): for each
/// generate_request it receives, it spawns a request actor whose sink is the
/// sender. Any thread; spawn_engine calls it once per engine.
frontend_actor spawn_frontend(caf::actor_system& sys, std::shared_ptr<const request_context> ctx);

/// Prompt ids of a chat conversation: the template's special tokens are
/// control tokens, but special-token text inside message contents stays
/// plain text. Throws std::invalid_argument for a conversation the template
/// rejects.
std::vector<int32_t> encode_chat(const tokenizer& tok, const chat_template& tmpl,
                                 const std::vector<chat_turn>& messages,
                                 bool add_generation_prompt);

} // namespace metronome
