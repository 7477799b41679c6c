// kvsim GPU microkernels: KV gather and GQA decode attention, paged and contiguous.
//
// Why one templated source: the paged and contiguous variants must differ ONLY in how a token's
// physical slot is found (block table vs. start offset). Everything else -- the launch plan (which
// CTA handles which tokens, split by LIVE length), the loads, the math -- is shared, so a measured
// difference is the cost of the indirection and nothing else.
//
// Header-free on purpose: NVRTC compiles this on a CPU-only machine (compile_check) without
// cuda_fp16.h / cuda_bf16.h. bf16 and fp16 values travel as raw uint16 bits and are converted here.
//
// Memory layout (both variants): a pool of token slots [num_slots, kv_heads, HEAD_DIM] for K and one
// for V. Paged: slot = block_table[seq][t / block_size] * block_size + t % block_size.
// Contiguous: slot = start_slots[seq] + t.

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define DTYPE_BF16 0
#define DTYPE_FP16 1
#define NEG_INF __int_as_float(0xff800000)

// ---------------------------------------------------------------------------------------------
// Conversions: two 16-bit values packed in one 32-bit word -> two floats.
template <int DTYPE>
__device__ __forceinline__ void unpack2(u32 word, float& lo, float& hi);

template <>
__device__ __forceinline__ void unpack2<DTYPE_BF16>(u32 word, float& lo, float& hi) {
    lo = __uint_as_float(word << 16);
    hi = __uint_as_float(word & 0xffff0000u);
}

template <>
__device__ __forceinline__ void unpack2<DTYPE_FP16>(u32 word, float& lo, float& hi) {
    unsigned short a = (unsigned short)(word & 0xffffu);
    unsigned short b = (unsigned short)(word >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(a));
    asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(b));
}

template <int DTYPE>
__device__ __forceinline__ void unpack8(const uint4& v, float (&out)[8]) {
    unpack2<DTYPE>(v.x, out[0], out[1]);
    unpack2<DTYPE>(v.y, out[2], out[3]);
    unpack2<DTYPE>(v.z, out[4], out[5]);
    unpack2<DTYPE>(v.w, out[6], out[7]);
}

// 16-byte streaming load through the read-only path (the KV is read once per launch).
__device__ __forceinline__ uint4 load16(const uint4* p) {
    return __ldg(p);
}

// ---------------------------------------------------------------------------------------------
// The one place where paged and contiguous differ.
template <bool PAGED>
__device__ __forceinline__ i64 token_slot(const int* __restrict__ block_table, int max_blocks,
                                          const i64* __restrict__ start_slots, int seq, int t,
                                          int block_size) {
    if (PAGED) {
        const int block = block_table[(i64)seq * max_blocks + t / block_size];
        return (i64)block * block_size + (t % block_size);
    } else {
        return start_slots[seq] + t;
    }
}

// ---------------------------------------------------------------------------------------------
// Gather: copy the live K and V rows of every sequence into a packed [total_tokens, row] output.
// One CTA per plan chunk (chunk_tokens tokens of one sequence); one warp per token row at a time;
// each lane moves GATHER_UNROLL 16-byte vectors of K and of V per step, all loads issued first.
#define GATHER_UNROLL 4

