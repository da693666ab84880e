#pragma once
// The examples' command-line parser (examples only; not part of the library). Every example is
// strict in the same way: an unknown option is named, a missing or malformed value is rejected
// (integers whole-string and within their range, choices from their list) with a message and
// exit status 2, and --help lists every option with its default and exits 0. A typo must never
// run a long job with a silently different setting.
//
//   cli::parser args("decode_loop", "one CSA layer in a decode loop");
//   args.integer("--steps", "N", "decode steps", steps, 0, 100000);   // the default is steps now
//   args.choice("--indexer", "indexer precision", precision, {{"f32", f32}, {"bf16", bf16}});
//   args.parse(argc, argv);
//
// Options take their value as the next argument ("--steps 8") or after '=' ("--steps=8"), so
// "--prompt -5" is the value -5 (rejected by its range), not an option. A repeated option is applied again (lists append).

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cli {

// Keeps a parameter out of template argument deduction (C++20's std::type_identity_t), so that
// parser::integer(…, target, 1, 1 << 17) takes its bounds in the type of `target`.
template <class T>
struct identity {
  using type = T;
};
template <class T>
using same_as = typename identity<T>::type;

// A value an option cannot take; the parser adds the option's name and exits with status 2.
// `item` is the part of the value that is wrong, when it is not all of it (see each_item).
struct bad_value : std::runtime_error {
  explicit bad_value(const std::string& message, std::string wrong_item = "")
      : std::runtime_error(message), item(std::move(wrong_item)) {}
  std::string item;
};

// All of `text` as an integer in [minimum, maximum]: digits with an optional '-', nothing else
// (std::atoll would read "12x" as 12 and "abc" as 0).
template <class Int>
Int integer(const std::string& text, Int minimum, Int maximum = std::numeric_limits<Int>::max()) {
  const std::size_t sign = !text.empty() && text[0] == '-' ? 1 : 0;
  if (text.size() == sign || text.find_first_not_of("0123456789", sign) != std::string::npos)
    throw bad_value("is not an integer");
  Int value{};
  // Digits only, so a parse failure is a value the type cannot hold: too large, or (unsigned)
  // negative.
  const bool parsed = std::from_chars(text.data(), text.data() + text.size(), value).ec == std::errc{};
  if (parsed && value >= minimum && value <= maximum) return value;
  const bool below = parsed ? value < minimum : sign == 1;
  const bool unbounded = maximum == std::numeric_limits<Int>::max();
  if (unbounded && !below) throw bad_value("is too large");
  throw bad_value("must be " + (unbounded ? "at least " + std::to_string(minimum)
                                          : "from " + std::to_string(minimum) + " to " + std::to_string(maximum)));
}

// Applies `keep` to each comma-separated item of `text` ("2,4,8"); a bad_value names the item.
template <class Keep>
void each_item(const std::string& text, Keep keep) {
  for (std::size_t begin = 0;;) {
    const std::size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma - begin);
    try {
      keep(item);
    } catch (const bad_value& e) {
      throw bad_value(e.what(), item);
    }
    if (comma == std::string::npos) return;
    begin = comma + 1;
  }
}

class parser {
 public:
  parser(std::string program, std::string about) : program_(std::move(program)), about_(std::move(about)) {}

  // "--name VALUE": `keep` parses the value and stores it (throwing bad_value when it cannot);
  // `fallback` is the default as --help shows it.
  void option(std::string name, std::string value_name, std::string help, std::string fallback,
              std::function<void(const std::string&)> keep) {
    options_.push_back({std::move(name), std::move(value_name), std::move(help), std::move(fallback), std::move(keep)});
  }

  // "--name" alone sets `target`.
  void flag(std::string name, std::string help, bool& target) {
    option(std::move(name), "", std::move(help), target ? "on" : "off",
           [&target](const std::string&) { target = true; });
  }

  // An integer in [minimum, maximum]; the default is `target`'s value now.
  template <class Int>
  void integer(std::string name, std::string value_name, std::string help, Int& target, same_as<Int> minimum,
               same_as<Int> maximum = std::numeric_limits<Int>::max()) {
    const std::string range = maximum == std::numeric_limits<Int>::max()
                                  ? ", at least " + std::to_string(minimum)
                                  : ", " + std::to_string(minimum) + " to " + std::to_string(maximum);
    option(std::move(name), std::move(value_name), help + range, std::to_string(target),
           [&target, minimum, maximum](const std::string& text) { target = cli::integer(text, minimum, maximum); });
  }

  // One of named values (e.g. {{"f32", precision::f32}, {"bf16", precision::bf16}}); the
  // default is the name of `target`'s value now.
  template <class T>
  void choice(std::string name, std::string help, T& target, std::vector<std::pair<std::string, T>> choices) {
    std::string names, fallback, listed_names;
    for (const auto& [choice_name, value] : choices) {
      names += (names.empty() ? "" : "|") + choice_name;
      listed_names += (listed_names.empty() ? "" : ", ") + choice_name;
      if (value == target) fallback = choice_name;
    }
    if (names.size() > 24) {  // too long for the name column: NAME there, the names in the text
      names = "NAME";
      help += "; one of " + listed_names;
    }
    option(std::move(name), names, std::move(help), fallback, [&target, choices](const std::string& text) {
      std::string listed;
      for (const auto& [choice_name, value] : choices) {
        if (text == choice_name) {
          target = value;
          return;
        }
        listed += (listed.empty() ? "" : ", ") + choice_name;
      }
      throw bad_value("must be one of " + listed);
    });
  }

