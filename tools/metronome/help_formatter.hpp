#pragma once
// The help text of `metronome` and its subcommands: each option with its
// value's type (INT, FLOAT, PATH, {a,b,c}, ...) beside its name and its
// default at the end of its description.

#include <string>

#include <CLI/CLI.hpp>

namespace metronome::cli {

/// CLI11's formatter with the default moved from "TYPE=default" (easily
/// read as the syntax to type) to "[default: X]" after the description. An
/// option shows its type as its type_name (CLI11's for typed variables:
/// INT, UINT, FLOAT, TEXT; set explicitly where the value is a path or a
/// choice), and no default when its default_str is empty (or an empty
/// list).
class help_formatter : public CLI::Formatter {
public:
  std::string make_option_opts(const CLI::Option* opt) const override;
  std::string make_option_desc(const CLI::Option* opt) const override;
};

/// The error for a first argument that names no subcommand: "unknown
/// subcommand 'bogus' (subcommands: serve, generate, ...)"; empty when
/// `arg` is an option ("-h", "--version") or one of `app`'s subcommands.
std::string unknown_subcommand(const CLI::App& app, const std::string& arg);

} // namespace metronome::cli
