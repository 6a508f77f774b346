// Graph plan of mm on ipu-gc2: which vertex runs on which IPU tile in which compute set, and the
// tensor slices it connects. The same plan as graph_plan.json, as code: the host program builds the graph from
// it, and roller's host-run check executes the codelets from it.
//   C[m,n] += A[m,k] * B[k,n]
//   remote>tile 2x4x3 | tile>register 1x2x1 | grid 6 | block 4
#pragma once
#include <algorithm>
#include <cstddef>

namespace rl_mm {

constexpr std::size_t kTiles = 1216;        // vertex b runs on tile b % kTiles
constexpr std::size_t kVertices = 6;  // one MultiVertex per block tile
constexpr std::size_t kRounds = 1;      // compute sets: round b / kTiles
constexpr unsigned kWorkersPerVertex = 4;
constexpr bool kOnDevice = true;  // every tensor fits in the tiles' memory
constexpr std::size_t kTileBytes = 262144;
constexpr std::size_t kRank_A = 2;
constexpr std::size_t kShape_A[] = {5, 3};  // as the vertices index it
constexpr std::size_t kStorage_A[] = {5, 3};  // the variable
constexpr std::size_t kSize_A = 15;
constexpr std::size_t kChunk_A = 1;  // elements per tile of the linear mapping
constexpr std::size_t kRank_B = 2;
constexpr std::size_t kShape_B[] = {3, 7};  // as the vertices index it
constexpr std::size_t kStorage_B[] = {3, 7};  // the variable
constexpr std::size_t kSize_B = 21;
constexpr std::size_t kChunk_B = 1;  // elements per tile of the linear mapping
constexpr std::size_t kRank_C = 2;
constexpr std::size_t kShape_C[] = {5, 7};  // as the vertices index it
constexpr std::size_t kStorage_C[] = {5, 7};  // the variable
constexpr std::size_t kSize_C = 35;

// A box of a tensor, end exclusive; an empty box has begin = end = 0 in every dimension.
template <std::size_t R> struct Box {
  std::size_t begin[R];
  std::size_t end[R];
  std::size_t extent(std::size_t d) const { return end[d] - begin[d]; }
  std::size_t elements() const {
    std::size_t n = 1;
    for (std::size_t d = 0; d < R; ++d) n *= extent(d);
    return n;
  }
  // The range [lo, hi] of dimension d, clipped to [0, size).
  void set(std::size_t d, long lo, long hi, long size) {
    lo = std::max(lo, 0L);
    hi = std::min(hi, size - 1);
    begin[d] = hi < lo ? 0 : (std::size_t)lo;
    end[d] = hi < lo ? 0 : (std::size_t)hi + 1;
  }
  void finish() {
    for (std::size_t d = 0; d < R; ++d)
      if (end[d] == begin[d]) {
        for (std::size_t e = 0; e < R; ++e) begin[e] = end[e] = 0;
        return;
      }
  }
};

struct VertexPlan {
  std::size_t block, tile, round;
  unsigned origin[2];  // first point of the block tile per spatial axis
  Box<2> box_A;
  Box<2> box_B;
  Box<2> box_C;
};

inline VertexPlan vertex(std::size_t rl_b) {
  VertexPlan rl_v{};
  rl_v.block = rl_b;
  rl_v.tile = rl_b % kTiles;
  rl_v.round = rl_b / kTiles;
  const long rl_lo_m = (long)((rl_b / 2) % 3) * 2;
  const long rl_hi_m = std::min(rl_lo_m + 2L, 5L) - 1;
  rl_v.origin[0] = (unsigned)rl_lo_m;
  const long rl_lo_n = (long)((rl_b / 1) % 2) * 4;
  const long rl_hi_n = std::min(rl_lo_n + 4L, 7L) - 1;
  rl_v.origin[1] = (unsigned)rl_lo_n;
  const long rl_lo_k = 0, rl_hi_k = 2;
  rl_v.box_A.set(0, rl_lo_m, rl_hi_m, 5);
  rl_v.box_A.set(1, rl_lo_k, rl_hi_k, 3);
  rl_v.box_A.finish();
  rl_v.box_B.set(0, rl_lo_k, rl_hi_k, 3);
  rl_v.box_B.set(1, rl_lo_n, rl_hi_n, 7);
  rl_v.box_B.finish();
  rl_v.box_C.set(0, rl_lo_m, rl_hi_m, 5);
  rl_v.box_C.set(1, rl_lo_n, rl_hi_n, 7);
  rl_v.box_C.finish();
  (void)rl_lo_m;
  (void)rl_hi_m;
  (void)rl_lo_n;
  (void)rl_hi_n;
  (void)rl_lo_k;
  (void)rl_hi_k;
  return rl_v;
}

}  // namespace rl_mm
