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
//
// A state writes and reads its own snapshot section (state_write, state_read; docs/SNAPSHOT.md,
// "Compressor state"), so its members stay its own business.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "phasekv/format/detail/byte_io.hpp"
#include "phasekv/core/error.hpp"
#include "phasekv/detail/simd/prefetch.hpp"

namespace phasekv {

template <class Policy, class Arch>
class stream_compressor;

class stream_state {
 public:
  stream_state() = default;

  std::int64_t tokens() const noexcept { return tokens_; }    // tokens appended so far
  std::int64_t entries() const noexcept { return entries_; }  // entries emitted so far
  std::int64_t ring_rows() const noexcept { return ring_rows_; }  // tokens of inputs kept
  // The last tokens came with entries the host computed (stream_compressor::skip): no inputs kept.
  bool host_fed() const noexcept { return host_fed_; }
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

  // ---- undo (a model step's all-or-nothing across layers) ------------------------------------------

  // What appending `tokens` more tokens changes: the counters and the ring rows commit() writes.
  struct undo_record {
    std::int64_t tokens = 0, entries = 0, intact_from = 0;
    bool host_fed = false;
    std::int64_t first = 0, count = 0;  // the tokens whose ring rows are saved: [first, first + count)
    std::vector<float> payload, logits;
  };
  // Saves into `u` what an append (or skip) of `tokens` tokens will overwrite. Allocates: call it
  // before anything changes (std::bad_alloc leaves the state as it was).
  void save(std::int64_t tokens, undo_record& u) const {
    u.tokens = tokens_;
    u.entries = entries_;
    u.intact_from = intact_from_;
    u.host_fed = host_fed_;
    const std::int64_t end = tokens_ + tokens;
    u.first = ring_rows_ > 0 ? std::max(tokens_, end - ring_rows_) : end;
    u.count = end - u.first;
    u.payload.resize(static_cast<std::size_t>(u.count * payload_floats_));
    u.logits.resize(static_cast<std::size_t>(u.count * logit_floats_));
    for (std::int64_t i = 0; i < u.count; ++i) {
      const std::int64_t row = (u.first + i) % ring_rows_;
      std::copy_n(payload_ring_.data() + row * payload_floats_, payload_floats_, u.payload.data() + i * payload_floats_);
      std::copy_n(logit_ring_.data() + row * logit_floats_, logit_floats_, u.logits.data() + i * logit_floats_);
    }
  }
  // Puts the state back as save() found it.
  void restore(const undo_record& u) noexcept {
    for (std::int64_t i = 0; i < u.count; ++i) {
      const std::int64_t row = (u.first + i) % ring_rows_;
      std::copy_n(u.payload.data() + i * payload_floats_, payload_floats_, payload_ring_.data() + row * payload_floats_);
      std::copy_n(u.logits.data() + i * logit_floats_, logit_floats_, logit_ring_.data() + row * logit_floats_);
    }
    tokens_ = u.tokens;
    entries_ = u.entries;
    intact_from_ = u.intact_from;
    host_fed_ = u.host_fed;
  }

  // ---- snapshots (docs/SNAPSHOT.md, "Compressor state") -------------------------------------------

  // The section: i64 tokens, entries, ring_rows, intact_from, then the fp32 payload ring and logit
  // ring, token t in row t mod ring_rows. host_fed() goes into the section table's flags word.
  static constexpr std::uint64_t saved_fields_bytes = 4 * 8;
  // Bytes state_write writes for a ring of `rows` rows of `floats_per_row` payload and logit floats.
  static std::uint64_t saved_bytes(std::uint64_t rows, std::uint64_t floats_per_row) noexcept {
    return saved_fields_bytes + rows * floats_per_row * sizeof(float);
  }
  std::uint64_t saved_bytes() const noexcept {
    return saved_fields_bytes + (payload_ring_.size() + logit_ring_.size()) * sizeof(float);
  }

