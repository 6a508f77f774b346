// A CPU stand-in for the parts of CUDA that roller's generated kernels use, so their indexing, staging and
// wmma fragment layouts can be checked against numpy on a machine without a GPU. Every CUDA thread of a block
// is a std::thread; blocks run one after another, so __shared__ arrays can be function statics.
// wmma fragments hold the whole tile in every lane (the semantics of the collective operations, not the
// hardware's distribution over lanes): this checks which memory a kernel hands to wmma, not wmma itself.
// cp.async completes late on purpose: an issued copy fills its destination with 0xFF bytes (NaN halves and
// floats) at once and lands only when a wait retires its group, so a kernel that reads a slot before its
// wait, or overwrites a slot another thread still reads, computes NaNs instead of passing by luck.
#pragma once
#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#define ROLLER_EMU 1  // the generated kernels then take the cp.async helpers below instead of their PTX

typedef _Float16 __half;
struct uint4 { unsigned x, y, z, w; };   // 16-byte staging loads (-O1: no strict-aliasing assumptions)
struct Dim3 { int x = 0, y = 0, z = 0; };
inline thread_local Dim3 threadIdx, blockIdx;
inline Dim3 gridDim;   // set by emu_launch (grid-stride loops read it)
inline std::barrier<>* emu_block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> emu_warp_barriers;

#define __global__
#define __device__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline void __syncwarp() { emu_warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
using std::min;
using std::max;

struct EmuCopy { void* dst; std::array<unsigned char, 16> bytes; };
inline thread_local std::vector<EmuCopy> emu_open_group;          // issued since the last commit
inline thread_local std::deque<std::vector<EmuCopy>> emu_groups;  // committed, not yet retired, oldest first
inline void rl_cp_async16(void* dst, const void* src) {
    EmuCopy c{dst, {}};
    std::memcpy(c.bytes.data(), src, 16);  // the inputs do not change during a launch: read now, land later
    std::memset(dst, 0xFF, 16);
    emu_open_group.push_back(c);
}
inline void rl_cp_async_commit() { emu_groups.push_back(std::move(emu_open_group)); emu_open_group.clear(); }
template <int N> inline void rl_cp_async_wait() {
    while (emu_groups.size() > (size_t)N) {
        for (const EmuCopy& c : emu_groups.front()) std::memcpy(c.dst, c.bytes.data(), 16);
        emu_groups.pop_front();
    }
}

namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {};
struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static constexpr int R = std::is_same<Use, matrix_b>::value ? K : M;  // rows of the tile it holds
    static constexpr int C = std::is_same<Use, matrix_a>::value ? K : N;
    float x[R * C];
};
template <class Use, int M, int N, int K, class T, class L>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const T* p, unsigned ldm) {
    using F = fragment<Use, M, N, K, T, L>;
    for (int r = 0; r < F::R; ++r)
        for (int c = 0; c < F::C; ++c)
            f.x[r * F::C + c] = (float)(std::is_same<L, row_major>::value ? p[r * ldm + c] : p[c * ldm + r]);
}
template <int M, int N, int K, class T>
void fill_fragment(fragment<accumulator, M, N, K, T>& f, float v) { for (float& e : f.x) e = v; }
template <int M, int N, int K, class T, class LA, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, T, LA>& a,
              const fragment<matrix_b, M, N, K, T, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
    float out[M * N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            float s = c.x[i * N + j];
            for (int k = 0; k < K; ++k) s += a.x[i * K + k] * b.x[k * N + j];
            out[i * N + j] = s;
        }
    std::memcpy(d.x, out, sizeof out);
}
template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t l) {
    if (threadIdx.x % 32) return;  // one lane writes; the kernel's __syncwarp publishes it
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) (l == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.x[i * N + j];
}
}}  // namespace nvcuda::wmma

template <class F, class... A> void emu_launch(F kernel, int grid, int block, A... args) {
    std::barrier<> bar(block);
    emu_block_barrier = &bar;
    gridDim.x = grid;
    emu_warp_barriers.clear();
    for (int w = 0; w < (block + 31) / 32; ++w)
        emu_warp_barriers.emplace_back(new std::barrier<>(std::min(32, block - 32 * w)));
    for (int b = 0; b < grid; ++b) {
        std::vector<std::thread> ts;
        for (int t = 0; t < block; ++t)
            ts.emplace_back([=] { blockIdx.x = b; threadIdx.x = t; kernel(args...); });
        for (auto& th : ts) th.join();
    }
}
