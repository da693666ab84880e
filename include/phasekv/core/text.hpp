#pragma once
// Locale-independent text. Every number phasekv writes — CSV, JSON, SVG, tables, error messages —
// comes out the same under any global C or C++ locale: a host that set a comma-decimal locale
// (de_DE, fr_FR, …) for its own UI must still get files another program can parse. So nothing
// here uses printf-family formatting (it follows LC_NUMERIC) or a default-constructed stream
// (it takes the global C++ locale): streams are imbued with the classic "C" locale.

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

}  // namespace phasekv::detail
