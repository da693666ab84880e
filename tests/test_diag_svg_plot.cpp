// svg_plot: the document is well-formed enough for a browser (one root, balanced elements, one
// polyline per series, escaped text), points land where the linear map says, and bad axes throw;
// boundary lines cross the plot area, and a phase sweep's series lines strides up at the boundary.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <locale>
#include <sstream>
#include <string>
#include <vector>

#include "phasekv/study/phase_sweep.hpp"
#include "phasekv/study/svg_plot.hpp"

namespace test_diag_svg_plot {

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
  const auto layout = detail::layout_of({one}, axes);
  const std::size_t at = svg.find("<polyline points=\"");
  REQUIRE(at != std::string::npos);
  const std::string points = svg.substr(at + 18, svg.find('"', at + 18) - at - 18);
  double x0, y0, x1, y1, x2, y2;
  REQUIRE(std::sscanf(points.c_str(), "%lf,%lf %lf,%lf %lf,%lf", &x0, &y0, &x1, &y1, &x2, &y2) == 6);
  CHECK(x0 == Approx(layout.left));                       // x_min: the plot area's left edge
  CHECK(x1 == Approx(layout.left + layout.plot_width));   // x_max: its right edge
  CHECK(y1 == Approx(layout.top + detail::inset_px));     // y_max: inset from the top, whole markers
  CHECK(y0 == Approx(layout.top + layout.plot_height - detail::inset_px));
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
  plot_axes axes;
  axes.x_min = -0.5;
  axes.x_max = 2.5;
  axes.x_boundaries = {0, 1, 2, 3, std::numeric_limits<double>::quiet_NaN()};  // 3 and NaN: outside
  const std::string svg = svg_line_plot({}, axes);
  const auto layout = detail::layout_of({}, axes);
  CHECK(tags_balance(svg));
  REQUIRE(count(svg, "<line class=\"boundary\"") == 3);
  std::size_t at = 0;
  for (int k = 0; k < 3; ++k) {
    at = svg.find("<line class=\"boundary\"", at + 1);
    double x1, y1, x2, y2;
    const char* format = "<line class=\"boundary\" x1=\"%lf\" y1=\"%lf\" x2=\"%lf\" y2=\"%lf\"";
    REQUIRE(std::sscanf(svg.c_str() + at, format, &x1, &y1, &x2, &y2) == 4);
    CHECK(x1 == Approx(layout.left + (k + 0.5) / 3.0 * layout.plot_width).margin(0.01));
    CHECK(x2 == x1);
    CHECK(y1 == Approx(layout.top));                       // top of the plot area
    CHECK(y2 == Approx(layout.top + layout.plot_height));  // bottom
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
    // Every residue keeps its place; the other profile's residues are NaN points (the line breaks).
    const auto finite = [](const plot::plot_series& one) {
      std::vector<plot::plot_point> out;
      for (const auto& point : one.points)
        if (!std::isnan(point.y)) out.push_back(point);
      return out;
    };
    CHECK(within.points.size() == static_cast<std::size_t>(2 * stride));
    CHECK(finite(within).size() == static_cast<std::size_t>(2 * (stride - 1)));
    CHECK(finite(across).size() == 2u);
    for (const auto& point : finite(across)) CHECK((point.x == 1.0 || point.x == 2.0));
    for (const auto& point : finite(across)) CHECK(point.hollow);
    for (const auto& point : within.points) CHECK_FALSE(point.hollow);
    plot::plot_axes axes;
    axes.x_max = 2.0;
    const std::string svg = plot::svg_line_plot({series}, axes);
    CHECK(count(svg, "fill=\"#ffffff\"") == 2 + 1);  // the two straddling residues' open markers, the legend's key
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
  CHECK(tick_texts(svg, "text-anchor=\"middle\" font-size=\"13.00\">").size() >= 9);
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
    // The legend follows the series' group: its lines, joined, are the label's start and "…".
    std::string shown;
    for (std::size_t at = svg.find("<text x=\"", svg.rfind("</g>")); at != std::string::npos;
         at = svg.find("<text x=\"", at + 1)) {
      const double x = std::stod(svg.substr(at + 9));
      const std::size_t open = svg.find('>', at), close = svg.find("</text>", at);
      const std::string line = svg.substr(open + 1, close - open - 1);
      CHECK(x + plot::detail::text_width(line, plot::detail::font_px) <= axes.width);  // the code's own metric
      shown += (shown.empty() ? "" : " ") + line;
    }
    CHECK(shown.size() < label.size());
    CHECK(shown.substr(shown.size() - 3) == "\xE2\x80\xA6");  // ends with an ellipsis
    CHECK(label.compare(0, shown.size() - 3, shown, 0, shown.size() - 3) == 0);  // a prefix, whole characters
  }
  // A short label is drawn as it is, and the plot keeps the rest of the width.
  const std::string svg = plot::svg_line_plot({{"S = 4", {{0.0, 50.0}, {1.0, 60.0}}, false}}, axes);
  CHECK(svg.find(">S = 4</text>") != std::string::npos);
}

