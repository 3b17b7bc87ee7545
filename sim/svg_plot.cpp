#include "sim/svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace metronome::sim {

namespace {

constexpr int panel_w = 560;
constexpr int panel_h = 380;
constexpr int margin_l = 70;
constexpr int margin_r = 20;
constexpr int margin_t = 36;
constexpr int margin_b = 50;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string tick_label(double v) {
  if (v == 0)
    return "0";
  if (std::abs(v) >= 1000 || std::abs(v) < 0.01)
    return fmt::format("{:.3g}", v);
  return fmt::format("{:.4g}", v);
}

/// "Nice" tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, bool log) {
  std::vector<double> out;
  if (log) {
    for (double e = std::floor(std::log10(lo)); e <= std::ceil(std::log10(hi)); e += 1) {
      const double v = std::pow(10.0, e);
      if (v >= lo * 0.999 && v <= hi * 1.001)
        out.push_back(v);
    }
    if (out.size() < 2)
      out = {lo, hi};
    return out;
  }
  const double span = hi - lo;
  const double raw = span / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    out.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return out;
}

void render_panel(std::ostringstream& os, const plot_panel& p, int ox, int oy) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : p.series)
    for (auto [x, y] : s.points) {
      if ((p.log_x && x <= 0) || (p.log_y && y <= 0))
        continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  os << fmt::format("<g transform=\"translate({},{})\">\n", ox, oy);
  os << fmt::format("<text x=\"{}\" y=\"20\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
                    margin_l, escape(p.title));
  if (x0 > x1) {
    os << "<text x=\"100\" y=\"100\">no data</text></g>\n";
    return;
  }
  if (!p.log_y && y0 > 0)
    y0 = 0;
  if (x1 == x0)
    x1 = x0 + 1;
  if (y1 == y0)
    y1 = y0 + 1;
  if (p.log_x) {
    x0 = std::pow(10.0, std::floor(std::log10(x0)));
    x1 = std::pow(10.0, std::ceil(std::log10(x1)));
  }
  if (p.log_y) {
    y0 = std::pow(10.0, std::floor(std::log10(y0)));
    y1 = std::pow(10.0, std::ceil(std::log10(y1)));
  }
  const int w = panel_w - margin_l - margin_r, h = panel_h - margin_t - margin_b;
  auto fx = [&](double x) {
    const double t = p.log_x ? (std::log10(x) - std::log10(x0)) / (std::log10(x1) - std::log10(x0))
                             : (x - x0) / (x1 - x0);
    return margin_l + t * w;
  };
  auto fy = [&](double y) {
    const double t = p.log_y ? (std::log10(y) - std::log10(y0)) / (std::log10(y1) - std::log10(y0))
                             : (y - y0) / (y1 - y0);
    return margin_t + (1 - t) * h;
  };
  os << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" "
                    "stroke=\"#444\"/>\n",
                    margin_l, margin_t, w, h);
  for (double t : ticks(x0, x1, p.log_x)) {
    const double x = fx(t);
    os << fmt::format("<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                      "<text x=\"{0:.1f}\" y=\"{3}\" font-size=\"11\" "
                      "text-anchor=\"middle\">{4}</text>\n",
                      x, margin_t, margin_t + h, margin_t + h + 16, tick_label(t));
  }
  for (double t : ticks(y0, y1, p.log_y)) {
    const double y = fy(t);
    os << fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>"
                      "<text x=\"{3}\" y=\"{4:.1f}\" font-size=\"11\" "
                      "text-anchor=\"end\">{5}</text>\n",
                      margin_l, margin_l + w, y, margin_l - 6, y + 4, tick_label(t));
  }
  os << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n",
                    margin_l + w / 2, panel_h - 10, escape(p.x_label));
  os << fmt::format("<text transform=\"translate(16,{}) rotate(-90)\" font-size=\"12\" "
                    "text-anchor=\"middle\">{}</text>\n",
                    margin_t + h / 2, escape(p.y_label));
  for (size_t i = 0; i < p.series.size(); ++i) {
    const auto& s = p.series[i];
    const auto style = style_of(s.label);
    const auto label = escape(s.label);
    const auto dash
      = style.dash.empty() ? std::string() : fmt::format(" stroke-dasharray=\"{}\"", style.dash);
    std::string path;
    for (auto [x, y] : s.points) {
      if ((p.log_x && x <= 0) || (p.log_y && y <= 0))
        continue;
      path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "M" : " L", fx(x), fy(y));
    }
    os << fmt::format("<path data-series=\"{}\" d=\"{}\" fill=\"none\" stroke=\"{}\"{} "
                      "stroke-width=\"2\"/>\n",
                      label, path, style.color, dash);
    if (s.points.size() <= 20)
      for (auto [x, y] : s.points)
        if (!((p.log_x && x <= 0) || (p.log_y && y <= 0)))
          os << fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", fx(x),
                            fy(y), style.color);
    const int ly = margin_t + 16 + int(i) * 18;
    os << fmt::format("<line data-legend=\"{6}\" x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" "
                      "stroke=\"{3}\"{7} stroke-width=\"3\"/><text x=\"{4}\" y=\"{5}\" "
                      "font-size=\"12\">{6}</text>\n",
                      margin_l + 10, margin_l + 44, ly, style.color, margin_l + 50, ly + 4, label,
                      dash);
  }
  os << "</g>\n";
}

} // namespace

