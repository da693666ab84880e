// One DeepSeek-V4 CSA layer, the same inputs whatever the build: its entries (the write path), a
// read of the fp32 cache (f32 indexer) and a read of the V4-precision cache (FP8 entries, FP4
// indexer). Built twice by tests/CMakeLists.txt — for baseline x86-64 and for the build machine —
// as two programs, so that no inline function is shared between the two flag sets (one program
// with both would merge them). The first writes its results to a file; the second compares its own
// against them under the policy docs/PLATFORMS.md states:
//   - the FP4 indexer's scores, hence its selection, are the same bits (integer dot products);
//   - fp32 entries and read outputs may differ in the last bits (a vector width changes the order
//     of a sum): within 4e-6 of the largest value; V4-precision outputs within 1e-4 of it (an
//     entry a few ulp apart may round to the neighbouring FP8 code);
//   - the f32 indexer's selection may differ at near-ties: reported, not held.
//
//   march_probe write FILE      compute and write
//   march_probe compare FILE    compute, compare with FILE, print the largest differences; exit 1
//                               when the policy does not hold
#include <phasekv/phasekv.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

// Inputs from integers alone: the same floats under any flags (no <random> distribution, whose
// floating-point steps a compiler may contract differently).
struct lcg {
  std::uint64_t state;
  float next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<std::int64_t>(state >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  std::vector<float> values(std::size_t n) {
    std::vector<float> out(n);
    for (float& v : out) v = next();
    return out;
  }
};

struct results {
  std::vector<float> entries, read_f32, read_precision, scores_precision;
  std::vector<std::int32_t> selected_precision, selected_f32;
};

results compute() {
  using namespace phasekv;
  using csa = stream_compressor<presets::deepseek_v4_csa_policy>;
  namespace P = presets;
  const std::int64_t tokens = 4096;  // 1024 entries: the reader's top 512 selects among them
  lcg rng{42};
  const auto kv = rng.values(tokens * 2 * 512), kv_logits = rng.values(tokens * 2 * 512);
  const auto ix = rng.values(tokens * 2 * 128), ix_logits = rng.values(tokens * 2 * 128);
  const auto window = rng.values(tokens * 512);
  const auto queries = rng.values(64 * 512), indexer_queries = rng.values(64 * 128);
  std::vector<float> weights(64, 1.0f / 64), sinks(64, 0.5f);
  token_chunk kv_chunk{tokens, kv, kv_logits}, indexer_chunk{tokens, ix, ix_logits};

  results r;
  csa kv_compressor(P::deepseek_v4_csa_layer.geom, P::deepseek_kv_stream(P::deepseek_v4_csa_layer));
  stream_state state = kv_compressor.make_state();
  kv_compressor.append(state, kv_chunk, [&](const entry_view& e) {
    r.entries.insert(r.entries.end(), e.values, e.values + e.kv_heads * e.channels);
  });

  auto read = [&](const cache_config& cc, const reader_config& rc, std::vector<float>& out,
                  std::vector<std::int32_t>* selected, std::vector<float>* scores) {
    layer_compressor<csa, csa> layer(
        csa(P::deepseek_v4_csa_layer.geom, P::deepseek_kv_stream(P::deepseek_v4_csa_layer)),
        csa(P::deepseek_v4_csa_layer.geom, *P::deepseek_indexer_stream(P::deepseek_v4_csa_layer)));
    paged_cache<csa, csa> cache(layer, cc);
    const sequence_id seq = cache.create();
    cache.append(seq, {kv_chunk, indexer_chunk}, window);
    sparse_reader reader(cache, rc);
    out.assign(64 * 512, 0.0f);
    read_trace trace;
    reader.read(cache, seq, read_request{tokens - 1, queries, indexer_queries, weights, sinks}, out.data(),
                selected ? &trace : nullptr);
    if (selected) {
      for (auto j : trace.selected) selected->push_back(static_cast<std::int32_t>(j));
      *scores = trace.scores;
    }
  };
  std::vector<float> scores_f32;
  read(P::deepseek_cache(P::deepseek_v4_csa_layer, 64), P::deepseek_reader(P::deepseek_v4_csa_layer), r.read_f32,
       &r.selected_f32, &scores_f32);
  read(P::deepseek_cache(P::deepseek_v4_csa_layer, 64, 0, true), P::deepseek_reader(P::deepseek_v4_csa_layer, true),
       r.read_precision, &r.selected_precision, &r.scores_precision);
  return r;
}

template <class T>
void put(std::ofstream& out, const std::vector<T>& v) {
  const std::uint64_t n = v.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof n);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
}
template <class T>
std::vector<T> get(std::ifstream& in) {
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), sizeof n);
  std::vector<T> v(in ? n : 0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  return v;
}

