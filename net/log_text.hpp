#pragma once
// log_text lives in metrics/log_text.hpp, below the engine, so that every
// log line (the edge's, the engine's, structured events) escapes client
// text the same way; the network edge keeps calling it by this name.

#include "metrics/log_text.hpp"

namespace metronome::net {

using metronome::log_text;

} // namespace metronome::net
