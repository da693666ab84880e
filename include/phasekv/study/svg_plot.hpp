#pragma once
// A dependency-free SVG line plot for phase-sweep results: per series, lines between neighbouring
// points, markers (filled or open) and optional error bars; axes with ticks, a title and a legend.
// It exists so an evaluation run leaves a picture a person can open (any browser renders SVG) or
// put in a paper, without Python or gnuplot; it is not a plotting library.
//
//   plot_series          a label, points (x, y, optional [low, high] error bar, open marker), dashed
//   plot_axes            title, axis labels, ranges, ticks, boundary lines, size, marker dodge
//   svg_line_plot        the SVG document as a string
//   svg_escape           text made safe for SVG element content and attribute values
//   format_p_value       "p=0.042", "p<1e-4", "p<1e-6": a p-value for a legend
//   phase_sweep_series   a sweep_result as a series on an axis that several strides share
//   phase_sweep_figure   the figure of several sweeps (examples/phase_sweep's phase_sweep.svg)
//
// Layout, top to bottom: the title (wrapped to the width), the plot area, the x tick labels, the
// x label (wrapped), then the legend — a key to the markers when any point is open (one row when
// it fits), and one entry per series, in as many columns as the width holds, each label wrapped to
// at most three lines —
// so nothing but the data is drawn in the plot area and no text leaves the picture at any size the
// axes allow. Text is measured with detail::text_width (an upper estimate for DejaVu Sans and
// Helvetica: 0.64 em a character); a height that leaves the plot area under 60 px throws.
//
// Data coordinates map linearly into the plot area inset by detail::inset_px (so a marker on
// y_max or y_min is not cut by the frame):
//   px = left + (x − x_min)/(x_max − x_min)·plot_width + dodge_s,
//   py = top + inset + (y_max − y)/(y_max − y_min)·(plot_height − 2·inset),
// and points or error-bar ends outside [y_min, y_max] are clipped to it. dodge_s = (s − (n−1)/2)·
// plot_axes::dodge_px shifts series s of n sideways, so series that share an x stay apart.
// Boundary lines (e.g. chunk boundaries) cross the whole plot area, darker than the grid and under
// the series. A series' line joins two consecutive points only when both are finite and filled: a
// NaN y (a missing point) or an open marker (phase_sweep_series: a record across a chunk boundary)
// breaks it, so no line runs across what is not measured alike. A NaN low/high means no error bar.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/detail/text.hpp"
#include "phasekv/study/sweep_result.hpp"

