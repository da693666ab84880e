#pragma once
// A dependency-free SVG line plot for phase-sweep results: one polyline with markers and optional
// error bars per series, axes with ticks, a title and a legend. It exists so an evaluation run can
// leave a picture a person can open (any browser renders SVG) without Python or gnuplot; it is not
// a plotting library.
//
//   plot_series          a label, points (x, y, optional [low, high] error bar), a dashed flag
//   plot_axes            title, axis labels, ranges, ticks, boundary lines, size
//   svg_line_plot        the SVG document as a string
//   svg_escape           text made safe for SVG element content and attribute values
//   phase_sweep_series   a sweep_result as a series on an axis that several strides share
//
// Layout: data coordinates map linearly into the plot area,
//   px = left + (x − x_min)/(x_max − x_min)·plot_width,  py = top + (y_max − y)/(y_max − y_min)·plot_height,
// and points or error-bar ends outside [y_min, y_max] are clipped to it. Boundary lines (e.g. chunk
// boundaries) cross the whole plot area, darker than the grid and under the series. A point whose y is NaN is
// left out (the polyline joins its neighbours); a NaN low/high means no error bar. The legend
// sits to the right of the plot area (as wide as its longest label, at most half the picture),
// one row per series in the order given.

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/core/text.hpp"
#include "phasekv/diag/phase_sweep.hpp"

namespace phasekv::diag::plot {

struct plot_point {
  double x = 0.0;
  double y = 0.0;
  double low = std::numeric_limits<double>::quiet_NaN();   // error bar; NaN: none
  double high = std::numeric_limits<double>::quiet_NaN();
  bool hollow = false;  // an open marker (phase_sweep_series: a record that crosses a block boundary)
};

struct plot_series {
  std::string label;
  std::vector<plot_point> points;
  bool dashed = false;  // e.g. a control or baseline
};

struct plot_axes {
  std::string title;
  std::string x_label;
  std::string y_label;
  double x_min = 0.0, x_max = 1.0;
  double y_min = 0.0, y_max = 100.0;
  // Tick positions and labels; empty → round steps (0, 0.25, 0.5, … or 0, 20, 40, …).
  std::vector<std::pair<double, std::string>> x_ticks;
  std::vector<std::pair<double, std::string>> y_ticks;
  std::vector<double> x_boundaries;  // x of vertical boundary lines (outside [x_min, x_max]: left out)
  int width = 960;   // whole picture, pixels
  int height = 540;
  void validate() const {
    using phasekv::detail::require;
    require(std::isfinite(x_min) && std::isfinite(x_max) && x_max > x_min, "x_max", x_max,
            "must be finite and greater than x_min = " + phasekv::detail::general(x_min));
    require(std::isfinite(y_min) && std::isfinite(y_max) && y_max > y_min, "y_max", y_max,
            "must be finite and greater than y_min = " + phasekv::detail::general(y_min));
    require(width >= 400 && width <= 10000, "width", width, "must be in [400, 10000] pixels");
    require(height >= 250 && height <= 10000, "height", height, "must be in [250, 10000] pixels");
  }
};

// Escapes &, <, >, " and ' so any text is safe as element content or a quoted attribute value;
// control characters other than tab and newline (not allowed in XML 1.0) become spaces.
inline std::string svg_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += (c < 0x20 && c != '\t' && c != '\n') ? ' ' : static_cast<char>(c);
    }
  }
  return out;
}

namespace detail {

inline std::string svg_number(double x) { return phasekv::detail::fixed(x, 2); }

// Ticks at the multiples of a round step (1, 2, 2.5 or 5 × 10^k) inside [lo, hi], the smallest
// such step that gives at most 10: 0, 0.25, …, 2 on [−0.05, 2.05], never −0.05, 0.37, ….
inline std::vector<std::pair<double, std::string>> round_ticks(double lo, double hi) {
  const double span = hi - lo;
  double step = std::pow(10.0, std::floor(std::log10(span / 10.0)));
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (span / (step * m) <= 10.0) {
      step *= m;
      break;
    }
  }
  std::vector<std::pair<double, std::string>> ticks;
  const double slack = 1e-9 * span;  // k·step computed a hair outside [lo, hi] still counts
  for (double k = std::ceil((lo - slack) / step); k * step <= hi + slack; k += 1.0) {
    const double v = k * step == 0.0 ? 0.0 : k * step;  // no "-0"
    ticks.emplace_back(v, phasekv::detail::general(v));  // 6 significant digits: 0.3, not 0.30000000000000004
  }
  return ticks;
}

