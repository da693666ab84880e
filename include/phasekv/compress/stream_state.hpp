#pragma once
// The per-sequence state of one compressed stream between two appends: how many tokens and
// entries it has seen, and the inputs of the tokens a future entry still needs — at most the
// last W − 1.
//
// Tokens live in a ring of W + history rows, token t in row t mod rows, so appending one token
// writes one row and never shifts the others (history > 0 lets the state roll back). A state is
// a plain value: copying it forks the sequence.
//
// The rings hold fp32 whatever form the host gave its chunks in: bf16 inputs are widened into
// them, which is exact, so a state (and its snapshot) is the same for either form.

#include <cstdint>
#include <vector>

#include "phasekv/simd/prefetch.hpp"

namespace phasekv {

template <class Policy, class Arch>
class stream_compressor;
namespace detail {
struct snapshot_access;  // cache/snapshot.hpp
}

class stream_state {
 public:
  stream_state() = default;

  std::int64_t tokens() const noexcept { return tokens_; }    // tokens appended so far
  std::int64_t entries() const noexcept { return entries_; }  // entries emitted so far
  std::int64_t ring_rows() const noexcept { return ring_rows_; }  // tokens of inputs kept
  // Bytes this state holds (pending inputs and scratch), for memory accounting.
  std::size_t bytes() const noexcept {
    return (payload_ring_.capacity() + logit_ring_.capacity() + scratch_.capacity() + widened_.capacity()) *
               sizeof(float) +
           rows_.capacity() * sizeof(const float*) + rows_bf16_.capacity() * sizeof(const std::uint16_t*) +
           ahead_.capacity() * sizeof(simd::prefetch_row);
  }

  // Equal when the observable state is equal: counts and pending inputs (not scratch space).
  friend bool operator==(const stream_state& a, const stream_state& b) noexcept {
    return a.tokens_ == b.tokens_ && a.entries_ == b.entries_ && a.ring_rows_ == b.ring_rows_ &&
           a.intact_from_ == b.intact_from_ && a.host_fed_ == b.host_fed_ && a.payload_ring_ == b.payload_ring_ && a.logit_ring_ == b.logit_ring_;
  }
  friend bool operator!=(const stream_state& a, const stream_state& b) noexcept { return !(a == b); }

 private:
  template <class Policy, class Arch>
  friend class stream_compressor;
  friend struct detail::snapshot_access;  // saves and restores the counts and rings

  std::int64_t tokens_ = 0;
  std::int64_t entries_ = 0;
  std::int64_t ring_rows_ = 0;
  std::int64_t intact_from_ = 0;  // tokens [intact_from_, tokens_) still have their inputs in the ring
  // The last tokens came through skip() (host entries, no inputs kept): the state rolls back to
  // any length. Kept apart from intact_from_ = tokens_, which a rollback of a compressor-fed
  // state can also reach, and which must not make it rollable further.
  bool host_fed_ = false;
  // The geometry and per-token shape of the compressor that made the state (checked on append).
  std::int64_t stride_ = 0, origin_ = 0, window_ = 0, payload_floats_ = 0, logit_floats_ = 0;
  std::vector<float> payload_ring_;  // [ring_rows][payload floats per token]
  std::vector<float> logit_ring_;    // [ring_rows][logit floats per token]
  // Working memory of append(), kept here so a decode loop allocates nothing per token.
  std::vector<float> scratch_;
  std::vector<const float*> rows_;
  std::vector<const std::uint16_t*> rows_bf16_;  // bf16 payload and logit rows read in place
  std::vector<simd::prefetch_row> ahead_;        // the next entry's rows, to prefetch
  // bf16 chunk rows widened for an entry that also reads rows from the ring; allocated by the
  // first append that needs it (fp32-only hosts never pay for it).
  std::vector<float> widened_;
};

}  // namespace phasekv
