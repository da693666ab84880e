// Locale independence: the sweep's table, CSV and JSON, the SVG plot and error messages are the
// same bytes under any global C++ locale and any C locale (detail/text.hpp). A host that sets a
// comma-decimal locale for its own UI must still write files other programs can parse.
//
// The C++ side uses a locale built here (',' as the decimal point, '.' grouping every three
// digits), so it runs everywhere. The C side needs a comma-decimal locale installed or compiled
// (scripts/test compiles de_DE.UTF-8 into build/locale and points LOCPATH there); without one
// that part is skipped with a warning.

#include <catch2/catch.hpp>

#include <clocale>
#include <cstdint>
#include <locale>
#include <string>
#include <vector>

#include "phasekv/core/error.hpp"
#include "phasekv/study/phase_sweep.hpp"
#include "phasekv/study/svg_plot.hpp"

namespace test_diag_locale {

namespace {

using namespace phasekv;
using namespace phasekv::diag;

struct comma_decimal : std::numpunct<char> {
  char do_decimal_point() const override { return ','; }
  char do_thousands_sep() const override { return '.'; }
  std::string do_grouping() const override { return "\3"; }
};

// Sets the global C++ locale and/or the C locale for a scope, and puts both back.
class locale_scope {
 public:
  locale_scope() : cpp_(std::locale()), c_(std::setlocale(LC_ALL, nullptr)) {}
  ~locale_scope() {
    std::locale::global(cpp_);
    std::setlocale(LC_ALL, c_.c_str());
  }
  locale_scope(const locale_scope&) = delete;
  locale_scope& operator=(const locale_scope&) = delete;

 private:
  std::locale cpp_;
  std::string c_;
};

// Everything phasekv writes as text, concatenated.
std::string everything_written() {
  sweep_config config;
  config.stride = 4;
  config.modulus = 8;
  config.trials_per_residue = 1500;  // counts above 1000 show any digit grouping
  config.span = 40000;
  config.min_distance = 1234;
  config.query_position = 65536;
  const auto result = run_sweep(config, [](const placement& p) {
    return static_cast<double>((p.target_position * 2654435761u) % 1000) / 999.0;  // fractional outcomes
  });
  plot::plot_series series;
  series.label = "mean S=4 W=4";
  series.points = {{0.0, 12.5, 10.0, 15.0}, {0.25, 33.333, 30.0, 36.5}, {0.5, 1234.5, 1200.25, 1300.75},
                   {1.75, 99.9, 90.0, 100.0}};
  plot::plot_axes axes;
  axes.title = "accuracy by residue";
  axes.x_min = -0.125;
  axes.x_max = 2.0;
  axes.y_min = 0.0;
  axes.y_max = 1500.5;
  std::string message;
  try {
    phasekv::detail::fail("field", 1234.5, "a fractional value in a message");
  } catch (const config_error& e) {
    message = e.what();
  }
  return to_table(result) + to_csv(result) + to_summary_csv(result) + to_json(result) +
         plot::svg_line_plot({series}, axes) + message;
}

// A comma-decimal C locale, if one is installed (or compiled into $LOCPATH).
const char* comma_c_locale() {
  for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "ru_RU.UTF-8", "de_DE"}) {
    if (std::setlocale(LC_ALL, name) != nullptr && std::localeconv()->decimal_point[0] == ',') return name;
  }
  return nullptr;
}

TEST_CASE("locale: the writers give the same bytes under a comma-decimal C++ locale", "[diag][locale]") {
  const std::string reference = everything_written();
  REQUIRE(reference.find("1234.5") != std::string::npos);  // the message's value, as written in C
  locale_scope restore;
  std::locale::global(std::locale(std::locale::classic(), new comma_decimal));
  REQUIRE(std::to_string(1) == "1");  // (sanity: the facet is in place for streams, not to_string)
  const std::string written = everything_written();
  REQUIRE(written.size() == reference.size());
  REQUIRE(written == reference);
}

TEST_CASE("locale: the writers give the same bytes under a comma-decimal C locale", "[diag][locale]") {
  const std::string reference = everything_written();
  locale_scope restore;
  const char* name = comma_c_locale();
  if (!name) {
    WARN("no comma-decimal C locale is installed (scripts/test compiles one); the C-locale half is skipped");
    return;
  }
  INFO("C locale " << name);
  std::locale::global(std::locale(std::locale::classic(), new comma_decimal));
  const std::string written = everything_written();
  REQUIRE(written == reference);
}

}  // namespace

}  // namespace test_diag_locale