// ---- the demo's figure (examples/phase_sweep's phase_sweep.svg) -------------------------------------

namespace {

// A sweep shaped like the demo's: at stride S a record within one chunk is found in 9 of 10
// trials, one across a boundary in 1 of 10 (a p-value far below 1e-6); the control (no chunks,
// classified against S = 8's blocks) in every trial. `layout` contained leaves the straddling
// residues out of the plan: missing residues.
phasekv::diag::sweep_result demo_like_sweep(std::int64_t stride, bool control,
                                            phasekv::diag::layout_mode layout = phasekv::diag::layout_mode::any) {
  using namespace phasekv::diag;
  sweep_config config;
  config.stride = stride;
  config.window = control ? 0 : stride;
  config.trials_per_residue = 64;
  config.span = 120000;
  config.min_distance = 128;
  config.query_position = 131071;
  config.layout = layout;
  return run_sweep(config, [&](const placement& p) {
    if (control) return true;
    const bool contained = config.class_of_residue(p.residue) == layout_class::contained;
    return p.trial % 10 < (contained ? 9 : 1);
  });
}

std::string unescaped(std::string text) {
  const std::pair<const char*, const char*> entities[] = {
      {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}, {"&amp;", "&"}};
  for (const auto& [entity, plain] : entities)
    for (std::size_t at = text.find(entity); at != std::string::npos; at = text.find(entity, at + 1))
      text.replace(at, std::string(entity).size(), plain);
  return text;
}

double attribute(const std::string& tag, const std::string& name) {
  const std::size_t at = tag.find(" " + name + "=\"");
  REQUIRE(at != std::string::npos);
  return std::stod(tag.substr(at + name.size() + 3));
}

std::string string_attribute(const std::string& tag, const std::string& name) {
  const std::size_t at = tag.find(" " + name + "=\"");
  if (at == std::string::npos) return "";
  const std::size_t from = at + name.size() + 3;
  return tag.substr(from, tag.find('"', from) - from);
}

// Every <text>'s box by the plot's own metric (detail::text_width; from 1 em above the baseline
// to 0.3 em below), inside the canvas. A rotated text (the y label) is measured along y.
void check_texts_inside(const std::string& svg, double width, double height) {
  std::size_t texts = 0;
  for (std::size_t at = svg.find("<text "); at != std::string::npos; at = svg.find("<text ", at + 1)) {
    const std::size_t open = svg.find('>', at), close = svg.find("</text>", at);
    const std::string tag = svg.substr(at, open - at), content = unescaped(svg.substr(open + 1, close - open - 1));
    const double font = attribute(tag, "font-size"), w = plot::detail::text_width(content, font);
    const std::string anchor = string_attribute(tag, "text-anchor");
    const double shift = anchor == "middle" ? 0.5 * w : anchor == "end" ? w : 0.0;
    double x0, x1, y0, y1;
    const std::size_t rotated = tag.find("translate(");
    if (rotated != std::string::npos) {
      double tx = 0, ty = 0;
      REQUIRE(std::sscanf(tag.c_str() + rotated, "translate(%lf %lf) rotate(-90)", &tx, &ty) == 2);
      x0 = tx - font, x1 = tx + 0.3 * font, y0 = ty - w + shift, y1 = ty + shift;
    } else {
      const double x = attribute(tag, "x"), y = attribute(tag, "y");
      x0 = x - shift, x1 = x - shift + w, y0 = y - font, y1 = y + 0.3 * font;
    }
    INFO("text '" << content << "' at [" << x0 << ", " << x1 << "] x [" << y0 << ", " << y1 << "] in " << width << " x "
                  << height);
    CHECK(x0 >= 0.0);
    CHECK(x1 <= width);
    CHECK(y0 >= 0.0);
    CHECK(y1 <= height);
    ++texts;
  }
  CHECK(texts > 20);
}

// The <g class="series"> groups in order, each as its text.
std::vector<std::string> series_groups(const std::string& svg) {
  std::vector<std::string> out;
  for (std::size_t at = svg.find("<g class=\"series\""); at != std::string::npos;
       at = svg.find("<g class=\"series\"", at + 1))
    out.push_back(svg.substr(at, svg.find("</g>", at) - at));
  return out;
}

struct marker {
  double x, y, r;
  bool open;
};
std::vector<marker> markers(const std::string& group) {
  std::vector<marker> out;
  for (std::size_t at = group.find("<circle"); at != std::string::npos; at = group.find("<circle", at + 1)) {
    const std::string tag = group.substr(at, group.find("/>", at) - at);
    out.push_back({attribute(tag, "cx"), attribute(tag, "cy"), attribute(tag, "r"), tag.find("#ffffff") != std::string::npos});
  }
  return out;
}

std::vector<std::vector<std::pair<double, double>>> polylines(const std::string& group) {
  std::vector<std::vector<std::pair<double, double>>> out;
  for (std::size_t at = group.find("<polyline points=\""); at != std::string::npos;
       at = group.find("<polyline points=\"", at + 1)) {
    const std::size_t from = at + 18;
    std::string points = group.substr(from, group.find('"', from) - from);
    for (char& c : points) c = c == ',' ? ' ' : c;
    std::istringstream in(points);
    in.imbue(std::locale::classic());
    out.emplace_back();
    double x, y;
    while (in >> x >> y) out.back().emplace_back(x, y);
  }
  return out;
}

}  // namespace

