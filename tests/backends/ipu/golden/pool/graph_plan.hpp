// Graph plan of pool on ipu-gc2: which vertex runs on which IPU tile in which compute set, and the
// tensor slices it connects. The same plan as graph_plan.json, as code: the host program builds the graph from
// it, and roller's host-run check executes the codelets from it.
//   Y[nc,h,w] += X[nc,2*h+r-1,2*w+s-1] / 9.0
//   remote>tile 2x2x3x3x3 | tile>register 1x1x3x1x1 | grid 2 | block 4
#pragma once
#include <algorithm>
#include <cstddef>

namespace rl_pool {

constexpr std::size_t kTiles = 1216;        // vertex b runs on tile b % kTiles
constexpr std::size_t kVertices = 2;  // one MultiVertex per block tile
constexpr std::size_t kRounds = 1;      // compute sets: round b / kTiles
constexpr unsigned kWorkersPerVertex = 4;
constexpr bool kOnDevice = true;  // every tensor fits in the tiles' memory
constexpr std::size_t kTileBytes = 262144;
constexpr std::size_t kRank_X = 3;
constexpr std::size_t kShape_X[] = {2, 5, 5};  // as the vertices index it
constexpr std::size_t kStorage_X[] = {1, 2, 5, 5};  // the variable
constexpr std::size_t kSize_X = 50;
constexpr std::size_t kChunk_X = 1;  // elements per tile of the linear mapping
constexpr std::size_t kRank_Y = 3;
constexpr std::size_t kShape_Y[] = {2, 3, 3};  // as the vertices index it
constexpr std::size_t kStorage_Y[] = {1, 2, 3, 3};  // the variable
constexpr std::size_t kSize_Y = 18;

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
  unsigned origin[3];  // first point of the block tile per spatial axis
  Box<3> box_X;
  Box<3> box_Y;
};

inline VertexPlan vertex(std::size_t rl_b) {
  VertexPlan rl_v{};
  rl_v.block = rl_b;
  rl_v.tile = rl_b % kTiles;
  rl_v.round = rl_b / kTiles;
  const long rl_lo_nc = (long)((rl_b / 2) % 1) * 2;
  const long rl_hi_nc = std::min(rl_lo_nc + 2L, 2L) - 1;
  rl_v.origin[0] = (unsigned)rl_lo_nc;
  const long rl_lo_h = (long)((rl_b / 1) % 2) * 2;
  const long rl_hi_h = std::min(rl_lo_h + 2L, 3L) - 1;
  rl_v.origin[1] = (unsigned)rl_lo_h;
  const long rl_lo_w = (long)((rl_b / 1) % 1) * 3;
  const long rl_hi_w = std::min(rl_lo_w + 3L, 3L) - 1;
  rl_v.origin[2] = (unsigned)rl_lo_w;
  const long rl_lo_r = 0, rl_hi_r = 2;
  const long rl_lo_s = 0, rl_hi_s = 2;
  rl_v.box_X.set(0, rl_lo_nc, rl_hi_nc, 2);
  rl_v.box_X.set(1, 2 * rl_lo_h + rl_lo_r - 1, 2 * rl_hi_h + rl_hi_r - 1, 5);
  rl_v.box_X.set(2, 2 * rl_lo_w + rl_lo_s - 1, 2 * rl_hi_w + rl_hi_s - 1, 5);
  rl_v.box_X.finish();
  rl_v.box_Y.set(0, rl_lo_nc, rl_hi_nc, 2);
  rl_v.box_Y.set(1, rl_lo_h, rl_hi_h, 3);
  rl_v.box_Y.set(2, rl_lo_w, rl_hi_w, 3);
  rl_v.box_Y.finish();
  (void)rl_lo_nc;
  (void)rl_hi_nc;
  (void)rl_lo_h;
  (void)rl_hi_h;
  (void)rl_lo_w;
  (void)rl_hi_w;
  (void)rl_lo_r;
  (void)rl_hi_r;
  (void)rl_lo_s;
  (void)rl_hi_s;
  return rl_v;
}

}  // namespace rl_pool