  void state_write(byte_writer& w) const {
    w.i64(tokens_);
    w.i64(entries_);
    w.i64(ring_rows_);
    w.i64(intact_from_);
    w.floats(payload_ring_.data(), payload_ring_.size());
    w.floats(logit_ring_.data(), logit_ring_.size());
  }

  // The fields of a saved state, read before its rings; host_fed from the section's flags.
  struct saved_fields {
    std::int64_t tokens = 0, entries = 0, ring_rows = 0, intact_from = 0;
    bool host_fed = false;
  };
  static saved_fields read_fields(byte_reader& r, bool host_fed) {
    saved_fields f;
    f.tokens = r.i64();
    f.entries = r.i64();
    f.ring_rows = r.i64();
    f.intact_from = r.i64();
    f.host_fed = host_fed;
    return f;
  }
  // Throws input_error unless `f` is what a state writes for a sequence of `tokens` tokens and
  // `entries` entries in a ring of `ring_rows` rows (W + the source's history). where() starts
  // each message (called only on failure). Checked before anything is allocated.
  template <class Where>
  static void check_saved(const saved_fields& f, std::int64_t tokens, std::int64_t entries, std::int64_t ring_rows,
                          Where&& where) {
    if (f.tokens != tokens)
      detail::fail<input_error>(where() + "tokens", f.tokens, "must equal the sequence's " + std::to_string(tokens));
    if (f.entries != entries)
      detail::fail<input_error>(where() + "entries", f.entries,
                                "must equal completed_entries(" + std::to_string(tokens) + ") = " + std::to_string(entries));
    if (f.ring_rows != ring_rows)
      detail::fail<input_error>(where() + "ring_rows", f.ring_rows,
                                "must be window + history = " + std::to_string(ring_rows));
    // The ring holds at most its rows' worth of tokens. A state whose entries the host computed
    // may hold none of the inputs its next entry needs, up to intact_from = tokens: append() then
    // refuses to continue it (stream_compressor::continues).
    const std::int64_t lowest = std::max<std::int64_t>(0, tokens - f.ring_rows);
    if (f.intact_from < lowest || f.intact_from > tokens)
      detail::fail<input_error>(where() + "intact_from", f.intact_from,
                                "must lie in [" + std::to_string(lowest) + ", " + std::to_string(tokens) +
                                    "] (within the ring)");
    // A host-fed state (skip()) keeps no inputs: intact_from = tokens > 0.
    if (f.host_fed && (tokens == 0 || f.intact_from != tokens))
      detail::fail<input_error>(where() + "intact_from", f.intact_from,
                                "must equal tokens = " + std::to_string(tokens) + " > 0 in a host-fed state");
  }
  // Reads the rings of a saved state (its checked fields `f`; the reader just past them) into this
  // fresh state from the destination's compressor (make_state). Rings of another size are re-laid:
  // this one keeps the inputs it has room for, so it rolls back as far as both rings allow. With
  // equal rings the state equals the one saved (==).
  void state_read(byte_reader& r, const saved_fields& f) {
    if (payload_ring_.size() != static_cast<std::size_t>(ring_rows_ * payload_floats_) ||
        logit_ring_.size() != static_cast<std::size_t>(ring_rows_ * logit_floats_))
      throw input_error("stream_state::state_read: the state must come from its compressor's make_state()");
    tokens_ = f.tokens;
    entries_ = f.entries;
    host_fed_ = f.host_fed;
    intact_from_ = ring_rows_ == f.ring_rows ? f.intact_from : std::max(f.intact_from, f.tokens - ring_rows_);
    read_ring_rows(r, f.ring_rows, payload_ring_.data(), ring_rows_, payload_floats_, intact_from_, tokens_);
    read_ring_rows(r, f.ring_rows, logit_ring_.data(), ring_rows_, logit_floats_, intact_from_, tokens_);
  }

 private:
  template <class Policy, class Arch>
  friend class stream_compressor;

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
