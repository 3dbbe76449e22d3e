// CPU kernels for the engine's layer ops, where PyTorch's composition costs more than the math:
// attention over the paged KV cache (reading the cache blocks in place), rotary
// embeddings in place, the fused residual add + RMSNorm, and the scatter of new K/V rows into
// the cache. Each matches its PyTorch
// reference in kernels/<op>.py (same formula, fp32 arithmetic, the same roundings).
//
// Paged attention: one work item is a query row (a token) with the sequence it belongs to and
// the number of positions it sees (causal: a prefill chunk's i-th of q rows sees seq_len - q + i
// + 1 positions, a decode row all seq_len). All its query heads are scored against those cached
// positions (two passes: scores, then the softmax-weighted sum of V), walking the block table
// so that each token's K and V rows (all KV heads, contiguous) are read once per row from their
// blocks, sequentially within a block, with no gathered copy. Rows are spread over OpenMP
// threads. Layouts follow DESIGN.md: query/out [num_tokens, num_heads,
// head_dim] (query rows may be strided), caches [num_blocks, block_size, num_kv_heads,
// head_dim], block_tables [num_seqs, table_stride] int32. Storage is fp32 or bf16; all
// arithmetic is fp32.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using bf16 = uint16_t;

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16* p, int64_t i) {
    uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(bf16* p, int64_t i, float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;  // stays a (quiet) NaN
    bits = nan ? (bits | 0x400000u) : bits + 0x7fffu + ((bits >> 16) & 1u);  // nearest even
    p[i] = static_cast<bf16>(bits >> 16);
}

// v rounded to the storage type T and back (a no-op for fp32).
inline float round_as(float v, const float*) { return v; }
inline float round_as(float v, const bf16*) {
    bf16 b;
    store(&b, 0, v);
    return load(&b, 0);
}

// exp(x) for x <= 0 (scores minus their maximum), as 2^(x log2 e): the integer part goes to
// the exponent bits, the fraction through a degree-5 least-squares fit of 2^f on [0, 1)
// (relative error below 1e-7, about fp32 rounding). Unlike std::exp it vectorizes.
inline float exp_nonpositive(float x) {
    const float t = std::max(x, -87.0f) * 1.4426950408889634f;  // stays a normal float
    const float whole = std::floor(t);
    const float f = t - whole;
    float p = 0.0018762329f;
    p = p * f + 0.0089925840f;
    p = p * f + 0.0558236045f;
    p = p * f + 0.2401545299f;
    p = p * f + 0.6931529682f;
    p = p * f + 0.9999999269f;
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(whole) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// A token's cache row as fp32: fp32 storage is used in place, bf16 is widened once into
// ``buffer`` (instead of once per query head that reads it).
inline const float* row_of(const float* row, float*, int64_t) { return row; }
inline const float* row_of(const bf16* row, float* buffer, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) buffer[i] = load(row, i);
    return buffer;
}

// Prefetch the first cache lines of block ``block`` so that the jump to the next (randomly
// placed) block does not stall; within a block, reads are sequential.
template <typename T>
inline void prefetch_block(const T* cache, int64_t block, int64_t block_stride) {
    const char* p = reinterpret_cast<const char*>(cache + block * block_stride);
    for (int line = 0; line < 32; ++line) __builtin_prefetch(p + 64 * line);  // 2 KB
}

// HD: head_dim fixed at compile time (64, 128) so the inner loops unroll; 0: read at run time.
template <typename T, int HD>
void attend_rows(const T* query, const T* key_cache, const T* value_cache, T* out,
            const int32_t* row_token, const int32_t* row_seq, const int32_t* row_len,
            const int32_t* block_tables, int64_t table_stride, int64_t query_row_stride,
            int num_rows, int num_heads, int num_kv_heads, int head_dim, int block_size,
            float scale, int sliding_window, int num_threads) {
    if (HD) head_dim = HD;
    const int group = num_heads / num_kv_heads;
    const int64_t token_stride = static_cast<int64_t>(num_kv_heads) * head_dim;
    const int64_t block_stride = token_stride * block_size;
    const int q_width = num_heads * head_dim;
#pragma omp parallel num_threads(num_threads)
    {
        std::vector<float> q(q_width), acc(q_width), row(token_stride), scores;
#pragma omp for schedule(dynamic, 1)
        for (int r = 0; r < num_rows; ++r) {
            const int s = row_seq[r];
            const int len = row_len[r];
            const int start = sliding_window > 0 ? std::max(0, len - sliding_window) : 0;
            const int n = len - start;
            const int64_t token = row_token[r];
            if (n <= 0) {  // nothing to attend to (never for a real row): zeros
                for (int i = 0; i < q_width; ++i) store(out, token * q_width + i, 0.f);
                continue;
            }
            const int32_t* table = block_tables + s * table_stride;
            const int num_blocks = (len + block_size - 1) / block_size;
            for (int i = 0; i < q_width; ++i)
                q[i] = load(query, token * query_row_stride + i) * scale;
            scores.resize(static_cast<size_t>(num_heads) * n);

            // Positions [start, len) block by block (no division per position); KV head g
            // serves query heads g * group .. g * group + group - 1.
            const int first_block = start / block_size;
            auto for_each_position = [&](const T* cache, auto&& body) {
                for (int b = first_block; b < num_blocks; ++b) {
                    if (b + 1 < num_blocks) prefetch_block(cache, table[b + 1], block_stride);
                    const T* base = cache + table[b] * block_stride;
                    const int lo = std::max(start - b * block_size, 0);
                    const int hi = std::min(len - b * block_size, block_size);
                    for (int o = lo; o < hi; ++o)
                        body(b * block_size + o - start, base + o * token_stride);
                }
            };

            // Pass 1: scores[h, t] = q_h . k_t, reading each token's K row (all KV heads,
            // contiguous) once.
            for_each_position(key_cache, [&](int t, const T* cached) {
                const float* krow = row_of(cached, row.data(), token_stride);
                for (int g = 0; g < num_kv_heads; ++g) {
                    const float* kh = krow + g * head_dim;
                    for (int h = g * group; h < (g + 1) * group; ++h) {
                        const float* qh = q.data() + h * head_dim;
                        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                        for (int i = 0; i < (HD ? HD : head_dim); ++i) dot += qh[i] * kh[i];
                        scores[static_cast<size_t>(h) * n + t] = dot;
                    }
                }
            });
            // Softmax per head, in fp32.
            for (int h = 0; h < num_heads; ++h) {
                float* sh = scores.data() + static_cast<size_t>(h) * n;
                const float mx = *std::max_element(sh, sh + n);
                float sum = 0.f;
#pragma omp simd reduction(+ : sum)
                for (int j = 0; j < n; ++j) {
                    sh[j] = exp_nonpositive(sh[j] - mx);
                    sum += sh[j];
                }
                const float inv = 1.f / sum;
                for (int j = 0; j < n; ++j) sh[j] *= inv;
            }
            // Pass 2: out_h = sum_t p[h, t] v_t, reading each token's V row once.
            std::fill(acc.begin(), acc.end(), 0.f);
            for_each_position(value_cache, [&](int t, const T* cached) {
                const float* vrow = row_of(cached, row.data(), token_stride);
                for (int g = 0; g < num_kv_heads; ++g) {
                    const float* vh = vrow + g * head_dim;
                    for (int h = g * group; h < (g + 1) * group; ++h) {
                        const float w = scores[static_cast<size_t>(h) * n + t];
                        float* ah = acc.data() + h * head_dim;
#pragma omp simd
                        for (int i = 0; i < (HD ? HD : head_dim); ++i) ah[i] += w * vh[i];
                    }
                }
            });
            const int64_t out0 = token * q_width;
            for (int i = 0; i < q_width; ++i) store(out, out0 + i, acc[i]);
        }
    }
}

template <typename T>
void attend_rows_dispatch(const T* query, const T* key_cache, const T* value_cache, T* out,
            const int32_t* row_token, const int32_t* row_seq, const int32_t* row_len,
            const int32_t* block_tables, int64_t table_stride, int64_t query_row_stride,
            int num_rows, int num_heads, int num_kv_heads, int head_dim, int block_size,
            float scale, int sliding_window, int num_threads) {
    auto f = head_dim == 64    ? attend_rows<T, 64>
             : head_dim == 128 ? attend_rows<T, 128>
                               : attend_rows<T, 0>;
    f(query, key_cache, value_cache, out, row_token, row_seq, row_len, block_tables,
      table_stride, query_row_stride, num_rows, num_heads, num_kv_heads, head_dim, block_size,
      scale, sliding_window, num_threads);
}

// out[t, i] = silu(x[t, i]) * x[t, d + i] (gate first, then up), one pass over the rows.
// silu(g) = g * sigmoid(g) with sigmoid from e = exp(-|g|) <= 1: 1 / (1 + e) for g >= 0, else
// e / (1 + e); the branch-free form vectorizes where std::exp would not. With bf16 storage the
// silu is rounded to bf16 before the product, as the reference's two ops do.
template <typename T>
void silu_and_mul(const T* x, T* out, int num_tokens, int d, int64_t x_row_stride,
                  int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (static_cast<int64_t>(num_tokens) * d >= 65536)
    for (int t = 0; t < num_tokens; ++t) {
        const T* gate = x + t * x_row_stride;
        const T* up = gate + d;
        T* o = out + static_cast<int64_t>(t) * d;
#pragma omp simd
        for (int i = 0; i < d; ++i) {
            const float g = load(gate, i);
            const float e = exp_nonpositive(-std::fabs(g));
            const float sig = (g >= 0.f ? 1.f : e) / (1.f + e);
            store(o, i, round_as(g * sig, o) * load(up, i));
        }
    }
}

// Rotary embedding in place (NeoX halves: channel i pairs with i + rotary_dim / 2), for the
// query and key heads of each token; rows may be strided, heads contiguous within a row.
template <typename T>
void rotary(const int64_t* positions, T* query, T* key, const float* cos_sin, int num_tokens,
            int num_heads, int num_kv_heads, int head_dim, int rotary_dim,
            int64_t query_row_stride, int64_t key_row_stride, int num_threads) {
    const int half = rotary_dim / 2;
#pragma omp parallel for num_threads(num_threads) if (num_tokens >= 64)
    for (int t = 0; t < num_tokens; ++t) {
        const float* cos = cos_sin + positions[t] * rotary_dim;
        const float* sin = cos + half;
        for (int which = 0; which < 2; ++which) {
            T* row = which == 0 ? query + t * query_row_stride : key + t * key_row_stride;
            const int heads = which == 0 ? num_heads : num_kv_heads;
            for (int h = 0; h < heads; ++h) {
                T* x = row + static_cast<int64_t>(h) * head_dim;
#pragma omp simd
                for (int i = 0; i < half; ++i) {
                    const float x1 = load(x, i), x2 = load(x, i + half);
                    store(x, i, x1 * cos[i] - x2 * sin[i]);
                    store(x, i + half, x2 * cos[i] + x1 * sin[i]);
                }
            }
        }
    }
}

// RMSNorm over rows of `hidden`, optionally after adding the residual stream:
// h = x (+ residual); residual_out = h (in the storage type); out = norm(h) * weight. In fp32
// storage that is one rounding; in bf16, as the reference, norm(h) is rounded before the
// weight multiply and again after.
template <typename T>
void rms_norm(const T* x, const T* residual, const T* weight, T* out, T* residual_out,
              int num_tokens, int hidden, float eps, int num_threads) {
#pragma omp parallel num_threads(num_threads) if (num_tokens >= 64)
    {
        std::vector<float> h(hidden);
#pragma omp for
        for (int t = 0; t < num_tokens; ++t) {
            const int64_t row = static_cast<int64_t>(t) * hidden;
            float sum = 0.f;
#pragma omp simd reduction(+ : sum)
            for (int i = 0; i < hidden; ++i) {
                float v = load(x, row + i);
                if (residual) v += load(residual, row + i);
                h[i] = v;
                sum += v * v;
            }
            if (residual_out)
                for (int i = 0; i < hidden; ++i) store(residual_out, row + i, h[i]);
            const float r = 1.f / std::sqrt(sum / hidden + eps);
            for (int i = 0; i < hidden; ++i)
                store(out, row + i, round_as(h[i] * r, out) * load(weight, i));
        }
    }
}

// Write each token's K and V rows (all KV heads) to its cache slot; a negative slot is skipped.
template <typename T>
void reshape_and_cache(const T* key, const T* value, T* key_cache, T* value_cache,
                       const int64_t* slots, int num_tokens, int64_t row_width,
                       int64_t key_row_stride, int64_t value_row_stride) {
    for (int t = 0; t < num_tokens; ++t) {
        if (slots[t] < 0) continue;
        const int64_t dst = slots[t] * row_width;
        std::memcpy(key_cache + dst, key + t * key_row_stride, row_width * sizeof(T));
        std::memcpy(value_cache + dst, value + t * value_row_stride, row_width * sizeof(T));
    }
}

}  // namespace