series_style style_of(std::string_view label) {
  struct fixed {
    std::string_view label, color, dash;
  };
  // The policies: distinct colours, and distinct dashes for a reader
  // without colour (a grey print, colour blindness).
  static constexpr fixed policies[] = {
    {"fcfs", "#1f77b4", ""},                // blue, solid
    {"ladb", "#d62728", "9,4"},             // red, dashed
    {"srpt", "#2ca02c", "2,3"},             // green, dotted
    {"ladb-literal", "#ff7f0e", "9,3,2,3"}, // orange, dash-dot
    {"srpt-literal", "#9467bd", "5,5"},     // purple, even dashes
  };
  for (const auto& p : policies)
    if (p.label == label)
      return {std::string(p.color), std::string(p.dash)};
  static constexpr std::string_view colors[] = {"#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
                                                "#17becf"};
  static constexpr std::string_view dashes[] = {"", "12,4", "1,4", "12,3,1,3,1,3"};
  uint64_t h = 0xcbf29ce484222325ull; // FNV-1a
  for (char c : label)
    h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return {std::string(colors[h % 5]), std::string(dashes[(h / 5) % 4])};
}

std::string render_svg(const std::vector<plot_panel>& panels, int columns) {
  columns = std::max(1, std::min<int>(columns, int(std::max<size_t>(panels.size(), 1))));
  const int rows = int((panels.size() + size_t(columns) - 1) / size_t(columns));
  std::ostringstream os;
  os << fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
                    "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" "
                    "fill=\"white\"/>\n",
                    columns * panel_w, std::max(rows, 1) * panel_h);
  for (size_t i = 0; i < panels.size(); ++i)
    render_panel(os, panels[i], int(i % size_t(columns)) * panel_w,
                 int(i / size_t(columns)) * panel_h);
  os << "</svg>\n";
  return os.str();
}

plot_series cdf_series(std::string label, std::vector<double> values, size_t max_points) {
  plot_series s{std::move(label), {}};
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n == 0)
    return s;
  const size_t stride = std::max<size_t>(1, n / max_points);
  for (size_t i = 0; i < n; i += stride)
    s.points.push_back({values[i], double(i + 1) / double(n)});
  s.points.push_back({values.back(), 1.0});
  return s;
}

std::vector<plot_panel> replay_panels(const std::vector<replay_result>& runs,
                                      const std::vector<nlohmann::json>& reports,
                                      double cdf_rate_scale) {
  std::vector<plot_panel> panels;
  const std::string trace = runs.empty() ? "" : runs.front().trace_name;
  plot_panel e2e{fmt::format("E2E latency CDF, {} x{}", trace, cdf_rate_scale),
                 "end-to-end latency (ms)", "fraction of requests", true, false, {}};
  plot_panel ttft{fmt::format("TTFT CDF, {} x{}", trace, cdf_rate_scale),
                  "time to first token (ms)", "fraction of requests", true, false, {}};
  for (const auto& r : runs) {
    if (r.rate_scale != cdf_rate_scale)
      continue;
    std::vector<double> e, t;
    for (const auto& q : r.requests)
      if (q.e2e_s >= 0) {
        e.push_back(q.e2e_s * 1e3);
        t.push_back(q.ttft_s * 1e3);
      }
    e2e.series.push_back(cdf_series(r.policy, e));
    ttft.series.push_back(cdf_series(r.policy, t));
  }
  panels.push_back(std::move(e2e));
  panels.push_back(std::move(ttft));
  std::map<double, int> scales;
  for (const auto& r : runs)
    scales[r.rate_scale] = 1;
  if (scales.size() > 1) {
    plot_panel pe{fmt::format("P95 E2E latency against load, {}", trace),
                  "rate scale (x the trace's arrival rate)", "P95 end-to-end latency (ms)", false,
                  true, {}};
    plot_panel pt{fmt::format("P95 TTFT against load, {}", trace),
                  "rate scale (x the trace's arrival rate)", "P95 time to first token (ms)", false,
                  true, {}};
    std::map<std::string, std::pair<plot_series, plot_series>> by_policy;
    std::vector<std::string> order;
    for (const auto& j : reports) {
      const std::string name = j["policy"];
      if (!by_policy.contains(name)) {
        order.push_back(name);
        by_policy[name] = {plot_series{name, {}}, plot_series{name, {}}};
      }
      by_policy[name].first.points.push_back({j["rate_scale"], j["e2e_ms"]["p95"]});
      by_policy[name].second.points.push_back({j["rate_scale"], j["ttft_ms"]["p95"]});
    }
    for (const auto& name : order) {
      auto [a, b] = by_policy[name];
      std::sort(a.points.begin(), a.points.end());
      std::sort(b.points.begin(), b.points.end());
      pe.series.push_back(std::move(a));
      pt.series.push_back(std::move(b));
    }
    panels.push_back(std::move(pe));
    panels.push_back(std::move(pt));
  }
  return panels;
}

} // namespace metronome::sim
