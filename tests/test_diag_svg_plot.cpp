// svg_plot: the document is well-formed enough for a browser (one root, balanced elements, one
// polyline per series, escaped text), points land where the linear map says, and bad axes throw;
// boundary lines cross the plot area, and a phase sweep's series lines strides up at the boundary.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "phasekv/diag/phase_sweep.hpp"
#include "phasekv/diag/svg_plot.hpp"

namespace {

std::size_t count(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// Every '<' opens a tag that closes with '>' before the next '<', and open/close tags balance
// (self-closing tags count as both) — a cheap stand-in for an XML parser.
bool tags_balance(const std::string& svg) {
  int depth = 0;
  std::size_t at = 0;
  while ((at = svg.find('<', at)) != std::string::npos) {
    const std::size_t end = svg.find('>', at);
    if (end == std::string::npos) return false;
    const std::size_t next = svg.find('<', at + 1);
    if (next != std::string::npos && next < end) return false;
    const std::string tag = svg.substr(at, end - at + 1);
    if (tag.compare(0, 2, "</") == 0) --depth;
    else if (tag.size() < 2 || tag[tag.size() - 2] != '/') ++depth;
    if (depth < 0) return false;
    at = end + 1;
  }
  return depth == 0;
}

}  // namespace

TEST_CASE("svg_line_plot draws one polyline per series in a balanced document", "[diag][svg_plot]") {
  using namespace phasekv::diag::plot;
  std::vector<plot_series> series(3);
  for (int s = 0; s < 3; ++s) {
    series[s].label = "series " + std::to_string(s);
    for (int r = 0; r < 4; ++r) series[s].points.push_back({r / 2.0, 20.0 * r + s, 10.0 * r, 30.0 * r + s});
  }
  series[2].dashed = true;
  plot_axes axes;
  axes.title = "accuracy";
  axes.x_max = 2.0;
  const std::string svg = svg_line_plot(series, axes);

  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") == svg.size() - 7);
  CHECK(count(svg, "<svg") == 1);
  CHECK(count(svg, "<polyline") == 3);
  CHECK(count(svg, "stroke-dasharray") == 2);  // the dashed series' line and its legend sample
  CHECK(count(svg, "series 1") == 1);
  CHECK(tags_balance(svg));
  // Markers: 12 points, plus 3 legend samples.
  CHECK(count(svg, "<circle") == 15);
}

TEST_CASE("svg_line_plot escapes text and leaves out NaN points", "[diag][svg_plot]") {
  using namespace phasekv::diag::plot;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  plot_series one;
  one.label = "S<4 & W>2 \"mean\" 'pool'";
  one.points = {{0.0, 50.0}, {0.5, nan}, {1.0, 75.0, nan, nan}};
  plot_axes axes;
  axes.title = "a < b";
  axes.x_label = "x & y";
  const std::string svg = svg_line_plot({one}, axes);

  CHECK(svg.find("S&lt;4 &amp; W&gt;2 &quot;mean&quot; &apos;pool&apos;") != std::string::npos);
  CHECK(svg.find("a &lt; b") != std::string::npos);
  CHECK(svg.find("x &amp; y") != std::string::npos);
  CHECK(svg.find("S<4") == std::string::npos);
  CHECK(tags_balance(svg));
  CHECK(count(svg, "<circle") == 2 + 1);  // two finite points and the legend sample
  CHECK(count(svg, "<path") == 0);        // no error bars were given
  CHECK(svg_escape("a\x01" "b") == "a b");
}

TEST_CASE("svg_line_plot maps data linearly into the plot area", "[diag][svg_plot]") {
  using namespace phasekv::diag::plot;
  plot_series one;
  one.label = "x";
  one.points = {{0.0, 0.0}, {1.0, 100.0}, {0.5, 150.0}};  // the last is clipped to y_max
  plot_axes axes;  // x in [0, 1], y in [0, 100]
  const std::string svg = svg_line_plot({one}, axes);
  const std::size_t at = svg.find("<polyline points=\"");
  REQUIRE(at != std::string::npos);
  const std::string points = svg.substr(at + 18, svg.find('"', at + 18) - at - 18);
  double x0, y0, x1, y1, x2, y2;
  REQUIRE(std::sscanf(points.c_str(), "%lf,%lf %lf,%lf %lf,%lf", &x0, &y0, &x1, &y1, &x2, &y2) == 6);
  CHECK(x0 == Approx(80.0));      // left margin
  CHECK(y1 == Approx(50.0));      // top margin: y_max
  CHECK(y0 > y1);                 // y grows downwards
  CHECK(x2 == Approx((x0 + x1) / 2));
  CHECK(y2 == Approx(y1));
}

TEST_CASE("svg_line_plot rejects empty ranges and tiny pictures", "[diag][svg_plot]") {
  using namespace phasekv::diag::plot;
  plot_axes axes;
  axes.x_max = axes.x_min;
  CHECK_THROWS_AS(svg_line_plot({}, axes), phasekv::config_error);
  axes = plot_axes{};
  axes.y_max = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(svg_line_plot({}, axes), phasekv::config_error);
  axes = plot_axes{};
  axes.width = 10;
  CHECK_THROWS_WITH(svg_line_plot({}, axes), Catch::Contains("width"));
  CHECK_NOTHROW(svg_line_plot({}, plot_axes{}));
}

TEST_CASE("svg_line_plot draws boundary lines across the plot area", "[diag][svg_plot]") {
  using namespace phasekv::diag::plot;
  plot_axes axes;  // the default picture: plot area x in [80, 960 − 60], y in [50, 540 − 70]
  axes.x_min = -0.5;
  axes.x_max = 2.5;
  axes.x_boundaries = {0, 1, 2, 3, std::numeric_limits<double>::quiet_NaN()};  // 3 and NaN: outside
  const std::string svg = svg_line_plot({}, axes);
  CHECK(tags_balance(svg));
  REQUIRE(count(svg, "<line class=\"boundary\"") == 3);
  std::size_t at = 0;
  for (int k = 0; k < 3; ++k) {
    at = svg.find("<line class=\"boundary\"", at + 1);
    double x1, y1, x2, y2;
    const char* format = "<line class=\"boundary\" x1=\"%lf\" y1=\"%lf\" x2=\"%lf\" y2=\"%lf\"";
    REQUIRE(std::sscanf(svg.c_str() + at, format, &x1, &y1, &x2, &y2) == 4);
    CHECK(x1 == Approx(80.0 + (k + 0.5) / 3.0 * (960.0 - 80.0 - 60.0)).margin(0.01));
    CHECK(x2 == x1);
    CHECK(y1 == Approx(50.0));   // top of the plot area
    CHECK(y2 == Approx(470.0));  // bottom
  }
  CHECK(count(svg_line_plot({}, plot_axes{}), "class=\"boundary\"") == 0);  // none unless asked for
}

TEST_CASE("phase_sweep_series puts every stride's boundary phase on the chunk boundaries", "[diag][svg_plot]") {
  using namespace phasekv::diag;
  for (const std::int64_t stride : {2, 4, 8}) {
    sweep_config config;
    config.stride = stride;  // modulus 2S
    config.trials_per_residue = 10;
    config.span = 1024;
    config.query_position = 2048;
    const sweep_result result = run_sweep(config, [](const placement& p) { return p.trial % 2 == 0; });
    const plot::plot_series series = plot::phase_sweep_series(result, "S=" + std::to_string(stride));
    CHECK(series.label == "S=" + std::to_string(stride));
    REQUIRE(series.points.size() == static_cast<std::size_t>(2 * stride));
    for (std::size_t r = 0; r < series.points.size(); ++r) {
      INFO("stride " << stride << ", residue " << r);
      const plot::plot_point& point = series.points[r];
      // Phase S − 1 completes a chunk: x is exactly 1 or 2 for every stride; the chunk's first
      // token (phase 0) is 1/S past the boundary before it.
      if (r % stride == static_cast<std::size_t>(stride - 1)) CHECK((point.x == 1.0 || point.x == 2.0));
      if (r % stride == 0) CHECK(point.x == Approx(static_cast<double>(r / stride) + 1.0 / stride));
      CHECK(point.y == Approx(100.0 * result.residues[r].estimate));
      CHECK(point.low == Approx(100.0 * result.residues[r].ci_low));
      CHECK(point.high == Approx(100.0 * result.residues[r].ci_high));
    }
    // The layout profiles split the residues: a two-token record is contained at phases 0 … S − 2.
    const plot::plot_series within = plot::phase_sweep_series(result, "contained", "contained");
    const plot::plot_series across = plot::phase_sweep_series(result, "straddle", "straddle");
    CHECK(within.points.size() == static_cast<std::size_t>(2 * (stride - 1)));
    CHECK(across.points.size() == 2u);
    for (const auto& point : across.points) CHECK((point.x == 1.0 || point.x == 2.0));
    for (const auto& point : across.points) CHECK(point.hollow);
    for (const auto& point : within.points) CHECK_FALSE(point.hollow);
    plot::plot_axes axes;
    axes.x_max = 2.0;
    const std::string svg = plot::svg_line_plot({series}, axes);
    CHECK(count(svg, "fill=\"#ffffff\"") == 2);  // the two straddling residues' open markers
  }
  sweep_config config;
  config.stride = 2;
  config.trials_per_residue = 10;
  config.span = 1024;
  config.query_position = 2048;
  const sweep_result result = run_sweep(config, [](const placement&) { return true; });
  CHECK_THROWS_AS(plot::phase_sweep_series(result, "x", "some"), phasekv::input_error);
}

// The tick labels a plot draws along one axis: the text of every <text> at the given y (x axis)
// or with text-anchor="end" (y axis), in order.
namespace {
namespace plot = phasekv::diag::plot;
std::vector<std::string> tick_texts(const std::string& svg, const std::string& marker) {
  std::vector<std::string> out;
  for (std::size_t at = svg.find(marker); at != std::string::npos; at = svg.find(marker, at + 1)) {
    const std::size_t open = svg.find('>', at), close = svg.find("</text>", at);
    out.push_back(svg.substr(open + 1, close - open - 1));
  }
  return out;
}
}  // namespace

TEST_CASE("svg_line_plot's default ticks are round steps inside the range", "[diag][svg_plot]") {
  using ticks = std::vector<std::pair<double, std::string>>;
  const auto labels = [](const ticks& t) {
    std::vector<std::string> out;
    for (const auto& one : t) out.push_back(one.second);
    return out;
  };
  using v = std::vector<std::string>;
  // The sweep plot's range: a margin of 0.05 either side of [0, M/S].
  CHECK(labels(plot::detail::round_ticks(-0.05, 2.05)) == v{"0", "0.25", "0.5", "0.75", "1", "1.25", "1.5", "1.75", "2"});
  CHECK(labels(plot::detail::round_ticks(-0.05, 4.05)) == v{"0", "0.5", "1", "1.5", "2", "2.5", "3", "3.5", "4"});
  CHECK(labels(plot::detail::round_ticks(0, 100)) == v{"0", "10", "20", "30", "40", "50", "60", "70", "80", "90", "100"});
  CHECK(labels(plot::detail::round_ticks(0, 0.3)) == v{"0", "0.05", "0.1", "0.15", "0.2", "0.25", "0.3"});
  CHECK(labels(plot::detail::round_ticks(-7, -3)) == v{"-7", "-6.5", "-6", "-5.5", "-5", "-4.5", "-4", "-3.5", "-3"});
  // Brute force over ranges: every tick is inside, a multiple of its step, 4 to 11 of them.
  for (double lo = -3.0; lo < 3.0; lo += 0.37)
    for (double width = 0.013; width < 900.0; width *= 1.7) {
      const ticks t = plot::detail::round_ticks(lo, lo + width);
      REQUIRE(t.size() >= 4);
      REQUIRE(t.size() <= 11);
      const double step = t[1].first - t[0].first;
      for (std::size_t k = 0; k < t.size(); ++k) {
        CHECK(t[k].first >= lo - 1e-9 * width);
        CHECK(t[k].first <= lo + width + 1e-9 * width);
        CHECK(std::fabs(t[k].first / step - std::round(t[k].first / step)) < 1e-6);
      }
    }
  plot::plot_axes axes;
  axes.x_min = -0.05;
  axes.x_max = 2.05;
  const std::string svg = plot::svg_line_plot({{"s", {{0.0, 50.0}, {1.0, 60.0}}, false}}, axes);
  CHECK(tick_texts(svg, "text-anchor=\"middle\">").size() >= 9);
  CHECK(svg.find(">-0.05<") == std::string::npos);
  CHECK(svg.find(">0.25<") != std::string::npos);
}

TEST_CASE("svg_line_plot keeps a long legend label inside the picture", "[diag][svg_plot]") {
  plot::plot_axes axes;
  axes.width = 600;
  const std::string long_label(400, 'x');
  const std::string multibyte = "S = 4 \xE2\x80\x94 " + std::string(200, 'y');  // an em dash
  for (const std::string& label : {long_label, multibyte}) {
    const std::string svg = plot::svg_line_plot({{label, {{0.0, 50.0}, {1.0, 60.0}}, false}}, axes);
    const std::size_t at = svg.rfind("<text x=\"");
    const double x = std::stod(svg.substr(at + 9));
    const std::size_t open = svg.find('>', at), close = svg.find("</text>", at);
    const std::string shown = svg.substr(open + 1, close - open - 1);
    CHECK(shown.size() < label.size());
    CHECK(shown.substr(shown.size() - 3) == "\xE2\x80\xA6");  // ends with an ellipsis
    CHECK(x + 8.0 * static_cast<double>(shown.size()) <= axes.width);  // 8 px bounds a 13 px character
    CHECK(label.compare(0, shown.size() - 3, shown, 0, shown.size() - 3) == 0);  // a prefix, whole characters
  }
  // A short label is drawn as it is, and the plot keeps the rest of the width.
  const std::string svg = plot::svg_line_plot({{"S = 4", {{0.0, 50.0}, {1.0, 60.0}}, false}}, axes);
  CHECK(svg.find(">S = 4</text>") != std::string::npos);
}