// `text` cut to at most `bytes` bytes at a UTF-8 character boundary, with "…" when cut.
inline std::string shortened(const std::string& text, std::size_t bytes) {
  if (text.size() <= bytes) return text;
  std::size_t end = bytes >= 3 ? bytes - 3 : 0;  // room for the ellipsis (3 bytes)
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "\xE2\x80\xA6";  // U+2026
}

// Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
inline const char* series_colour(std::size_t index) {
  static const char* const palette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                        "#E69F00", "#56B4E9", "#000000", "#F0E442"};
  return palette[index % (sizeof palette / sizeof palette[0])];
}

}  // namespace detail

// The SVG document (UTF-8, no external references). Throws config_error for bad axes.
inline std::string svg_line_plot(const std::vector<plot_series>& series, const plot_axes& axes) {
  axes.validate();
  using detail::svg_number;
  // The legend's width follows its longest label, at most half the picture: 8 px a character
  // bounds DejaVu Sans at 13 px (digits 8.3, lower case ~7.4 on average), and a label longer than
  // the legend holds is shortened with an ellipsis rather than run off the edge.
  constexpr double char_px = 8.0, sample_px = 36.0, gap_px = 20.0;
  const double left = 80, top = 50, bottom_margin = 70;
  const auto label_room = static_cast<std::size_t>((0.5 * axes.width - gap_px - sample_px - 4.0) / char_px);
  std::vector<std::string> labels;
  std::size_t longest = 0;
  for (const plot_series& one : series) {
    labels.push_back(detail::shortened(one.label, label_room));
    longest = std::max(longest, labels.back().size());
  }
  const double right_margin = gap_px + sample_px + 4.0 + char_px * static_cast<double>(longest);
  const double plot_width = axes.width - left - right_margin, plot_height = axes.height - top - bottom_margin;
  auto px = [&](double x) { return left + (x - axes.x_min) / (axes.x_max - axes.x_min) * plot_width; };
  auto py = [&](double y) {
    const double clipped = std::min(axes.y_max, std::max(axes.y_min, y));
    return top + (axes.y_max - clipped) / (axes.y_max - axes.y_min) * plot_height;
  };

  phasekv::detail::classic_stream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << axes.width << "\" height=\"" << axes.height
      << "\" viewBox=\"0 0 " << axes.width << ' ' << axes.height
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"13\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << svg_number(axes.width / 2.0) << "\" y=\"28\" text-anchor=\"middle\" font-size=\"17\">"
      << svg_escape(axes.title) << "</text>\n";

  // Grid and ticks.
  const auto y_ticks = axes.y_ticks.empty() ? detail::round_ticks(axes.y_min, axes.y_max) : axes.y_ticks;
  const auto x_ticks = axes.x_ticks.empty() ? detail::round_ticks(axes.x_min, axes.x_max) : axes.x_ticks;
  for (const auto& [value, label] : y_ticks) {
    const double y = py(value);
    out << "<line x1=\"" << svg_number(left) << "\" y1=\"" << svg_number(y) << "\" x2=\"" << svg_number(left + plot_width)
        << "\" y2=\"" << svg_number(y) << "\" stroke=\"#dddddd\"/>\n"
        << "<text x=\"" << svg_number(left - 8) << "\" y=\"" << svg_number(y + 4) << "\" text-anchor=\"end\">"
        << svg_escape(label) << "</text>\n";
  }
  for (const auto& [value, label] : x_ticks) {
    const double x = px(value);
    out << "<line x1=\"" << svg_number(x) << "\" y1=\"" << svg_number(top) << "\" x2=\"" << svg_number(x) << "\" y2=\""
        << svg_number(top + plot_height) << "\" stroke=\"#eeeeee\"/>\n"
        << "<text x=\"" << svg_number(x) << "\" y=\"" << svg_number(top + plot_height + 18)
        << "\" text-anchor=\"middle\">" << svg_escape(label) << "</text>\n";
  }
  for (double value : axes.x_boundaries) {
    if (!(value >= axes.x_min && value <= axes.x_max)) continue;  // NaN too
    const double x = px(value);
    out << "<line class=\"boundary\" x1=\"" << svg_number(x) << "\" y1=\"" << svg_number(top) << "\" x2=\""
        << svg_number(x) << "\" y2=\"" << svg_number(top + plot_height)
        << "\" stroke=\"#888888\" stroke-width=\"1.5\"/>\n";
  }
  out << "<rect x=\"" << svg_number(left) << "\" y=\"" << svg_number(top) << "\" width=\"" << svg_number(plot_width)
      << "\" height=\"" << svg_number(plot_height) << "\" fill=\"none\" stroke=\"#333333\"/>\n"
      << "<text x=\"" << svg_number(left + plot_width / 2) << "\" y=\"" << svg_number(axes.height - 20)
      << "\" text-anchor=\"middle\">" << svg_escape(axes.x_label) << "</text>\n"
      << "<text transform=\"translate(22 " << svg_number(top + plot_height / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << svg_escape(axes.y_label) << "</text>\n";

  // Series: error bars, then the line, then markers on top.
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* colour = detail::series_colour(s);
    const plot_series& one = series[s];
    out << "<g stroke=\"" << colour << "\" fill=\"" << colour << "\">\n";
    std::string points;
    for (const plot_point& p : one.points) {
      if (std::isnan(p.y) || !std::isfinite(p.x)) continue;
      const double x = px(p.x);
      if (std::isfinite(p.low) && std::isfinite(p.high)) {
        const double y0 = py(p.low), y1 = py(p.high);
        out << "<path d=\"M" << svg_number(x) << ' ' << svg_number(y0) << "V" << svg_number(y1) << "M"
            << svg_number(x - 4) << ' ' << svg_number(y0) << "h8M" << svg_number(x - 4) << ' ' << svg_number(y1)
            << "h8\" fill=\"none\" stroke-width=\"1.2\" opacity=\"0.7\"/>\n";
      }
      points += svg_number(x) + ',' + svg_number(py(p.y)) + ' ';
    }
    out << "<polyline points=\"" << points << "\" fill=\"none\" stroke-width=\"2\""
        << (one.dashed ? " stroke-dasharray=\"7 5\"" : "") << "/>\n";
    for (const plot_point& p : one.points) {
      if (std::isnan(p.y) || !std::isfinite(p.x)) continue;
      out << "<circle cx=\"" << svg_number(px(p.x)) << "\" cy=\"" << svg_number(py(p.y)) << "\" r=\"3.5\""
          << (p.hollow ? " fill=\"#ffffff\" stroke-width=\"1.5\"" : "") << "/>\n";
    }
    out << "</g>\n";
  }

  // Legend.
  const double legend_x = left + plot_width + gap_px;
  for (std::size_t s = 0; s < series.size(); ++s) {
    const double y = top + 12 + 22.0 * static_cast<double>(s);
    const char* colour = detail::series_colour(s);
    out << "<line x1=\"" << svg_number(legend_x) << "\" y1=\"" << svg_number(y) << "\" x2=\"" << svg_number(legend_x + 28)
        << "\" y2=\"" << svg_number(y) << "\" stroke=\"" << colour << "\" stroke-width=\"2\""
        << (series[s].dashed ? " stroke-dasharray=\"7 5\"" : "") << "/>\n"
        << "<circle cx=\"" << svg_number(legend_x + 14) << "\" cy=\"" << svg_number(y) << "\" r=\"3.5\" fill=\""
        << colour << "\"/>\n"
        << "<text x=\"" << svg_number(legend_x + sample_px) << "\" y=\"" << svg_number(y + 4) << "\">"
        << svg_escape(labels[s]) << "</text>\n";
  }
  out << "</svg>\n";
  return out.str();
}