template <bool PAGED>
__global__ void __launch_bounds__(256) gather_kv(
    const uint4* __restrict__ k_pool, const uint4* __restrict__ v_pool, uint4* __restrict__ k_out,
    uint4* __restrict__ v_out, const int* __restrict__ block_table, int max_blocks,
    const i64* __restrict__ start_slots, const int* __restrict__ lengths,
    const i64* __restrict__ out_offsets, const int* __restrict__ chunk_seq,
    const int* __restrict__ chunk_start, int chunk_tokens, int block_size, int row_vecs) {
    const int chunk = blockIdx.x;
    const int seq = chunk_seq[chunk];
    const int t0 = chunk_start[chunk];
    const int t_end = min(t0 + chunk_tokens, lengths[seq]);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int num_warps = blockDim.x >> 5;
    const i64 out_base = out_offsets[seq];
    for (int t = t0 + warp; t < t_end; t += num_warps) {
        const i64 src = token_slot<PAGED>(block_table, max_blocks, start_slots, seq, t, block_size) * row_vecs;
        const i64 dst = (out_base + t) * row_vecs;
        for (int v0 = lane; v0 < row_vecs; v0 += 32 * GATHER_UNROLL) {
            uint4 kk[GATHER_UNROLL];
            uint4 vv[GATHER_UNROLL];
#pragma unroll
            for (int u = 0; u < GATHER_UNROLL; ++u) {
                const int v = v0 + u * 32;
                if (v < row_vecs) {
                    kk[u] = load16(k_pool + src + v);
                    vv[u] = load16(v_pool + src + v);
                }
            }
#pragma unroll
            for (int u = 0; u < GATHER_UNROLL; ++u) {
                const int v = v0 + u * 32;
                if (v < row_vecs) {
                    k_out[dst + v] = kk[u];
                    v_out[dst + v] = vv[u];
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GQA decode attention, split-K ("flash decoding") over plan chunks of LIVE tokens.
// Grid: (num_chunks, kv_heads). Each CTA computes, for the GROUP query heads that share one KV head,
// the partial softmax state (max, sum, unnormalised accumulator) over its chunk; a second kernel
// combines the chunks of each sequence. Scores are kept in base 2 (q is pre-scaled by log2(e)).
//
// Inside a CTA: LANES_PER_TOKEN = HEAD_DIM / 8 lanes read one token's K (and V) row for this head
// with one 16-byte load each; a warp covers TOKENS_PER_WARP tokens at a time, ATTN_UNROLL times per
// step, so each lane has 2 * ATTN_UNROLL(GROUP) independent 16-byte loads in flight.
#define ATTN_THREADS 128
#define ATTN_WARPS (ATTN_THREADS / 32)
// Tokens per lane-group per step. Wide groups hold GROUP x 8 accumulators per lane already, so they
// unroll less to stay near 128 registers (two CTAs' worth of loads in flight beats one CTA's).
#define ATTN_UNROLL(GROUP) ((GROUP) >= 8 ? 2 : 4)

template <bool PAGED, int DTYPE, int HEAD_DIM, int GROUP>
__global__ void __launch_bounds__(ATTN_THREADS) decode_attention_partial(
    const u16* __restrict__ q, const uint4* __restrict__ k_pool, const uint4* __restrict__ v_pool,
    const int* __restrict__ block_table, int max_blocks, const i64* __restrict__ start_slots,
    const int* __restrict__ lengths, const int* __restrict__ chunk_seq, const int* __restrict__ chunk_start,
    int chunk_tokens, int block_size, int kv_heads, float scale_log2, float* __restrict__ part_m,
    float* __restrict__ part_l, float* __restrict__ part_acc) {
    constexpr int LANES_PER_TOKEN = HEAD_DIM / 8;
    constexpr int TOKENS_PER_WARP = 32 / LANES_PER_TOKEN;
    constexpr int SLOTS = ATTN_WARPS * TOKENS_PER_WARP;  // independent partial states per CTA
    static_assert(HEAD_DIM % 8 == 0 && LANES_PER_TOKEN <= 32, "HEAD_DIM must be 64, 128 or 256");

    __shared__ float sm_m[SLOTS][GROUP];
    __shared__ float sm_l[SLOTS][GROUP];
    __shared__ float sm_acc[SLOTS][GROUP][HEAD_DIM];

    const int chunk = blockIdx.x;
    const int head = blockIdx.y;
    const int seq = chunk_seq[chunk];
    const int t0 = chunk_start[chunk];
    const int t_end = min(t0 + chunk_tokens, lengths[seq]);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int sub = lane / LANES_PER_TOKEN;   // which token of the warp's group
    const int dl = lane % LANES_PER_TOKEN;    // which 8 dims of the row
    const int slot_id = warp * TOKENS_PER_WARP + sub;
    const int row_vecs = kv_heads * LANES_PER_TOKEN;  // 16-byte vectors per token row (all heads)
    const int head_vec = head * LANES_PER_TOKEN + dl;

    // This lane's 8 query dims for each of the GROUP query heads, pre-scaled.
    float qf[GROUP][8];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        const int qh = head * GROUP + g;
        const uint4 qv = *reinterpret_cast<const uint4*>(q + ((i64)seq * kv_heads * GROUP + qh) * HEAD_DIM + dl * 8);
        unpack8<DTYPE>(qv, qf[g]);
#pragma unroll
        for (int i = 0; i < 8; ++i) qf[g][i] *= scale_log2;
    }

    float m[GROUP], l[GROUP], acc[GROUP][8];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        m[g] = NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }

    constexpr int UNROLL = ATTN_UNROLL(GROUP);
    constexpr int STEP = SLOTS * UNROLL;
    for (int base = t0; base < t_end; base += STEP) {  // warp-uniform loop
        uint4 kv_k[UNROLL], kv_v[UNROLL];
        bool valid[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int t = base + u * SLOTS + slot_id;
            valid[u] = t < t_end;
            if (valid[u]) {
                const i64 row = token_slot<PAGED>(block_table, max_blocks, start_slots, seq, t, block_size) * row_vecs;
                kv_k[u] = load16(k_pool + row + head_vec);
                kv_v[u] = load16(v_pool + row + head_vec);
            } else {
                kv_k[u] = make_uint4(0u, 0u, 0u, 0u);
                kv_v[u] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            float kf[8], vf[8];
            unpack8<DTYPE>(kv_k[u], kf);
            unpack8<DTYPE>(kv_v[u], vf);
            float s[GROUP];
#pragma unroll
            for (int g = 0; g < GROUP; ++g) {
                float d = 0.f;
#pragma unroll
                for (int i = 0; i < 8; ++i) d = fmaf(qf[g][i], kf[i], d);
#pragma unroll
                for (int off = LANES_PER_TOKEN / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
                s[g] = d;
            }
            if (valid[u]) {
#pragma unroll
                for (int g = 0; g < GROUP; ++g) {
                    const float m_new = fmaxf(m[g], s[g]);
                    const float corr = exp2f(m[g] - m_new);
                    const float p = exp2f(s[g] - m_new);
                    l[g] = l[g] * corr + p;
#pragma unroll
                    for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i] * corr);
                    m[g] = m_new;
                }
            }
        }
    }

    // Combine the SLOTS partial states of this CTA through shared memory.
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
        if (dl == 0) {
            sm_m[slot_id][g] = m[g];
            sm_l[slot_id][g] = l[g];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) sm_acc[slot_id][g][dl * 8 + i] = acc[g][i];
    }
    __syncthreads();
    const i64 part_base = ((i64)chunk * kv_heads + head) * GROUP;
    for (int idx = threadIdx.x; idx < GROUP * HEAD_DIM; idx += ATTN_THREADS) {
        const int g = idx / HEAD_DIM;
        const int d = idx % HEAD_DIM;
        float mx = NEG_INF;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) mx = fmaxf(mx, sm_m[s][g]);
        float sum_l = 0.f, sum_a = 0.f;
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            const float w = (sm_m[s][g] == NEG_INF) ? 0.f : exp2f(sm_m[s][g] - mx);
            sum_l += w * sm_l[s][g];
            sum_a += w * sm_acc[s][g][d];
        }
        part_acc[(part_base + g) * HEAD_DIM + d] = sum_a;
        if (d == 0) {
            part_m[part_base + g] = mx;
            part_l[part_base + g] = sum_l;
        }
    }
}

