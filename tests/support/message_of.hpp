#pragma once
// The what() of the exception of type Error that f throws, or a note saying what happened
// instead — so a test can match the message that names the field and value, and a wrong
// exception type or no exception at all shows up in the failure.

#include <exception>
#include <string>

namespace phasekv_test {

template <class Error, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<wrong exception type: ") + e.what() + ">";
  }
  return "<no exception>";
}

}  // namespace phasekv_test