// A phase sweep's accuracy (%) by residue with its 95% interval, at x = (residue + 1) / stride:
// how far the target's chunk is filled once the target is written, in strides. Chunks start at
// multiples of the stride (phase = residue mod stride), so the chunk boundaries are the whole
// numbers 0, 1, … M/S for every stride, and the boundary phase S − 1 — the token that completes
// a chunk, where pooling's weak spot sits — lands ON them, whatever S is: sweeps of different
// strides line up where they differ most. (x = residue / S would put that phase at 1 − 1/S,
// a different place for every stride.) Draw the boundaries with plot_axes::x_boundaries.
// Residues the plan left out (sweep_config::layout) have no point. `profile` "contained" or
// "straddle" keeps only the residues whose record has that layout (the within-window profile and
// the split-record one, as sweep_result::profiles); "all" keeps every planned residue. Residues
// whose record crosses a block boundary get open markers, so one line shows both profiles.
inline plot_series phase_sweep_series(const sweep_result& result, std::string label, const std::string& profile = "all") {
  phasekv::detail::require<input_error>(profile == "all" || profile == "contained" || profile == "straddle",
                                        "phase_sweep_series: profile", profile,
                                        "must be all, contained or straddle");
  plot_series series;
  series.label = std::move(label);
  const double stride = static_cast<double>(result.config.stride);
  for (const residue_outcome& row : result.residues) {
    const bool contained = row.layout == layout_class::contained;
    if (row.planned == 0 || (profile == "contained" && !contained) || (profile == "straddle" && contained)) continue;
    series.points.push_back({static_cast<double>(row.residue + 1) / stride, 100.0 * row.estimate, 100.0 * row.ci_low,
                             100.0 * row.ci_high, !contained});
  }
  return series;
}

}  // namespace phasekv::diag::plot