TEST_CASE("format_p_value writes a legend's p: two digits, or a bound below 1e-3", "[diag][svg_plot]") {
  CHECK(plot::format_p_value(0.5) == "p=0.5");
  CHECK(plot::format_p_value(0.0421) == "p=0.042");
  CHECK(plot::format_p_value(1.0) == "p=1");
  CHECK(plot::format_p_value(0.001) == "p=0.001");
  CHECK(plot::format_p_value(0.000999) == "p<1e-3");
  CHECK(plot::format_p_value(3e-5) == "p<1e-4");
  CHECK(plot::format_p_value(2e-6) == "p<1e-5");
  CHECK(plot::format_p_value(1e-63) == "p<1e-6");
  CHECK(plot::format_p_value(0.0) == "p<1e-6");
  CHECK(plot::format_p_value(std::numeric_limits<double>::quiet_NaN()) == "p n/a");
}

TEST_CASE("the demo's figure at 800 and 1400 px keeps every text inside the canvas", "[diag][svg_plot]") {
  using namespace phasekv::diag;
  const std::vector<sweep_result> results = {demo_like_sweep(2, false), demo_like_sweep(4, false),
                                             demo_like_sweep(8, false), demo_like_sweep(8, true)};
  const std::vector<plot::sweep_figure_entry> entries = {{"mean S=2 W=2", &results[0], true},
                                                         {"mean S=4 W=4", &results[1], true},
                                                         {"mean S=8 W=8", &results[2], true},
                                                         {"full attention (control)", &results[3], false}};
  for (const int width : {800, 1400}) {
    INFO("width " << width);
    plot::sweep_figure_options options;
    // examples/phase_sweep's title at its default sizes.
    options.title = "Needle retrieval accuracy by the target's position in its chunk (131072 tokens, 16000 records, "
                    "64 trials per position, 95% Wilson intervals)";
    options.width = width;
    const std::string svg = plot::phase_sweep_figure(entries, options);
    CHECK(tags_balance(svg));
    check_texts_inside(svg, width, options.height);
    // No p-value in e-notation beyond a bound: the control is flat (p n/a or 1), the others p<1e-6.
    CHECK(svg.find("p=1e") == std::string::npos);
    CHECK(svg.find("e-63") == std::string::npos);
    CHECK(count(svg, "p&lt;1e-6") == 3);
    // The legend explains the markers and states each finding: within a chunk vs across a boundary.
    CHECK(svg.find("filled: record within one chunk") != std::string::npos);
    CHECK(svg.find("open: record across a chunk boundary") != std::string::npos);
    CHECK(count(svg, "% within a chunk, ") == 3);
    CHECK(count(svg, "% across a boundary") == 3);
    CHECK(svg.find("full attention (control): 100.0% on average") != std::string::npos);
    const auto groups = series_groups(svg);
    REQUIRE(groups.size() == 4);
    // Whole markers inside the frame: the y range is inset, so 100% is not cut.
    const std::size_t frame_at = svg.find("<rect x=\"");
    const std::string frame = svg.substr(frame_at, svg.find("/>", frame_at) - frame_at);
    const double left = attribute(frame, "x"), top = attribute(frame, "y");
    const double right = left + attribute(frame, "width"), bottom = top + attribute(frame, "height");
    std::vector<double> at_boundary;
    for (std::size_t s = 0; s < groups.size(); ++s) {
      INFO("series " << s);
      const auto ms = markers(groups[s]);
      for (const marker& m : ms) {
        CHECK(m.y - m.r >= top);
        CHECK(m.y + m.r <= bottom);
        CHECK(m.x - m.r >= left);
        CHECK(m.x + m.r <= right);
      }
      // The control has no chunks: no open markers; the chunked sweeps have two (S − 1, 2S − 1).
      CHECK(std::count_if(ms.begin(), ms.end(), [](const marker& m) { return m.open; }) == (s == 3 ? 0 : 2));
      // The markers on the boundary x = 2 (residue 2S − 1, the rightmost) of each series.
      at_boundary.push_back(std::max_element(ms.begin(), ms.end(), [](const marker& a, const marker& b) {
                              return a.x < b.x;
                            })->x);
    }
    // Dodged: series sharing the boundary residue's x are drawn at least 3 px apart.
    std::sort(at_boundary.begin(), at_boundary.end());
    for (std::size_t k = 1; k < at_boundary.size(); ++k) CHECK(at_boundary[k] - at_boundary[k - 1] >= 3.0);
  }
}

