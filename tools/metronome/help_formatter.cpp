#include "tools/metronome/help_formatter.hpp"

#include <sstream>

namespace metronome::cli {

std::string help_formatter::make_option_opts(const CLI::Option* opt) const {
  if (!opt->get_option_text().empty())
    return " " + opt->get_option_text();
  std::ostringstream out;
  if (opt->get_type_size() != 0) {
    if (!opt->get_type_name().empty())
      out << " " << get_label(opt->get_type_name());
    if (opt->get_expected_max() == CLI::detail::expected_max_vector_size)
      out << " ...";
    else if (opt->get_expected_min() > 1)
      out << " x " << opt->get_expected();
    if (opt->get_required())
      out << " " << get_label("REQUIRED");
  }
  if (!opt->get_envname().empty())
    out << " (" << get_label("Env") << ":" << opt->get_envname() << ")";
  if (!opt->get_needs().empty()) {
    out << " " << get_label("Needs") << ":";
    for (const CLI::Option* other : opt->get_needs())
      out << " " << other->get_name();
  }
  if (!opt->get_excludes().empty()) {
    out << " " << get_label("Excludes") << ":";
    for (const CLI::Option* other : opt->get_excludes())
      out << " " << other->get_name();
  }
  return out.str();
}

std::string help_formatter::make_option_desc(const CLI::Option* opt) const {
  std::string desc = opt->get_description();
  // CLI11 captures an empty list as "[]": nothing to show.
  const std::string& def = opt->get_default_str();
  if (opt->get_type_size() != 0 && !def.empty() && def != "[]")
    desc += " [default: " + def + "]";
  return desc;
}

std::string unknown_subcommand(const CLI::App& app, const std::string& arg) {
  if (arg.empty() || arg.front() == '-')
    return {};
  std::string names;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->check_name(arg))
      return {};
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return "unknown subcommand '" + arg + "' (subcommands: " + names + ")";
}

} // namespace metronome::cli
