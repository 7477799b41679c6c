// kvsim: the elementwise ops of one transformer layer, timed next to its GEMMs (gpu/linear.py).
//
// Why: Vidur's linear-layer profiles (../shared/profiles/vidur_mlp) time every op of a layer, and
// kvsim's reader (`kvsim cost validate`) sums all nine: the four GEMMs and these five. They follow
// vLLM's kernels in what they read and write (vllm/csrc/layernorm_kernels.cu rms_norm,
// pos_encoding_kernels.cu rotary_embedding (NeoX style, cos/sin cache), activation_kernels.cu
// silu_and_mul) and a residual add; bf16 in and out, fp32 math. Simpler than vLLM's (scalar 2-byte
// loads, no vectorisation), so their times are an upper bound on vLLM's.
//
// Header-free like kernels.cu: bf16 values travel as raw uint16 bits.

typedef unsigned short u16;
typedef long long i64;

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((unsigned int)b) << 16); }

__device__ __forceinline__ u16 f2bf(float f) {  // round to nearest even (finite inputs)
    unsigned int u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

#define NORM_THREADS 256

// y[row] = x[row] / sqrt(mean(x[row]^2) + eps) * w; one CTA of NORM_THREADS per token row.
extern "C" __global__ void __launch_bounds__(NORM_THREADS) rms_norm(
    const u16* __restrict__ x, const u16* __restrict__ w, u16* __restrict__ y, int hidden, float eps) {
    const i64 base = (i64)blockIdx.x * hidden;
    float ss = 0.f;
    for (int j = threadIdx.x; j < hidden; j += NORM_THREADS) {
        const float v = bf2f(x[base + j]);
        ss += v * v;
    }
    __shared__ float red[NORM_THREADS];
    red[threadIdx.x] = ss;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const float inv = rsqrtf(red[0] / (float)hidden + eps);
    for (int j = threadIdx.x; j < hidden; j += NORM_THREADS) {
        y[base + j] = f2bf(bf2f(x[base + j]) * inv * bf2f(w[j]));
    }
}

// out = a + b over n elements (the residual add).
extern "C" __global__ void residual_add(const u16* __restrict__ a, const u16* __restrict__ b,
                                        u16* __restrict__ out, i64 n) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = f2bf(bf2f(a[i]) + bf2f(b[i]));
    }
}

// out[t, j] = silu(x[t, j]) * x[t, inter + j]; x is [tokens, 2 * inter] (gate | up), out [tokens, inter].
extern "C" __global__ void silu_and_mul(const u16* __restrict__ x, u16* __restrict__ out, int inter,
                                        i64 n) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const i64 t = i / inter;
        const int j = (int)(i - t * inter);
        const float g = bf2f(x[t * 2 * inter + j]);
        const float u = bf2f(x[t * 2 * inter + inter + j]);
        out[i] = f2bf(g / (1.f + __expf(-g)) * u);
    }
}

// NeoX rotary embedding, in place, on q [tokens, q_heads, head_dim] and k [tokens, kv_heads, head_dim].
// cos_sin[pos] holds head_dim / 2 cosines then head_dim / 2 sines (vLLM's cos_sin_cache layout).
// One CTA per token.
extern "C" __global__ void rotary_neox(u16* __restrict__ q, u16* __restrict__ k,
                                       const float* __restrict__ cos_sin,
                                       const i64* __restrict__ positions, int q_heads, int kv_heads,
                                       int head_dim) {
    const i64 t = blockIdx.x;
    const int half = head_dim / 2;
    const float* cs = cos_sin + positions[t] * head_dim;
    const int pairs = (q_heads + kv_heads) * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int h = p / half;
        const int i = p - h * half;
        u16* row = h < q_heads ? q + (t * q_heads + h) * (i64)head_dim
                               : k + (t * kv_heads + (h - q_heads)) * (i64)head_dim;
        const float x1 = bf2f(row[i]);
        const float x2 = bf2f(row[i + half]);
        const float c = cs[i];
        const float s = cs[half + i];
        row[i] = f2bf(x1 * c - x2 * s);
        row[i + half] = f2bf(x2 * c + x1 * s);
    }
}
