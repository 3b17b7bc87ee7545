#include "tests/net/fake_engine.hpp"

#include <chrono>
#include <sstream>
#include <unordered_set>
#include <variant>

#include <nlohmann/json.hpp>

#include "actors/engine_metrics.hpp"

namespace metronome::test {

namespace {

using event = std::variant<text_delta, generation_done, generation_error>;

struct plan {
  std::vector<event> events;
  std::chrono::milliseconds interval{0};
  /// Stop after the events without a final one (hang).
  bool hang = false;
  /// Die after the events without a final one (vanish).
  bool vanish = false;
};

std::string script_of(const generate_request& req) {
  if (!req.chat)
    return req.prompt;
  return req.messages.empty() ? std::string{} : req.messages.back().content;
}

generation_done done_of(const generate_request& req, finish_kind reason, int32_t tokens) {
  generation_done d;
  d.request_id = req.request_id;
  d.finish_reason = reason;
  d.prompt_tokens = 7;
  d.completion_tokens = tokens;
  d.queue_s = 0.001;
  d.ttft_s = 0.002;
  d.e2e_s = 0.003;
  d.first_token_batch_size = fake_batch_size;
  return d;
}

text_delta delta_of(const generate_request& req, std::string text, bool first) {
  text_delta d;
  d.request_id = req.request_id;
  d.text = std::move(text);
  d.token_ids = {1};
  d.first_token_batch_size = first ? fake_batch_size : 0;
  return d;
}

std::string params_json(const generate_request& req) {
  const auto& p = req.params;
  nlohmann::json j = {{"request_id", req.request_id},
                      {"chat", req.chat},
                      {"prompt", req.prompt},
                      {"prompt_ids", req.prompt_ids},
                      {"temperature", p.temperature},
                      {"top_p", p.top_p},
                      {"top_k", p.top_k},
                      {"min_p", p.min_p},
                      {"frequency_penalty", p.frequency_penalty},
                      {"presence_penalty", p.presence_penalty},
                      {"repetition_penalty", p.repetition_penalty},
                      {"max_tokens", p.max_tokens},
                      {"ignore_eos", p.ignore_eos},
                      {"stop", req.stop},
                      {"stop_token_ids", p.stop_token_ids},
                      {"skip_special_tokens", req.skip_special_tokens},
                      {"add_generation_prompt", req.add_generation_prompt},
                      {"timeout_ms", req.timeout.count()}};
  j["seed"] = p.seed ? nlohmann::json(*p.seed) : nlohmann::json(nullptr);
  auto& msgs = j["messages"] = nlohmann::json::array();
  for (const auto& m : req.messages)
    msgs.push_back({{"role", m.role}, {"content", m.content}});
  return j.dump();
}

plan plan_for(const generate_request& req) {
  plan p;
  auto script = script_of(req);
  std::istringstream in{script};
  std::string verb;
  in >> verb;
  if (verb == "echo") {
    std::string word;
    int32_t n = 0;
    while (in >> word) {
      p.events.emplace_back(delta_of(req, word + " ", n == 0));
      ++n;
    }
    p.events.emplace_back(done_of(req, finish_kind::stop, n));
  } else if (verb == "count") {
    int n = 0;
    int ms = 0;
    in >> n >> ms;
    for (int i = 0; i < n; ++i)
      p.events.emplace_back(delta_of(req, "t" + std::to_string(i) + " ", i == 0));
    p.events.emplace_back(done_of(req, finish_kind::length, n));
    p.interval = std::chrono::milliseconds(ms);
  } else if (verb == "hang") {
    p.events.emplace_back(delta_of(req, "x", true));
    p.hang = true;
  } else if (verb == "hang-silent") {
    p.hang = true;
  } else if (verb == "error") {
    int code = 4;
    in >> code;
    p.events.emplace_back(generation_error{req.request_id, static_cast<request_errc>(code),
                                           "fake error " + std::to_string(code), "prompt"});
  } else if (verb == "late-error") {
    p.events.emplace_back(delta_of(req, "partial", true));
    p.events.emplace_back(generation_error{req.request_id, request_errc::engine_failure,
                                           "the executor failed", ""});
  } else if (verb == "vanish") {
    p.events.emplace_back(delta_of(req, "v", true));
    p.vanish = true;
  } else if (verb == "empty") {
    p.events.emplace_back(done_of(req, finish_kind::stop, 0));
  } else if (verb == "params") {
    p.events.emplace_back(delta_of(req, params_json(req), true));
    p.events.emplace_back(done_of(req, finish_kind::stop, 1));
  } else {
    p.events.emplace_back(delta_of(req, script, true));
    p.events.emplace_back(done_of(req, finish_kind::stop, 1));
  }
  return p;
}

/// One request: plays its plan to the sink; a DOWN of the sink first is a
/// cancellation.
caf::behavior fake_request(caf::event_based_actor* self, caf::actor sink, plan pl,
                           std::shared_ptr<fake_stats> stats) {
  stats->live += 1;
  self->attach_functor([stats] { stats->live -= 1; });
  self->monitor(sink);
  self->set_down_handler([=](caf::down_msg&) {
    stats->cancelled += 1;
    self->quit();
  });
  auto events = std::make_shared<std::vector<event>>(std::move(pl.events));
  auto interval = pl.interval;
  auto hang = pl.hang;
  auto vanish = pl.vanish;
  self->send(self, tick_atom::value, size_t{0});
  return {
    [=](tick_atom, size_t i) {
      if (i >= events->size()) {
        if (vanish) {
          self->demonitor(sink);
          self->quit(caf::make_error(caf::sec::runtime_error, "vanished"));
          return;
        }
        if (!hang) {
          stats->finished += 1;
          self->demonitor(sink);
          self->quit();
        }
        return;
      }
      std::visit([&](auto& ev) { self->send(sink, ev); }, (*events)[i]);
      bool final_event = !std::holds_alternative<text_delta>((*events)[i]);
      if (final_event) {
        stats->finished += 1;
        self->demonitor(sink);
        self->quit();
        return;
      }
      if (interval.count() > 0)
        self->delayed_send(self, interval, tick_atom::value, i + 1);
      else
        self->send(self, tick_atom::value, i + 1);
    },
  };
}

struct frontend_state {
  /// Handles of the request actors (an actor nobody holds would be
  /// terminated as unreachable).
  std::unordered_set<caf::actor> requests;
};

frontend_actor::behavior_type fake_frontend(frontend_actor::stateful_pointer<frontend_state> self,
                                            std::shared_ptr<fake_stats> stats) {
  self->set_down_handler([=](caf::down_msg& dm) {
    auto h = caf::actor_cast<caf::actor>(dm.source);
    self->state.requests.erase(h);
  });
  return {
    [=](generate_request& req) {
      auto sink = caf::actor_cast<caf::actor>(self->current_sender());
      stats->requests += 1;
      {
        std::lock_guard<std::mutex> guard{stats->mtx};
        stats->seen.push_back(req);
      }
      auto r = self->spawn(fake_request, sink, plan_for(req), stats);
      self->monitor(r);
      self->state.requests.insert(r);
    },
  };
}

} // namespace

frontend_actor spawn_fake_frontend(caf::actor_system& sys, std::shared_ptr<fake_stats> stats) {
  return sys.spawn(fake_frontend, std::move(stats));
}

engine make_fake_engine(caf::actor_system& sys, std::shared_ptr<fake_stats> stats) {
  engine eng;
  eng.frontend = spawn_fake_frontend(sys, std::move(stats));
  auto status = std::make_shared<engine_status>();
  status->ready = true;
  status->model_name = "fake-model";
  status->max_model_len = 128;
  status->device = "cpu";
  status->kv_cache_strategy = "paged";
  eng.status = std::move(status);
  // The real metrics registry, so GET /metrics renders what the engine would.
  eng.metrics = std::make_shared<engine_metrics>(eng.status->model_name);
  return eng;
}

} // namespace metronome::test
