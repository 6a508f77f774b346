// Host stand-in for <hip/hip_runtime.h>: runs a roller-generated HIP kernel on CPU threads (roller tests only).
// One std::thread per HIP thread of a block; blocks run one after another, so __shared__ arrays can be
// function statics shared by the block's threads. MFMA builtins are emulated from AMD's documented per-lane
// layouts (AMD matrix instruction calculator), written here as "which lane and element holds A[i][k], B[k][j]
// and D[i][j]", the inverse of how the kernel template computes what each lane loads and stores.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <vector>

#define __global__
#define __device__
#define __launch_bounds__(n)
#define __shared__ static
#define __restrict__ __restrict

struct rl_emu_dim3 {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local rl_emu_dim3 threadIdx;
inline thread_local rl_emu_dim3 blockIdx;

inline constexpr int rl_emu_lanes = 64;

struct rl_emu_wave {
    std::barrier<> sync{rl_emu_lanes};
    float a[rl_emu_lanes][4];
    float b[rl_emu_lanes][4];
};

struct rl_emu_block {
    std::barrier<>* sync = nullptr;
    std::vector<rl_emu_wave>* waves = nullptr;
};
inline thread_local rl_emu_block rl_emu_here;

inline void __syncthreads() { rl_emu_here.sync->arrive_and_wait(); }

using std::max;
using std::min;

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

#define ROLLER_MFMA_TYPES
typedef _Float16 rl_half4 __attribute__((ext_vector_type(4)));
typedef float rl_float4 __attribute__((ext_vector_type(4)));
typedef float rl_float16 __attribute__((ext_vector_type(16)));

// D = A x B + C for one M x N x K instruction over the 64 lanes of the calling thread's wavefront.
// G = 64 / M lane groups; each lane holds K / G consecutive k of one row of A and one column of B.
template <int M, int N, int K, typename Acc>
Acc rl_emu_mfma(rl_half4 a, rl_half4 b, Acc c) {
    constexpr int G = rl_emu_lanes / M;
    constexpr int KL = K / G;
    const int lane = threadIdx.x % rl_emu_lanes;
    rl_emu_wave& w = (*rl_emu_here.waves)[threadIdx.x / rl_emu_lanes];
    for (int q = 0; q < KL; ++q) {
        w.a[lane][q] = (float)a[q];
        w.b[lane][q] = (float)b[q];
    }
    w.sync.arrive_and_wait();
    Acc d = c;
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
            const int d_lane = j + N * ((i / 4) % G);
            const int d_elem = (i % 4) + 4 * (i / (4 * G));
            if (d_lane != lane) continue;
            float s = 0.0f;
            for (int k = 0; k < K; ++k) s += w.a[i + M * (k / KL)][k % KL] * w.b[j + N * (k / KL)][k % KL];
            d[d_elem] += s;
        }
    }
    w.sync.arrive_and_wait();  // nobody refills the exchange before every lane has read it
    return d;
}

#define __builtin_amdgcn_mfma_f32_32x32x8f16(a, b, c, cbsz, abid, blgp) rl_emu_mfma<32, 32, 8>(a, b, c)
#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, cbsz, abid, blgp) rl_emu_mfma<16, 16, 16>(a, b, c)
