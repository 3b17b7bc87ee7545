// The replay plots' series styles (sim/svg_plot.hpp): a fixed colour and
// dash pattern per policy, the same in every plot whatever the order of the
// series, on the line and on its legend entry.

#include <set>

#include <gtest/gtest.h>

#include "sim/svg_plot.hpp"

namespace metronome::sim {
namespace {

const char* const policies[] = {"fcfs", "ladb", "srpt", "ladb-literal", "srpt-literal"};

TEST(svg_plot, each_policy_has_a_fixed_style_of_its_own) {
  // Pinned: a plot made today compares by eye with one made last month.
  EXPECT_EQ(style_of("fcfs").color, "#1f77b4");
  EXPECT_EQ(style_of("fcfs").dash, "");
  EXPECT_EQ(style_of("ladb").color, "#d62728");
  EXPECT_EQ(style_of("ladb").dash, "9,4");
  EXPECT_EQ(style_of("srpt").color, "#2ca02c");
  EXPECT_EQ(style_of("srpt").dash, "2,3");
  std::set<std::string> colors, dashes;
  for (const char* p : policies) {
    colors.insert(style_of(p).color);
    dashes.insert(style_of(p).dash);
  }
  EXPECT_EQ(colors.size(), std::size(policies)) << "a colour each";
  EXPECT_EQ(dashes.size(), std::size(policies)) << "a dash pattern each (for grey prints)";
}

TEST(svg_plot, another_label_gets_a_style_from_its_text_alone) {
  EXPECT_EQ(style_of("server").color, style_of("server").color);
  EXPECT_EQ(style_of("server").dash, style_of("server").dash);
  for (const char* p : policies)
    EXPECT_NE(style_of("server").color, style_of(p).color) << "not a policy's colour";
}

/// The `stroke` and `stroke-dasharray` of the first element of `svg` that
/// carries `attribute`="label".
std::string drawn(const std::string& svg, const std::string& attribute, const std::string& label) {
  const auto at = svg.find(attribute + "=\"" + label + "\"");
  if (at == std::string::npos)
    return "missing";
  const auto tag = svg.substr(at, svg.find('>', at) - at);
  auto value = [&](const std::string& name) {
    const auto k = tag.find(" " + name + "=\"");
    if (k == std::string::npos)
      return std::string();
    const auto from = k + name.size() + 3;
    return tag.substr(from, tag.find('"', from) - from);
  };
  return value("stroke") + "|" + value("stroke-dasharray");
}

TEST(svg_plot, the_order_of_the_series_changes_no_style) {
  auto panel = [](std::vector<std::string> order) {
    plot_panel p{"CDF", "latency (ms)", "fraction of requests", true, false, {}};
    for (const auto& name : order)
      p.series.push_back(cdf_series(name, {1, 2, 3, 4, 5}));
    return render_svg({p});
  };
  const auto a = panel({"fcfs", "ladb", "srpt"});
  const auto b = panel({"srpt", "ladb", "fcfs"});
  const auto c = panel({"ladb"});
  for (const std::string p : {"fcfs", "ladb", "srpt"}) {
    const auto s = style_of(p);
    const auto want = s.color + "|" + s.dash;
    EXPECT_EQ(drawn(a, "data-series", p), want) << p;
    EXPECT_EQ(drawn(b, "data-series", p), want) << p;
    EXPECT_EQ(drawn(a, "data-legend", p), want) << p << "'s legend entry";
    EXPECT_EQ(drawn(b, "data-legend", p), want) << p << "'s legend entry";
  }
  EXPECT_EQ(drawn(c, "data-series", "ladb"), drawn(a, "data-series", "ladb"));
}

} // namespace
} // namespace metronome::sim