std::int64_t ulp_distance(float a, float b) {
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::int32_t(0x80000000u) - ia;  // a monotone integer line through ±0
  if (ib < 0) ib = std::int32_t(0x80000000u) - ib;
  return std::llabs(static_cast<long long>(ia) - ib);
}

// Compares value by value: passes when every pair is within `tolerance` of the largest |value|
// (0: bit-identical). Prints how many differ, the largest difference and, among values above a
// tenth of the largest, the largest distance in ulp.
bool compare(const char* what, const std::vector<float>& mine, const std::vector<float>& theirs, double tolerance) {
  if (mine.size() != theirs.size()) {
    std::printf("%s: %zu values here, %zu in the file\n", what, mine.size(), theirs.size());
    return false;
  }
  double scale = 0;
  for (float v : theirs) scale = std::max(scale, std::fabs(double(v)));
  std::int64_t differing = 0, worst_ulp = 0;
  double worst_abs = 0;
  for (std::size_t k = 0; k < mine.size(); ++k) {
    if (std::memcmp(&mine[k], &theirs[k], 4) == 0) continue;
    ++differing;
    worst_abs = std::max(worst_abs, std::fabs(double(mine[k]) - theirs[k]));
    if (std::fabs(theirs[k]) >= 0.1 * scale) worst_ulp = std::max(worst_ulp, ulp_distance(mine[k], theirs[k]));
  }
  const double relative = scale > 0 ? worst_abs / scale : 0.0;
  std::printf("%-26s %6zu values, max |v| %.3g: %6lld not bit-identical; largest difference %.2g of max |v| "
              "(allowed %.0g); largest ulp distance above max/10: %lld\n",
              what, mine.size(), scale, static_cast<long long>(differing), relative, tolerance,
              static_cast<long long>(worst_ulp));
  return tolerance == 0.0 ? differing == 0 : relative <= tolerance;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "compare") != 0)) {
    std::fprintf(stderr, "usage: march_probe write|compare FILE\n");
    return 2;
  }
  const results r = compute();
  std::printf("compiled kernels: %s\n", phasekv::simd::compiled_isa_report().c_str());
  if (std::strcmp(argv[1], "write") == 0) {
    std::ofstream out(argv[2], std::ios::binary);
    put(out, r.entries), put(out, r.read_f32), put(out, r.read_precision), put(out, r.scores_precision);
    put(out, r.selected_precision), put(out, r.selected_f32);
    return out ? 0 : 1;
  }
  std::ifstream in(argv[2], std::ios::binary);
  const auto entries = get<float>(in), read_f32 = get<float>(in), read_precision = get<float>(in);
  const auto scores = get<float>(in);
  const auto selected = get<std::int32_t>(in);
  const auto selected_f32 = get<std::int32_t>(in);
  if (!in) {
    std::fprintf(stderr, "march_probe: cannot read %s\n", argv[2]);
    return 2;
  }
  bool ok = compare("entries (write path)", r.entries, entries, 4e-6);
  ok = compare("read, fp32 cache", r.read_f32, read_f32, 4e-6) && ok;
  ok = compare("read, V4-precision cache", r.read_precision, read_precision, 1e-4) && ok;
  ok = compare("FP4 indexer scores", r.scores_precision, scores, 0.0) && ok;
  const bool same_selection = selected == r.selected_precision;
  std::printf("FP4 indexer selection (%zu entries): %s\n", selected.size(), same_selection ? "identical" : "DIFFERS");
  // The fp32 indexer's selection may differ at near-ties of its scores: reported, not held.
  std::vector<std::int32_t> mine = r.selected_f32, theirs = selected_f32;
  std::sort(mine.begin(), mine.end());
  std::sort(theirs.begin(), theirs.end());
  std::vector<std::int32_t> only_here;
  std::set_difference(mine.begin(), mine.end(), theirs.begin(), theirs.end(), std::back_inserter(only_here));
  std::printf("f32 indexer selection (%zu entries): %zu selected here and not in the file\n", theirs.size(),
              only_here.size());
  return ok && same_selection ? 0 : 1;
}