// Combine the chunks of each sequence: grid (batch, q_heads), head_dim threads.
// chunk_begin[b] .. chunk_begin[b + 1] are sequence b's chunks (the plan orders chunks by sequence).
__global__ void decode_attention_reduce(const float* __restrict__ part_m, const float* __restrict__ part_l,
                                        const float* __restrict__ part_acc, const int* __restrict__ chunk_begin,
                                        float* __restrict__ out, int kv_heads, int group, int head_dim) {
    const int seq = blockIdx.x;
    const int qh = blockIdx.y;
    const int head = qh / group;
    const int g = qh % group;
    const int c0 = chunk_begin[seq];
    const int c1 = chunk_begin[seq + 1];
    float mx = NEG_INF;
    for (int c = c0; c < c1; ++c) mx = fmaxf(mx, part_m[((i64)c * kv_heads + head) * group + g]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float sum_l = 0.f, sum_a = 0.f;
        for (int c = c0; c < c1; ++c) {
            const i64 p = ((i64)c * kv_heads + head) * group + g;
            const float w = exp2f(part_m[p] - mx);
            sum_l += w * part_l[p];
            sum_a += w * part_acc[p * head_dim + d];
        }
        out[((i64)seq * kv_heads * group + qh) * head_dim + d] = (c1 > c0) ? sum_a / sum_l : 0.f;
    }
}

// ---------------------------------------------------------------------------------------------
// Streaming-read ceiling: read n_vecs 16-byte vectors, keep them live with a data-dependent store.
#define READ_UNROLL 4
__global__ void __launch_bounds__(512) stream_read(const uint4* __restrict__ src, i64 n_vecs,
                                                   u32* __restrict__ sink) {
    u32 acc = 0u;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (READ_UNROLL - 1) * stride < n_vecs; i += READ_UNROLL * stride) {
        uint4 r[READ_UNROLL];
#pragma unroll
        for (int u = 0; u < READ_UNROLL; ++u) r[u] = load16(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < READ_UNROLL; ++u) acc ^= r[u].x ^ r[u].y ^ r[u].z ^ r[u].w;
    }
    for (; i < n_vecs; i += stride) {
        const uint4 r = load16(src + i);
        acc ^= r.x ^ r.y ^ r.z ^ r.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;  // practically never true; stops dead-code elimination
}