  // A word that is not an option, in the order declared; optional ones come last.
  void positional(std::string name, std::string help, std::string& target, bool required = true) {
    positionals_.push_back({std::move(name), std::move(help), &target, required});
  }

  // Applies argv. --help (or -h) prints help() and exits 0; a bad command line exits 2 (fail).
  void parse(int argc, char** argv) {
    std::size_t given = 0;
    for (int k = 1; k < argc; ++k) {
      const std::string word = argv[k];
      if (word == "--help" || word == "-h") {
        std::fputs(help().c_str(), stdout);
        std::exit(0);
      }
      if (word.size() > 1 && word[0] == '-') {
        // "--stride=4" is "--stride 4" (an option name never holds '=').
        const std::size_t equals = word.find('=');
        const std::string name = word.substr(0, equals);
        const spec* found = nullptr;
        for (const spec& o : options_)
          if (o.name == name) found = &o;
        if (found == nullptr) fail("unknown option " + name);
        const bool takes_value = !found->value_name.empty();
        if (!takes_value && equals != std::string::npos) fail(name + " takes no value");
        if (takes_value && equals == std::string::npos && k + 1 >= argc)
          fail(name + " needs a value (" + found->value_name + ")");
        const std::string value = !takes_value ? "" : equals != std::string::npos ? word.substr(equals + 1) : argv[++k];
        try {
          found->keep(value);
        } catch (const bad_value& e) {
          fail(name + " '" + (e.item.empty() ? value : e.item) + "' " + e.what());
        }
      } else {
        if (given >= positionals_.size()) fail("unexpected argument '" + word + "'");
        *positionals_[given++].target = word;
      }
    }
    for (std::size_t p = given; p < positionals_.size(); ++p)
      if (positionals_[p].required) fail("missing " + positionals_[p].name);
  }

  // The message and the usage line on stderr, then exit status 2: for a bad command line,
  // including a combination of options only the example can judge.
  [[noreturn]] void fail(const std::string& message) const {
    std::fprintf(stderr, "%s: %s\n%s(--help lists the options and their defaults)\n", program_.c_str(),
                 message.c_str(), usage().c_str());
    std::exit(2);
  }

  std::string usage() const {
    std::vector<std::string> words;
    for (const positional_spec& p : positionals_) words.push_back(p.required ? p.name : "[" + p.name + "]");
    for (const spec& o : options_) words.push_back("[" + o.spelled() + "]");
    std::string text = "usage: " + program_, line = text;
    for (const std::string& word : words) {  // wrapped below 100 columns, continued under the first word
      if (line.size() + 1 + word.size() > 100) {
        line = std::string(8 + program_.size(), ' ');
        text += "\n" + line.substr(1);
      }
      line += " " + word;
      text += " " + word;
    }
    return text + "\n";
  }

  std::string help() const {
    std::vector<std::pair<std::string, std::string>> rows;
    for (const positional_spec& p : positionals_) rows.emplace_back(p.name, p.help);
    for (const spec& o : options_) rows.emplace_back(o.spelled(), o.help + " (default " + o.fallback + ")");
    rows.emplace_back("--help", "this text");
    // Names in a column of at most 26 characters (a longer one takes a line of its own), the
    // descriptions wrapped at word boundaries to end by column 100.
    constexpr std::size_t columns = 100, widest_name = 26;
    std::size_t width = 0;
    for (const auto& row : rows)
      if (row.first.size() <= widest_name) width = std::max(width, row.first.size());
    const std::size_t indent = 2 + width + 3;
    std::string text = usage() + "\n" + about_ + "\n\n";
    for (const auto& [left, right] : rows) {
      std::string line = "  " + left;
      if (left.size() > width) {
        text += line + "\n";
        line.clear();
      }
      line += std::string(indent - line.size(), ' ');
      bool first = true;
      for (const std::string& word : words_of(right)) {
        if (!first && line.size() + 1 + word.size() > columns) {
          text += line + "\n";
          line = std::string(indent, ' ');
          first = true;
        }
        line += (first ? "" : " ") + word;
        first = false;
      }
      text += line + "\n";
    }
    return text;
  }

 private:
  static std::vector<std::string> words_of(const std::string& text) {
    std::vector<std::string> words;
    std::string word;
    for (char c : text) {
      if (c == ' ' || c == '\n') {
        if (!word.empty()) words.push_back(word);
        word.clear();
      } else {
        word += c;
      }
    }
    if (!word.empty()) words.push_back(word);
    return words;
  }

  struct spec {
    std::string name, value_name, help, fallback;  // value_name empty: a flag
    std::function<void(const std::string&)> keep;
    std::string spelled() const { return value_name.empty() ? name : name + " " + value_name; }
  };
  struct positional_spec {
    std::string name, help;
    std::string* target;
    bool required;
  };
  std::string program_, about_;
  std::vector<spec> options_;
  std::vector<positional_spec> positionals_;
};

}  // namespace cli
