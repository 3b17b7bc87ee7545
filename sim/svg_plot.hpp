#pragma once
// Small SVG line charts for replay reports: latency CDFs per policy and P95
// latency against load. No dependencies; the output opens in any browser.

#include <string>
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
