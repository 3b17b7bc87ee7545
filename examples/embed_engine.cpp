// Embedding Metronome: start the engine inside your own CAF actor_system,
// send a request as a message, receive the streamed text as messages. No
// HTTP involved.
//
//   embed_engine MODEL_DIR [PROMPT]
//
// The message interface (actors/interfaces.hpp, the types in messages.hpp):
//   you -> engine.frontend:  generate_request   (you become the request's sink)
//   engine -> you:           text_delta*, then generation_done or generation_error
// so the client below is a request_sink_actor, and the compiler checks both.
// To cancel, let the sink actor terminate: the engine monitors it and frees
// the request's KV pages.

#include <iostream>

#include "caf/all.hpp"

#include "actors/engine.hpp"

namespace {

/// A client actor: sends one request and prints what streams back.
metronome::request_sink_actor::behavior_type client(metronome::request_sink_actor::pointer self,
                                                    metronome::frontend_actor frontend,
                                                    metronome::generate_request request) {
  self->send(frontend, std::move(request));
  return {
    [=](metronome::text_delta& d) { std::cout << d.text << std::flush; },
    [=](metronome::generation_done& d) {
      std::cout << "\n[" << d.completion_tokens
                << " tokens, finish_reason=" << to_string(d.finish_reason)
                << ", ttft=" << d.ttft_s * 1e3 << " ms, e2e=" << d.e2e_s * 1e3 << " ms]\n";
      self->quit();
    },
    [=](metronome::generation_error& e) {
      std::cerr << "error (" << to_string(e.code) << "): " << e.message << "\n";
      self->quit(caf::make_error(caf::sec::runtime_error, e.message));
    },
  };
}

struct config : caf::actor_system_config {
  config() {
    metronome::register_message_types(*this);
  }
};

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: embed_engine MODEL_DIR [PROMPT]\n";
    return 2;
  }
  config cfg;
  caf::actor_system sys{cfg};
  metronome::engine_options opts;
  opts.model_dir = argv[1];
  metronome::engine eng;
  try {
    eng = metronome::spawn_engine(sys, opts);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  metronome::generate_request req;
  req.request_id = "embedded-1";
  req.chat = true;
  req.messages = {{"user", argc > 2 ? argv[2] : "Say hello."}};
  req.params.max_tokens = 32;
  req.params.temperature = 0;
  auto c = sys.spawn(client, eng.frontend, req);
  caf::scoped_actor self{sys};
  self->wait_for(c);
  eng.shutdown();
  return 0;
}
