#pragma once
// Locale-independent text. Every number phasekv writes — CSV, JSON, SVG, tables, error messages —
// comes out the same under any global C or C++ locale: a host that set a comma-decimal locale
// (de_DE, fr_FR, …) for its own UI must still get files another program can parse. So nothing
// here uses printf-family formatting (it follows LC_NUMERIC) or a default-constructed stream
// (it takes the global C++ locale): streams are imbued with the classic "C" locale.

#include <cmath>
#include <iomanip>
#include <locale>
#include <sstream>
#include <string>

namespace phasekv::detail {

// An std::ostringstream that always formats as the "C" locale does.
class classic_stream : public std::ostringstream {
 public:
  classic_stream() { imbue(std::locale::classic()); }
};

// x with `precision` digits after the point, like printf's "%.<precision>f".
inline std::string fixed(double x, int precision) {
  classic_stream out;
  out << std::fixed << std::setprecision(precision) << x;
  return out.str();
}

// x with `precision` significant digits, like printf's "%.<precision>g".
inline std::string general(double x, int precision = 6) {
  classic_stream out;
  out << std::setprecision(precision) << x;
  return out.str();
}

// s right-aligned in a field of `width` characters (never truncated), like printf's "%<width>s".
inline std::string right(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

// x for a file: "nan", "inf", "-inf", or `precision` significant digits.
inline std::string format_number(double x, int precision = 10) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return general(x, precision);
}

// x as a JSON number (17 digits: a double round-trips), null when not finite.
inline std::string json_number(double x) { return std::isfinite(x) ? format_number(x, 17) : "null"; }

// s as a JSON string literal, control characters escaped.
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

// Free text as one CSV field (RFC 4180): quoted when it holds a comma or a quote, with quotes
// doubled; line breaks become spaces so a line-based reader cannot be derailed either.
inline std::string csv_field(const std::string& s) {
  std::string out;
  bool quote = false;
  for (char c : s) {
    if (c == '\n' || c == '\r') c = ' ';
    if (c == ',' || c == '"') quote = true;
    out += c;
    if (c == '"') out += '"';
  }
  return quote ? '"' + out + '"' : out;
}

}  // namespace phasekv::detail
