#pragma once
// The names nearly every test file uses unqualified, declared once: the library, Catch's Contains
// matcher, the signed count type, and the helpers of common.hpp and message_of.hpp. A test file's
// anonymous namespace opens with `using namespace phasekv_test::prelude;` and declares what else
// it uses itself.

#include <catch2/catch.hpp>

#include <cstdint>

#include "support/common.hpp"
#include "support/message_of.hpp"

namespace phasekv {}

namespace phasekv_test::prelude {

using namespace phasekv;
using Catch::Matchers::Contains;
using i64 = std::int64_t;

using phasekv_test::bit_equal;
using phasekv_test::bits_of;
using phasekv_test::float_of;
using phasekv_test::message_of;
using phasekv_test::pick;
using phasekv_test::pick_of;
using phasekv_test::sz;

}  // namespace phasekv_test::prelude
