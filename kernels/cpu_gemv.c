/* y[M, N] = x[M, K] @ W^T (+ bias) with W [N, K] kept in its GGUF block format (Q4_1, Q8_0), for
 * the CPU decode rows (kernels/cpu_gemv.py builds and loads this file).
 *
 * Each weight is formed exactly as gguf-py's dequantize forms the float32 checkpoint the model
 * loads, so the product differs from F.linear on that checkpoint by summation order only:
 *   Q4_1: w = fl(fl(d * q) + m), q in 0..15, d and m the block's float16 scale and minimum;
 *   Q8_0: w = d * q (exact in float32: 11 x 8 significant bits).
 * That is why this file is compiled with -ffp-contract=off: the multiply and the add of the
 * dequantisation must round separately (an FMA there would change weights); the dot products
 * themselves use FMA (summation, not weights).
 *
 * Layout per matrix, row-major over rows n: qs (Q4_1: K/2 bytes per row, byte j of a 32-weight
 * block holds weight j in its low nibble and weight j + 16 in its high one; Q8_0: K int8 per row),
 * d (and m for Q4_1): K/32 float32 per row, widened exactly from the file's float16 (a broadcast
 * from memory costs no vector port). K is a multiple of 32.
 *
 * Rows of W are split across OpenMP threads; linked against the libgomp torch already loaded, so
 * torch's own thread pool runs it.
 */
#include <immintrin.h>
#include <stdint.h>

#define TILE 4   /* rows of W per step: independent FMA chains */
#define MAX_M 4  /* rows of x per pass over a tile (4 x 4 accumulators) */
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 4
#endif

/* The 32 weights of Q4_1 block b of row n as two vectors (weights 0-15, 16-31). A block has 16
 * distinct weights: lut[j] = fl(fl(d * j) + m), picked per weight by its nibble (vpermps reads the
 * low 4 bits of each index, so the low nibble needs no mask). */
static inline __attribute__((always_inline)) void q4_1_block(
        const uint8_t *qs, const float *d, const float *m, int64_t nb, int64_t n, int64_t b,
        __m512 *lo, __m512 *hi) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 lut = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(d[n * nb + b]), iota),
                               _mm512_set1_ps(m[n * nb + b]));
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + (n * nb + b) * 16)));
    *lo = _mm512_permutexvar_ps(idx, lut);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), lut);
}

static inline __attribute__((always_inline)) void q8_0_block(
        const int8_t *qs, const float *d, int64_t nb, int64_t n, int64_t b,
        __m512 *lo, __m512 *hi) {
    const int8_t *q = qs + (n * nb + b) * 32;
    __m512 dv = _mm512_set1_ps(d[n * nb + b]);
    *lo = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128((const __m128i *)q))));
    *hi = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
        _mm_loadu_si128((const __m128i *)(q + 16)))));
}

/* R rows of W from n0 against M rows of x from x (row stride K), into y (row stride N). R and M
 * are constants after inlining, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void tile(
        int kind, int R, int M, const void *qs, const float *d, const float *m,
        const float *x, int64_t K, int64_t n0, const float *bias, float *y, int64_t N) {
    int64_t nb = K / 32;
    /* The rows PREFETCH_ROWS ahead (within the matrix): the hardware prefetcher alone leaves
     * the short rows' three streams (quants, scales, minima) waiting on memory. */
    if (n0 + R + PREFETCH_ROWS <= N) {
        int64_t qbytes = (kind == 0 ? 16 : 32) * nb * R;
        const char *q = (const char *)qs + (kind == 0 ? 16 : 32) * nb * (n0 + PREFETCH_ROWS);
        for (int64_t o = 0; o < qbytes; o += 64) _mm_prefetch(q + o, _MM_HINT_T0);
        for (int64_t o = 0; o < nb * R; o += 16) {
            _mm_prefetch((const char *)(d + nb * (n0 + PREFETCH_ROWS) + o), _MM_HINT_T0);
            if (kind == 0)
                _mm_prefetch((const char *)(m + nb * (n0 + PREFETCH_ROWS) + o), _MM_HINT_T0);
        }
    }
    __m512 acc[TILE][MAX_M];
    for (int r = 0; r < R; r++)
        for (int i = 0; i < M; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int r = 0; r < R; r++) {
            __m512 lo, hi;
            if (kind == 0)
                q4_1_block((const uint8_t *)qs, d, m, nb, n0 + r, b, &lo, &hi);
            else
                q8_0_block((const int8_t *)qs, d, nb, n0 + r, b, &lo, &hi);
            for (int i = 0; i < M; i++) {
                const float *xb = x + i * K + b * 32;
                acc[r][i] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), acc[r][i]);
                acc[r][i] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), acc[r][i]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < M; i++) {
            float s = _mm512_reduce_add_ps(acc[r][i]);
            y[i * N + n0 + r] = bias ? s + bias[n0 + r] : s;
        }
}

#define TILES_FOR_M(KIND, MM)                                                                \
    case MM:                                                                                 \
        if (n0 + TILE <= N)                                                                  \
            tile(KIND, TILE, MM, qs, d, m, xm, K, n0, bias, ym, N);                          \
        else                                                                                 \
            for (int64_t n = n0; n < N; n++) tile(KIND, 1, MM, qs, d, m, xm, K, n, bias, ym, N); \
        break;

/* One copy per format, so the format is a constant inside the OpenMP body. */
#define DEFINE_LINEAR(NAME, KIND, QTYPE)                                                      \
    void NAME(const float *x, int64_t M, int64_t K, const QTYPE *qs, const float *d,          \
              const float *m, const float *bias, float *y, int64_t N, int threads) {         \
        int64_t tiles = (N + TILE - 1) / TILE;                                               \
        for (int64_t i0 = 0; i0 < M; i0 += MAX_M) {                                          \
            int mm = (int)(M - i0 < MAX_M ? M - i0 : MAX_M);                                  \
            const float *xm = x + i0 * K;                                                    \
            float *ym = y + i0 * N;                                                          \
            _Pragma("omp parallel for schedule(dynamic, 4) num_threads(threads)")                \
            for (int64_t t = 0; t < tiles; t++) {                                            \
                int64_t n0 = t * TILE;                                                       \
                switch (mm) {                                                                \
                    TILES_FOR_M(KIND, 1)                                                     \
                    TILES_FOR_M(KIND, 2)                                                     \
                    TILES_FOR_M(KIND, 3)                                                     \
                    TILES_FOR_M(KIND, 4)                                                     \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

/* m is ignored for Q8_0 (pass 0). */
DEFINE_LINEAR(q4_1_linear, 0, uint8_t)
DEFINE_LINEAR(q8_0_linear, 1, int8_t)

/* The float32 weights of rows [0, N) (what gguf-py's dequantize returns), for the tests. */
void q4_1_dequantize(int64_t N, int64_t K, const uint8_t *qs, const float *d,
                     const float *m, float *w) {
    int64_t nb = K / 32;
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
            __m512 lo, hi;
            q4_1_block(qs, d, m, nb, n, b, &lo, &hi);
            _mm512_storeu_ps(w + n * K + b * 32, lo);
            _mm512_storeu_ps(w + n * K + b * 32 + 16, hi);
        }
}

void q8_0_dequantize(int64_t N, int64_t K, const int8_t *qs, const float *d, const float *m,
                     float *w) {
    int64_t nb = K / 32;
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
            __m512 lo, hi;
            q8_0_block(qs, d, nb, n, b, &lo, &hi);
            _mm512_storeu_ps(w + n * K + b * 32, lo);
            _mm512_storeu_ps(w + n * K + b * 32 + 16, hi);
        }
}