extern "C" {

int tidal_abi_version() { return 5; }

#define TIDAL_ATTENTION_ENTRY(NAME, T)                                                      \
    void NAME(const void* query, const void* key_cache, const void* value_cache, void* out, \
              const int32_t* row_token, const int32_t* row_seq, const int32_t* row_len,     \
              const int32_t* block_tables, int64_t table_stride, int64_t query_row_stride,  \
              int num_rows, int num_heads, int num_kv_heads, int head_dim, int block_size,  \
              float scale, int sliding_window, int num_threads) {                           \
        attend_rows_dispatch<T>(static_cast<const T*>(query),                               \
                                static_cast<const T*>(key_cache),                           \
                                static_cast<const T*>(value_cache), static_cast<T*>(out),   \
                                row_token, row_seq, row_len, block_tables, table_stride,    \
                                query_row_stride, num_rows, num_heads, num_kv_heads,        \
                                head_dim, block_size, scale, sliding_window, num_threads);  \
    }

TIDAL_ATTENTION_ENTRY(tidal_paged_attention_f32, float)
TIDAL_ATTENTION_ENTRY(tidal_paged_attention_bf16, bf16)

#define TIDAL_ROTARY_ENTRY(NAME, T)                                                          \
    void NAME(const int64_t* positions, void* query, void* key, const float* cos_sin,       \
              int num_tokens, int num_heads, int num_kv_heads, int head_dim, int rotary_dim, \
              int64_t query_row_stride, int64_t key_row_stride, int num_threads) {           \
        rotary<T>(positions, static_cast<T*>(query), static_cast<T*>(key), cos_sin,         \
                  num_tokens, num_heads, num_kv_heads, head_dim, rotary_dim,                \
                  query_row_stride, key_row_stride, num_threads);                           \
    }

TIDAL_ROTARY_ENTRY(tidal_rotary_f32, float)
TIDAL_ROTARY_ENTRY(tidal_rotary_bf16, bf16)

#define TIDAL_RMS_NORM_ENTRY(NAME, T)                                                        \
    void NAME(const void* x, const void* residual, const void* weight, void* out,           \
              void* residual_out, int num_tokens, int hidden, float eps, int num_threads) {  \
        rms_norm<T>(static_cast<const T*>(x), static_cast<const T*>(residual),              \
                    static_cast<const T*>(weight), static_cast<T*>(out),                    \
                    static_cast<T*>(residual_out), num_tokens, hidden, eps, num_threads);   \
    }

TIDAL_RMS_NORM_ENTRY(tidal_rms_norm_f32, float)
TIDAL_RMS_NORM_ENTRY(tidal_rms_norm_bf16, bf16)

#define TIDAL_RESHAPE_AND_CACHE_ENTRY(NAME, T)                                               \
    void NAME(const void* key, const void* value, void* key_cache, void* value_cache,       \
              const int64_t* slots, int num_tokens, int64_t row_width,                      \
              int64_t key_row_stride, int64_t value_row_stride) {                           \
        reshape_and_cache<T>(static_cast<const T*>(key), static_cast<const T*>(value),      \
                             static_cast<T*>(key_cache), static_cast<T*>(value_cache),      \
                             slots, num_tokens, row_width, key_row_stride,                  \
                             value_row_stride);                                             \
    }

TIDAL_RESHAPE_AND_CACHE_ENTRY(tidal_reshape_and_cache_f32, float)
TIDAL_RESHAPE_AND_CACHE_ENTRY(tidal_reshape_and_cache_bf16, bf16)

#define TIDAL_SILU_AND_MUL_ENTRY(NAME, T)                                                    \
    void NAME(const void* x, void* out, int num_tokens, int d, int64_t x_row_stride,        \
              int num_threads) {                                                             \
        silu_and_mul<T>(static_cast<const T*>(x), static_cast<T*>(out), num_tokens, d,      \
                        x_row_stride, num_threads);                                         \
    }

TIDAL_SILU_AND_MUL_ENTRY(tidal_silu_and_mul_f32, float)
TIDAL_SILU_AND_MUL_ENTRY(tidal_silu_and_mul_bf16, bf16)

}  // extern "C"
