#pragma once
// The schema of metronome.yaml: every key with its type, allowed values,
// one-line documentation, and the functions that set and print it. The YAML
// loader, command-line overrides and to_yaml all go through this one table,
// so a key is validated the same way wherever its value comes from.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config_scalar.hpp"
#include "config/server_config.hpp"

namespace metronome {

/// The kind of scalar a key takes.
enum class value_kind : uint8_t {
  /// Decimal integer.
  integer,
  /// Number (integer or decimal, finite).
  real,
  /// true/false (also yes/no, on/off).
  boolean,
  /// Any string; some keys add a syntax check (host, device).
  text,
  /// One of a fixed set of names.
  choice,
  /// A byte count: an integer, or an integer with a unit (KiB, MiB, GiB,
  /// KB, MB, GB, B).
  bytes,
  /// A list of strings: a YAML sequence, or one comma-separated scalar (the
  /// command line's form).
  list,
};

/// One leaf key of metronome.yaml.
struct config_key {
  /// Dotted path from the top of the file: "engine.max_batch_size".
  std::string path;
  value_kind kind = value_kind::text;
  /// What the key accepts, as error messages say it: "an integer in [1, 4096]".
  std::string allowed;
  /// The value's type as the command line's help names it: INT, FLOAT, BOOL,
  /// SIZE (a byte count), TEXT, PATH, HOST, a list such as ORIGIN,... or
  /// the names of a choice, {a,b,c}. Set by the same builder that sets the
  /// key's parser, so the two cannot disagree.
  std::string metavar;
  /// One line saying what the key does.
  std::string doc;
  /// Parses the scalar `text` (as written in YAML or after `--set key=`) into
  /// the field and checks its type and range. Returns the problem, empty on
  /// success; on failure the field is left unchanged.
  std::function<std::string(server_config&, std::string_view text)> set;
  /// value_kind::list only: sets the field from a YAML sequence's items, with
  /// the same checks as `set` (which splits its text at commas).
  std::function<std::string(server_config&, const std::vector<std::string>& items)> set_list;
  /// The field as a YAML scalar that `set` reads back to the same value.
  std::function<std::string(const server_config&)> get;
};

/// Every key, in the order of the file's sections. Thread-safe (built once).
const std::vector<config_key>& config_keys();

/// The key with this exact path, or nullptr.
const config_key* find_config_key(std::string_view path);

/// Whether `path` names a section or subsection ("engine",
/// "supervisor.drift"), i.e. a mapping that holds keys.
bool is_config_section(std::string_view path);

/// The key's built-in default as a command-line value would write it
/// ("8080", "0.9", "ladb", "1MiB"; a list comma-separated); empty when the
/// default is the empty string or the empty list.
std::string default_text(const config_key& key);

/// The names directly below a section ("" = the top level): the keys' last
/// components and the subsections' names, in schema order.
std::vector<std::string> config_children(std::string_view section);

} // namespace metronome
