#pragma once
// metronome.json of a model folder: the name and the one-line description
// Metronome shows for the model (the start-up banner, GET /v1/models). The
// folder says what it is; Metronome claims nothing about a folder without
// one. tools/train_default_model.py writes it for the default model and
// `metronome make-model` for its random-weight folders.
//
//   {"id": "metronome-tiny", "description": "a 7.4M-parameter Llama ..."}
//
// Both keys are optional; other keys are ignored.

#include <filesystem>
#include <optional>
#include <string>

namespace metronome {

/// The file name, in the model folder.
inline constexpr const char* model_card_file = "metronome.json";

struct model_card {
  /// The served model name when none is configured; empty: the folder's name.
  std::string id;
  /// One line (no line breaks) saying what the model is.
  std::string description;
};

/// Reads dir/metronome.json; nullopt when there is none. Throws model_error
/// naming the file and key when it is not a JSON object, a key is not a
/// string, the id is not a usable model name (1-128 characters of letters,
/// digits, '.', '_', '-', ':' and '/') or the description has a control
/// character or more than 500 bytes.
std::optional<model_card> read_model_card(const std::filesystem::path& dir);

} // namespace metronome