TEST_CASE("the demo's figure joins no line across a missing or straddling residue", "[diag][svg_plot]") {
  using namespace phasekv::diag;
  // Mean pooling at S = 2, 4, 8 with every residue, S = 4 with only the contained ones planned
  // (residues 3 and 7 missing), and the control.
  const std::vector<sweep_result> results = {demo_like_sweep(2, false), demo_like_sweep(4, false),
                                             demo_like_sweep(8, false),
                                             demo_like_sweep(4, false, layout_mode::contained),
                                             demo_like_sweep(8, true)};
  const std::int64_t strides[] = {2, 4, 8, 4, 8};
  std::vector<plot::sweep_figure_entry> entries;
  for (std::size_t k = 0; k < results.size(); ++k)
    entries.push_back({"sweep " + std::to_string(k), &results[k], k != 4});
  for (const int width : {800, 1400}) {
    plot::sweep_figure_options options;
    options.width = width;
    const std::string svg = plot::phase_sweep_figure(entries, options);
    check_texts_inside(svg, width, options.height);
    const std::size_t frame_at = svg.find("<rect x=\"");
    const std::string frame = svg.substr(frame_at, svg.find("/>", frame_at) - frame_at);
    // x runs over [-0.05, 2.05]: one residue step of stride S is plot_width / 2.1 / S pixels.
    const double plot_width = attribute(frame, "width");
    const auto groups = series_groups(svg);
    REQUIRE(groups.size() == results.size());
    for (std::size_t s = 0; s < groups.size(); ++s) {
      INFO("width " << width << ", series " << s << " (stride " << strides[s] << ")");
      const double step = plot_width / 2.1 / static_cast<double>(strides[s]);
      std::vector<double> open_x;
      for (const marker& m : markers(groups[s]))
        if (m.open) open_x.push_back(m.x);
      std::size_t segments = 0;
      for (const auto& line : polylines(groups[s])) {
        for (std::size_t k = 1; k < line.size(); ++k) {
          // Neighbouring residues only: a longer segment would span a missing residue.
          CHECK(line[k].first - line[k - 1].first == Approx(step).margin(0.02));
          ++segments;
        }
        for (const auto& point : line)
          for (double x : open_x) CHECK(std::fabs(point.first - x) > 0.5);  // no line touches an open marker
      }
      // Joined: S − 2 segments in each chunk for the chunked sweeps, 2S − 1 for the control.
      CHECK(segments == static_cast<std::size_t>(s == 4 ? 2 * strides[s] - 1 : 2 * (strides[s] - 2)));
      if (s == 3) CHECK(markers(groups[s]).size() == 6u);  // residues 3 and 7 not planned: no marker
    }
  }
}

TEST_CASE("svg_line_plot wraps a long title and refuses a picture too small for its legend", "[diag][svg_plot]") {
  plot::plot_axes axes;
  axes.width = 400;
  axes.title = std::string(30, 'a') + " " + std::string(30, 'b') + " " + std::string(30, 'c');
  const std::string svg = plot::svg_line_plot({{"s", {{0.0, 50.0}, {1.0, 100.0}}, false}}, axes);
  CHECK(count(svg, "font-size=\"16.00\"") == 3);  // three title lines
  check_texts_inside(svg, axes.width, axes.height);
  std::vector<plot::plot_series> many(40, plot::plot_series{"a series with a long name", {{0.0, 1.0}}, false});
  axes.height = 250;
  CHECK_THROWS_WITH(plot::svg_line_plot(many, axes), Catch::Contains("make the picture taller"));
  axes.dodge_px = 30;
  CHECK_THROWS_WITH(plot::svg_line_plot({}, axes), Catch::Contains("dodge_px"));
}

}  // namespace test_diag_svg_plot