namespace phasekv::diag::plot {

struct plot_point {
  double x = 0.0;
  double y = 0.0;
  double low = std::numeric_limits<double>::quiet_NaN();   // error bar; NaN: none
  double high = std::numeric_limits<double>::quiet_NaN();
  bool hollow = false;  // an open marker, not joined by the line (phase_sweep_series: a record that crosses a block boundary)
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
  double dodge_px = 0.0;  // sideways distance between neighbouring series' markers, [0, 20] px
  // The legend's key to the markers, shown when some point is open.
  std::string filled_marker_meaning = "record within one chunk";
  std::string open_marker_meaning = "record across a chunk boundary (not joined)";
  void validate() const {
    using phasekv::detail::require;
    require(std::isfinite(x_min) && std::isfinite(x_max) && x_max > x_min, "x_max", x_max,
            "must be finite and greater than x_min = " + phasekv::detail::general(x_min));
    require(std::isfinite(y_min) && std::isfinite(y_max) && y_max > y_min, "y_max", y_max,
            "must be finite and greater than y_min = " + phasekv::detail::general(y_min));
    require(width >= 400 && width <= 10000, "width", width, "must be in [400, 10000] pixels");
    require(height >= 250 && height <= 10000, "height", height, "must be in [250, 10000] pixels");
    require(dodge_px >= 0.0 && dodge_px <= 20.0, "dodge_px", dodge_px, "must be in [0, 20] pixels");
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

// A p-value as a legend shows it: two significant digits from 0.001 up ("p=0.042", "p=0.5"),
// below that only its order of magnitude as a bound ("p<1e-3" … "p<1e-6"), and "p<1e-6" for
// anything smaller — a chi-square tail of 1e-63 says no more than 1e-6 does, and no less.
// NaN (no test): "p n/a".
inline std::string format_p_value(double p) {
  if (std::isnan(p)) return "p n/a";
  if (p >= 1e-3) return "p=" + phasekv::detail::general(std::min(p, 1.0), 2);
  for (int k = 4; k <= 6; ++k)
    if (p >= std::pow(10.0, -k)) return "p<1e-" + std::to_string(k - 1);
  return "p<1e-6";
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

// Characters of UTF-8 text (continuation bytes not counted).
inline std::size_t utf8_length(const std::string& text) {
  std::size_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

// The width the plot reserves for `text` at `font_px`: 0.64 em a character bounds DejaVu Sans
// (digits 0.636 em, lower case ~0.57 on average) and Helvetica, the fonts the SVG asks for.
inline double text_width(const std::string& text, double font_px) {
  return 0.64 * font_px * static_cast<double>(utf8_length(text));
}

// `text` cut to at most `bytes` bytes at a UTF-8 character boundary, with "…" when cut.
inline std::string shortened(const std::string& text, std::size_t bytes) {
  if (text.size() <= bytes) return text;
  std::size_t end = bytes >= 3 ? bytes - 3 : 0;  // room for the ellipsis (3 bytes)
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end) + "\xE2\x80\xA6";  // U+2026
}

// `text` cut to at most `width` pixels at `font_px` (whole characters, "…" when cut).
inline std::string fitted(const std::string& text, double width, double font_px) {
  if (text_width(text, font_px) <= width) return text;
  const auto chars = static_cast<std::size_t>(std::max(0.0, std::floor(width / (0.64 * font_px))));
  // Keep chars − 1 characters and the ellipsis.
  std::size_t end = 0, kept = 0;
  while (end < text.size() && kept + 1 < chars) {
    ++end;
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    ++kept;
  }
  return chars == 0 ? std::string() : text.substr(0, end) + "\xE2\x80\xA6";
}

// `text` in lines of at most `width` pixels at `font_px`, broken at spaces; at most `max_lines`
// lines, the last one shortened with "…" when the text does not fit. Empty text: no lines.
inline std::vector<std::string> wrapped(const std::string& text, double width, double font_px, std::size_t max_lines) {
  std::vector<std::string> words, lines;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t space = text.find(' ', at);
    const std::size_t end = space == std::string::npos ? text.size() : space;
    if (end > at) words.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  std::string line;
  for (std::size_t w = 0; w < words.size(); ++w) {
    const std::string candidate = line.empty() ? words[w] : line + ' ' + words[w];
    if (text_width(candidate, font_px) <= width || line.empty()) {
      line = candidate;
      continue;
    }
    if (lines.size() + 1 >= max_lines) {  // the last line takes the rest (and is shortened below)
      line = candidate;
      for (std::size_t rest = w + 1; rest < words.size(); ++rest) line += ' ' + words[rest];
      break;
    }
    lines.push_back(line);
    line = words[w];
  }
  if (!line.empty()) lines.push_back(line);
  for (std::string& one : lines) one = fitted(one, width, font_px);
  return lines;
}

// Okabe–Ito colours: distinguishable with the common colour-vision deficiencies.
inline const char* series_colour(std::size_t index) {
  static const char* const palette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                        "#E69F00", "#56B4E9", "#000000", "#F0E442"};
  return palette[index % (sizeof palette / sizeof palette[0])];
}

constexpr double font_px = 13.0;        // ticks, labels, legend
constexpr double title_font_px = 16.0;  // the title
constexpr double line_px = 17.0;        // one line of 13 px text
constexpr double title_line_px = 21.0;  // one line of the title
constexpr double outer_px = 10.0;       // blank border around everything
constexpr double inset_px = 8.0;        // y_max / y_min this far inside the frame: whole markers
constexpr double marker_px = 3.5;       // marker radius
constexpr double sample_px = 30.0;      // a legend entry's line sample
constexpr double column_gap_px = 24.0;  // between legend columns

// One legend entry: its sample (series index, or the filled / open marker key), its lines, and
// where it goes (x of its sample, its row).
struct legend_entry {
  enum class kind { series, filled_key, open_key } what = kind::series;
  std::size_t series = 0;
  std::vector<std::string> lines;
  double x = 0;
  std::size_t row = 0;
};

// Where everything goes; svg_line_plot draws it, the tests read it.
struct plot_layout {
  std::vector<std::string> title_lines, x_label_lines;
  std::string y_label;
  double left = 0, top = 0, plot_width = 0, plot_height = 0;
  double x_ticks_y = 0, x_label_y = 0, legend_y = 0;  // baselines of their first lines
  std::vector<legend_entry> legend;
  std::vector<std::size_t> legend_row_lines;  // lines of text in each legend row
  std::vector<std::pair<double, std::string>> x_ticks, y_ticks;

  double px(const plot_axes& axes, double x) const {
    return left + (x - axes.x_min) / (axes.x_max - axes.x_min) * plot_width;
  }
  double py(const plot_axes& axes, double y) const {
    const double clipped = std::min(axes.y_max, std::max(axes.y_min, y));
    return top + inset_px + (axes.y_max - clipped) / (axes.y_max - axes.y_min) * (plot_height - 2 * inset_px);
  }
  double dodge(const plot_axes& axes, std::size_t s, std::size_t n) const {
    return (static_cast<double>(s) - 0.5 * static_cast<double>(n - 1)) * axes.dodge_px;
  }
};

inline plot_layout layout_of(const std::vector<plot_series>& series, const plot_axes& axes) {
  plot_layout L;
  const double width = axes.width, height = axes.height, text_room = width - 2 * outer_px;
  L.title_lines = wrapped(axes.title, text_room, title_font_px, 3);
  L.y_ticks = axes.y_ticks.empty() ? round_ticks(axes.y_min, axes.y_max) : axes.y_ticks;
  L.x_ticks = axes.x_ticks.empty() ? round_ticks(axes.x_min, axes.x_max) : axes.x_ticks;
  for (auto& tick : L.y_ticks) tick.second = fitted(tick.second, 0.25 * width, font_px);

  double y_tick_px = 0;
  for (const auto& tick : L.y_ticks) y_tick_px = std::max(y_tick_px, text_width(tick.second, font_px));
  const double y_label_band = axes.y_label.empty() ? 0.0 : line_px + 4;
  L.left = outer_px + y_label_band + y_tick_px + 8;
  // The x tick labels are centred on their ticks: the outermost may reach past the plot area.
  double right_reach = 0;
  for (const auto& tick : L.x_ticks) {
    if (!(tick.first >= axes.x_min && tick.first <= axes.x_max)) continue;
    const double from_right = (axes.x_max - tick.first) / (axes.x_max - axes.x_min);
    right_reach = std::max(right_reach, 0.5 * text_width(tick.second, font_px) - from_right * (width - L.left));
  }
  const double right = outer_px + std::max(10.0, right_reach);
  L.plot_width = width - L.left - right;
  L.x_label_lines = wrapped(axes.x_label, text_room, font_px, 2);

  // The legend: the marker key (when a point is open), then one entry per series.
  bool any_open = false;
  for (const plot_series& one : series)
    for (const plot_point& p : one.points) any_open = any_open || (p.hollow && !std::isnan(p.y));
  // The key's two entries share a row when they fit side by side; the series follow in a grid of
  // as many columns as the widest label allows.
  const double entry_text_room = text_room - sample_px - 6;
  auto add = [&](legend_entry::kind kind, std::size_t index, const std::string& text, double text_px, double x,
                 std::size_t row) {
    legend_entry entry;
    entry.what = kind;
    entry.series = index;
    entry.lines = wrapped(text, text_px, font_px, 3);
    if (entry.lines.empty()) entry.lines.emplace_back();
    entry.x = x;
    entry.row = row;
    if (L.legend_row_lines.size() <= row) L.legend_row_lines.resize(row + 1, 1);
    L.legend_row_lines[row] = std::max(L.legend_row_lines[row], entry.lines.size());
    L.legend.push_back(std::move(entry));
  };
  std::size_t next_row = 0;
  if (any_open) {
    const std::string filled = "filled: " + axes.filled_marker_meaning, open = "open: " + axes.open_marker_meaning;
    const double filled_px = std::min(entry_text_room, text_width(filled, font_px));
    const double open_px = std::min(entry_text_room, text_width(open, font_px));
    const bool one_row = 2 * (sample_px + 6) + filled_px + column_gap_px + open_px <= text_room;
    add(legend_entry::kind::filled_key, 0, filled, filled_px, outer_px, 0);
    add(legend_entry::kind::open_key, 0, open, open_px,
        one_row ? outer_px + sample_px + 6 + filled_px + column_gap_px : outer_px, one_row ? 0 : 1);
    next_row = one_row ? 1 : 2;
  }
  double widest = 0;
  for (const plot_series& one : series) widest = std::max(widest, std::min(entry_text_room, text_width(one.label, font_px)));
  const double column_px = sample_px + 6 + widest;
  const std::size_t columns = std::max<std::size_t>(
      1, std::min<std::size_t>(series.size(), static_cast<std::size_t>(
                                                  std::floor((text_room + column_gap_px) / (column_px + column_gap_px)))));
  for (std::size_t s = 0; s < series.size(); ++s)
    add(legend_entry::kind::series, s, series[s].label, widest,
        outer_px + static_cast<double>(s % columns) * (column_px + column_gap_px), next_row + s / columns);
  double legend_px = 0;
  for (std::size_t lines : L.legend_row_lines) legend_px += static_cast<double>(lines) * line_px + 4;

  L.top = outer_px + static_cast<double>(L.title_lines.size()) * title_line_px + (L.title_lines.empty() ? 4 : 10);
  const double below = 8 + line_px                                                   // x tick labels
                       + static_cast<double>(L.x_label_lines.size()) * line_px + 6  // x label
                       + (L.legend.empty() ? 0.0 : legend_px + 6) + outer_px;
  L.plot_height = height - L.top - below;
  phasekv::detail::require(L.plot_height >= 60.0, "height", axes.height,
                           "leaves the plot area " + phasekv::detail::fixed(L.plot_height, 0) +
                               " px under its title, labels and legend (at least 60): make the picture taller");
  L.y_label = fitted(axes.y_label, L.plot_height, font_px);
  L.x_ticks_y = L.top + L.plot_height + 8 + font_px;
  L.x_label_y = L.x_ticks_y + 6 + line_px;
  L.legend_y = L.x_label_y + static_cast<double>(L.x_label_lines.size()) * line_px + 6;
  return L;
}

// <text> at (x, y) (the baseline), anchored start / middle / end.
inline std::string text_element(double x, double y, const char* anchor, double font, const std::string& text) {
  return "<text x=\"" + svg_number(x) + "\" y=\"" + svg_number(y) + "\" text-anchor=\"" + anchor +
         "\" font-size=\"" + svg_number(font) + "\">" + svg_escape(text) + "</text>\n";
}

}  // namespace detail

// The SVG document (UTF-8, no external references). Throws config_error for bad axes, or a
// height too small for the title, labels and legend.
inline std::string svg_line_plot(const std::vector<plot_series>& series, const plot_axes& axes) {
  axes.validate();
  using detail::svg_number;
  using detail::text_element;
  const detail::plot_layout L = detail::layout_of(series, axes);
  const double bottom = L.top + L.plot_height, right = L.left + L.plot_width;

  phasekv::detail::classic_stream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << axes.width << "\" height=\"" << axes.height
      << "\" viewBox=\"0 0 " << axes.width << ' ' << axes.height
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"13\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (std::size_t k = 0; k < L.title_lines.size(); ++k)
    out << text_element(axes.width / 2.0, detail::outer_px + detail::title_font_px + detail::title_line_px * static_cast<double>(k),
                        "middle", detail::title_font_px, L.title_lines[k]);

  // Grid and ticks.
  for (const auto& [value, label] : L.y_ticks) {
    if (!(value >= axes.y_min && value <= axes.y_max)) continue;
    const double y = L.py(axes, value);
    out << "<line x1=\"" << svg_number(L.left) << "\" y1=\"" << svg_number(y) << "\" x2=\"" << svg_number(right)
        << "\" y2=\"" << svg_number(y) << "\" stroke=\"#dddddd\"/>\n"
        << text_element(L.left - 8, y + 4, "end", detail::font_px, label);
  }
  for (const auto& [value, label] : L.x_ticks) {
    if (!(value >= axes.x_min && value <= axes.x_max)) continue;
    const double x = L.px(axes, value);
    out << "<line x1=\"" << svg_number(x) << "\" y1=\"" << svg_number(L.top) << "\" x2=\"" << svg_number(x) << "\" y2=\""
        << svg_number(bottom) << "\" stroke=\"#eeeeee\"/>\n"
        << text_element(x, L.x_ticks_y, "middle", detail::font_px, label);
  }
  for (double value : axes.x_boundaries) {
    if (!(value >= axes.x_min && value <= axes.x_max)) continue;  // NaN too
    const double x = L.px(axes, value);
    out << "<line class=\"boundary\" x1=\"" << svg_number(x) << "\" y1=\"" << svg_number(L.top) << "\" x2=\""
        << svg_number(x) << "\" y2=\"" << svg_number(bottom) << "\" stroke=\"#888888\" stroke-width=\"1.5\"/>\n";
  }
  out << "<rect x=\"" << svg_number(L.left) << "\" y=\"" << svg_number(L.top) << "\" width=\"" << svg_number(L.plot_width)
      << "\" height=\"" << svg_number(L.plot_height) << "\" fill=\"none\" stroke=\"#333333\"/>\n";
  for (std::size_t k = 0; k < L.x_label_lines.size(); ++k)
    out << text_element(L.left + L.plot_width / 2, L.x_label_y + detail::line_px * static_cast<double>(k), "middle",
                        detail::font_px, L.x_label_lines[k]);
  if (!L.y_label.empty())
    out << "<text transform=\"translate(" << svg_number(detail::outer_px + detail::font_px) << ' '
        << svg_number(L.top + L.plot_height / 2) << ") rotate(-90)\" x=\"0\" y=\"0\" text-anchor=\"middle\" font-size=\""
        << svg_number(detail::font_px) << "\">" << svg_escape(L.y_label) << "</text>\n";

  // Series: error bars, then the lines, then markers on top. A line runs only between
  // consecutive finite, filled points.
  for (std::size_t s = 0; s < series.size(); ++s) {
    const char* colour = detail::series_colour(s);
    const plot_series& one = series[s];
    const double dodge = L.dodge(axes, s, series.size());
    out << "<g class=\"series\" stroke=\"" << colour << "\" fill=\"" << colour << "\">\n";
    auto drawn = [](const plot_point& p) { return !std::isnan(p.y) && std::isfinite(p.x); };
    for (const plot_point& p : one.points) {
      if (!drawn(p) || !std::isfinite(p.low) || !std::isfinite(p.high)) continue;
      const double x = L.px(axes, p.x) + dodge, y0 = L.py(axes, p.low), y1 = L.py(axes, p.high);
      out << "<path d=\"M" << svg_number(x) << ' ' << svg_number(y0) << "V" << svg_number(y1) << "M"
          << svg_number(x - 4) << ' ' << svg_number(y0) << "h8M" << svg_number(x - 4) << ' ' << svg_number(y1)
          << "h8\" fill=\"none\" stroke-width=\"1.2\" opacity=\"0.7\"/>\n";
    }
    std::string run;
    std::size_t run_points = 0;
    auto flush = [&] {
      if (run_points >= 2)
        out << "<polyline points=\"" << run << "\" fill=\"none\" stroke-width=\"2\""
            << (one.dashed ? " stroke-dasharray=\"7 5\"" : "") << "/>\n";
      run.clear();
      run_points = 0;
    };
    for (const plot_point& p : one.points) {
      if (!drawn(p) || p.hollow) {
        flush();
        continue;
      }
      run += (run.empty() ? "" : " ") + svg_number(L.px(axes, p.x) + dodge) + ',' + svg_number(L.py(axes, p.y));
      ++run_points;
    }
    flush();
    for (const plot_point& p : one.points) {
      if (!drawn(p)) continue;
      out << "<circle cx=\"" << svg_number(L.px(axes, p.x) + dodge) << "\" cy=\"" << svg_number(L.py(axes, p.y))
          << "\" r=\"" << svg_number(detail::marker_px) << "\""
          << (p.hollow ? " fill=\"#ffffff\" stroke-width=\"1.5\"" : "") << "/>\n";
    }
    out << "</g>\n";
  }

  // Legend, below the x label: the marker key, then the series, row by row.
  std::vector<double> row_y(L.legend_row_lines.size(), L.legend_y);
  for (std::size_t row = 1; row < row_y.size(); ++row)
    row_y[row] = row_y[row - 1] + static_cast<double>(L.legend_row_lines[row - 1]) * detail::line_px + 4;
  for (const detail::legend_entry& entry : L.legend) {
    const double x = entry.x, baseline = row_y[entry.row];
    const double y = baseline - 4;  // the sample sits at the first line's middle
    using kind = detail::legend_entry::kind;
    if (entry.what == kind::series) {
      const char* colour = detail::series_colour(entry.series);
      out << "<line x1=\"" << svg_number(x) << "\" y1=\"" << svg_number(y) << "\" x2=\"" << svg_number(x + detail::sample_px - 2)
          << "\" y2=\"" << svg_number(y) << "\" stroke=\"" << colour << "\" stroke-width=\"2\""
          << (series[entry.series].dashed ? " stroke-dasharray=\"7 5\"" : "") << "/>\n"
          << "<circle cx=\"" << svg_number(x + detail::sample_px / 2 - 1) << "\" cy=\"" << svg_number(y) << "\" r=\"3.5\" fill=\""
          << colour << "\" stroke=\"" << colour << "\"/>\n";
    } else {
      out << "<circle cx=\"" << svg_number(x + detail::sample_px / 2 - 1) << "\" cy=\"" << svg_number(y)
          << "\" r=\"3.5\" stroke=\"#333333\" stroke-width=\"1.5\" fill=\""
          << (entry.what == kind::open_key ? "#ffffff" : "#333333") << "\"/>\n";
    }
    for (std::size_t k = 0; k < entry.lines.size(); ++k)
      out << text_element(x + detail::sample_px + 6, baseline + detail::line_px * static_cast<double>(k), "start",
                          detail::font_px, entry.lines[k]);
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
// Residues the plan left out (sweep_config::layout) get a point with a NaN y: no marker, and the
// line breaks there. `profile` "contained" or "straddle" keeps only the residues whose record has
// that layout (the within-window profile and the split-record one, as sweep_result::profiles),
// the others becoming NaN points too; "all" keeps every planned residue. Residues whose record
// crosses a block boundary get open markers, which the line does not join: one series shows both
// profiles, and no line runs from a contained residue through a straddling one. A sweep without
// chunks of its own (a full-attention control classified against another stride's blocks) should
// clear `hollow` on every point: phase_sweep_figure does, for entries with chunked = false.
inline plot_series phase_sweep_series(const sweep_result& result, std::string label, const std::string& profile = "all") {
  phasekv::detail::require<input_error>(profile == "all" || profile == "contained" || profile == "straddle",
                                        "phase_sweep_series: profile", profile,
                                        "must be all, contained or straddle");
  plot_series series;
  series.label = std::move(label);
  const double stride = static_cast<double>(result.config.stride);
  for (const residue_outcome& row : result.residues) {
    const bool contained = row.layout == layout_class::contained;
    const double x = static_cast<double>(row.residue + 1) / stride;
    if (row.planned == 0 || (profile == "contained" && !contained) || (profile == "straddle" && contained)) {
      series.points.push_back({x, std::numeric_limits<double>::quiet_NaN()});
      continue;
    }
    series.points.push_back({x, 100.0 * row.estimate, 100.0 * row.ci_low, 100.0 * row.ci_high, !contained});
  }
  return series;
}

// One sweep of a figure: its legend label and whether its model has chunks (false: a
// full-attention control, drawn dashed and with filled markers only — it has no boundary to cross).
struct sweep_figure_entry {
  std::string label;
  const sweep_result* result = nullptr;
  bool chunked = true;
};

struct sweep_figure_options {
  std::string title;
  int width = 1100;
  int height = 640;
  double dodge_px = 4.0;  // series sharing a residue's x are drawn this far apart
};

// The phase-sweep figure: every sweep's accuracy by residue at x = (residue + 1) / S (so every
// stride's chunk boundaries fall on the whole numbers, drawn as lines), 95% Wilson bars, markers
// dodged sideways, filled for a record within one chunk and open for one across a boundary, and
// a legend whose entries state each sweep's finding in words: its accuracy within a chunk and
// across a boundary, its gap between best and worst residue and the homogeneity test's p-value
// (format_p_value). Throws input_error for an entry without a result.
inline std::string phase_sweep_figure(const std::vector<sweep_figure_entry>& entries, const sweep_figure_options& options) {
  std::vector<plot_series> series;
  double chunks = 1.0;  // the widest x range: M / S
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const sweep_figure_entry& entry = entries[i];
    phasekv::detail::require<input_error>(entry.result != nullptr, "phase_sweep_figure: entries[" + std::to_string(i) + "].result",
                                          "null", "must point to a sweep_result");
    const sweep_result& r = *entry.result;
    chunks = std::max(chunks, static_cast<double>(r.config.resolved_modulus()) / static_cast<double>(r.config.stride));
    std::string text = entry.label;
    if (!r.valid) {
      text += ": invalid sweep (" + r.invalid_reason + ")";
    } else {
      const profile_summary* within = r.profile("contained");
      const profile_summary* across = r.profile("straddle");
      const bool split = entry.chunked && within && across && !within->residues.empty() && !across->residues.empty() &&
                         std::isfinite(within->mean) && std::isfinite(across->mean);
      text += split ? ": " + phasekv::detail::fixed(100.0 * within->mean, 1) + "% within a chunk, " +
                          phasekv::detail::fixed(100.0 * across->mean, 1) + "% across a boundary"
                    : ": " + phasekv::detail::fixed(100.0 * r.all().mean, 1) + "% on average";
      text += "; gap " + phasekv::detail::fixed(r.all().gap_points, 1) + " pts, " + format_p_value(r.all().homogeneity.p_value);
    }
    plot_series one = phase_sweep_series(r, text);
    one.dashed = !entry.chunked;
    if (!entry.chunked)
      for (plot_point& p : one.points) p.hollow = false;
    series.push_back(std::move(one));
  }
  plot_axes axes;
  axes.title = options.title;
  axes.x_label = "Target's position across consecutive chunks, in chunk lengths (a chunk ends at each whole number)";
  axes.y_label = "Retrieval accuracy (%)";
  axes.x_min = -0.05;  // a margin, so the boundary lines stand clear of the frame
  axes.x_max = chunks + 0.05;
  for (double b = 0; b <= chunks; b += 1.0) axes.x_boundaries.push_back(b);
  axes.width = options.width;
  axes.height = options.height;
  axes.dodge_px = options.dodge_px;
  return svg_line_plot(series, axes);
}

}  // namespace phasekv::diag::plot
