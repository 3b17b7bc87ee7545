#pragma once
// Small SVG line charts for replay reports: latency CDFs per policy and P95
// latency against load. No dependencies; the output opens in any browser.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sim/replay.hpp"

namespace metronome::sim {

struct plot_series {
  std::string label;
  std::vector<std::pair<double, double>> points;
};

struct plot_panel {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_x = false;
  bool log_y = false;
  std::vector<plot_series> series;
};

/// How a series is drawn: a stroke colour ("#rrggbb") and an SVG
/// stroke-dasharray ("" for a solid line).
struct series_style {
  std::string color;
  std::string dash;
};

/// The style of the series labelled `label`. Each policy (fcfs, ladb, srpt,
/// ladb-literal, srpt-literal) has a fixed colour and dash pattern of its
/// own; any other label gets one picked by a hash of its text. The style
/// depends on the label alone, never on the order of the series, so a
/// policy looks the same in every plot. render_svg() draws each series,
/// its points and its legend entry with it.
series_style style_of(std::string_view label);

/// Renders panels in a grid of `columns` as one SVG document.
std::string render_svg(const std::vector<plot_panel>& panels, int columns = 2);

/// The empirical CDF of `values` (ms), at most `max_points` points.
plot_series cdf_series(std::string label, std::vector<double> values, size_t max_points = 400);

/// Panels for a set of replays: e2e and TTFT CDFs per policy at
/// `cdf_rate_scale`, and, when several rate scales were replayed, P95 e2e and
/// P95 TTFT against the rate scale per policy.
std::vector<plot_panel> replay_panels(const std::vector<replay_result>& runs,
                                      const std::vector<nlohmann::json>& reports,
                                      double cdf_rate_scale);

} // namespace metronome::sim
