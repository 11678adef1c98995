/* Fused sketch kernel for naig (docs/design.md §5, §6): the fast path of naig.sketch.kernels.
 *
 * hash_codes(key, start, out):  out[i] = a_i | (sign_bit_i << 7) for flat indices
 *     start <= start + i < start + len(out), where h_i = splitmix64(key + index),
 *     a_i = (h_i >> 32) mod 14 and sign_bit_i = h_i & 1 (1 means s_i = -1).
 * accumulate(codes, ref, rtype, x, xtype, out):  one pass over a chunk of m scalars for R
 *     sketch seeds at once; codes is a tuple of R buffers of m codes, ref and x are the raw
 *     stored bits (m scalars of dtype rtype / xtype, any alignment), out is (R, 18) float64:
 *     out[s, 0:14] += S_s x, out[s, 14] += <x, ref>, out[s, 15] += |x|^2,
 *     out[s, 16] += |x - ref|^2, out[s, 17] += sum (x - ref)^4.
 *     Every scalar is converted exactly to double in registers (fp8, bf16, fp16, fp32, fp64),
 *     then accumulated in double in four interleaved lanes (lane u takes i = u mod 4), the
 *     lanes combined as (l0 + l1) + (l2 + l3). The order depends only on m, never on the dtype.
 * accumulate_files(keys, m, rows, out):  accumulate for one piece of m scalars of F files read
 *     with pread from rows ((fd, offset, type), ...), row 0 the reference against itself, in
 *     blocks of FILE_BLK scalars that stay in cache (codes hashed and the reference read once
 *     per block); the sums are those of accumulate over the whole piece, bit for bit.
 * decode(raw, type, out):  the same exact conversion into a float64 buffer (tests, tools).
 * isa():  the vector bodies in use, the best the CPU has ("avx512-ifma", "avx512", "avx2",
 *     "portable") or fewer when the environment variable NAIG_KERNEL_ISA names one of them at
 *     import (any case); every body gives the same sums bit for bit, but for the sign of a NaN
 *     sum (x86 keeps the first of two NaN operands, and the bodies order their adds' operands
 *     as their compilers chose).
 * monitor_sketch(pieces, keys, R, out):  the monitor's payload [S_1 x .. S_R x | |x|^2 | non-finite
 *     count] of pieces of tensors in memory (torch tensors, by address), each scalar read once.
 * All release the GIL. Build with -ffp-contract=off: a fused multiply-add would change the
 * last bit of the sums. The readable reference is naig.sketch.core; naig.sketch.kernels holds
 * the numpy path with the same contract, and tests check all three agree in float64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <errno.h>
#include <unistd.h>

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__clang__)
#define NAIG_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NAIG_CLONES
#endif

/* dtype codes: keep in step with naig.sketch.kernels.DTYPES */
enum { T_F64, T_F32, T_F16, T_BF16, T_E4M3FN, T_E5M2, T_E4M3FNUZ, T_E5M2FNUZ, T_E8M0, T_COUNT };
static const Py_ssize_t ITEMSIZE[T_COUNT] = {8, 4, 2, 2, 1, 1, 1, 1, 1};
#define NSTATS 18
#define BLK 256 /* scalars converted per block; a multiple of 8, the vector body's step */
#define FILE_BLK 32768 /* scalars read per file and block by accumulate_files; a multiple of BLK */
#define MAX_R 64 /* sketch seeds one accumulate_files call takes */

static double LUT8[T_COUNT][256]; /* fp8 bit pattern -> value, filled at import */

/* Value of an 8-bit float with ebits exponent bits, mbits mantissa bits and bias `bias`.
 * kind 0: IEEE-like (all-ones exponent: inf / NaN; e5m2); 1: "fn" (only S.1111.111 is NaN;
 * e4m3fn); 2: "fnuz" (0x80 is the only NaN, no inf, no -0); 3: e8m0 (unsigned 2^(b-127),
 * 0xFF NaN). Subnormals: exponent 0 means m * 2^(1 - bias - mbits). */
static double fp8_value(unsigned b, int ebits, int mbits, int bias, int kind) {
    if (kind == 3) return b == 0xFF ? NAN : ldexp(1.0, (int)b - 127);
    unsigned emax = (1u << ebits) - 1, mmax = (1u << mbits) - 1;
    unsigned e = (b >> mbits) & emax, m = b & mmax;
    double sign = (b & 0x80) ? -1.0 : 1.0;
    if (kind == 2 && b == 0x80) return NAN;
    if (kind == 0 && e == emax) return m ? NAN : sign * INFINITY;
    if (kind == 1 && e == emax && m == mmax) return NAN;
    if (e == 0) return sign * ldexp((double)m, 1 - bias - mbits);
    return sign * ldexp((double)((1u << mbits) | m), (int)e - bias - mbits);
}

static void init_tables(void) {
    for (unsigned b = 0; b < 256; b++) {
        LUT8[T_E4M3FN][b] = fp8_value(b, 4, 3, 7, 1);
        LUT8[T_E5M2][b] = fp8_value(b, 5, 2, 15, 0);
        LUT8[T_E4M3FNUZ][b] = fp8_value(b, 4, 3, 8, 2);
        LUT8[T_E5M2FNUZ][b] = fp8_value(b, 5, 2, 16, 2);
        LUT8[T_E8M0][b] = fp8_value(b, 8, 0, 127, 3);
    }
}

/* IEEE half to float, exact, branch-free (normals are rebiased; subnormals renormalised by
 * one exact float subtraction; the all-ones exponent gives inf/NaN). */
static inline float f16_to_f32(uint16_t h) {
    uint32_t o = (uint32_t)(h & 0x7fff) << 13, e = o & (0x7c00u << 13);
    o += (127u - 15u) << 23;
    o += e == (0x7c00u << 13) ? (128u - 16u) << 23 : 0u;
    float f, magic, g;
    uint32_t om = o + (1u << 23), mb = 113u << 23;
    memcpy(&g, &om, 4);
    memcpy(&magic, &mb, 4);
    memcpy(&f, &o, 4);
    f = e == 0 ? g - magic : f;
    uint32_t bits;
    memcpy(&bits, &f, 4);
    bits |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &bits, 4);
    return f;
}

/* Exact conversion of n stored scalars starting at byte p into dst (unaligned loads). */
NAIG_CLONES
static void convert(const uint8_t *p, int type, Py_ssize_t n, double *restrict dst) {
    switch (type) {
    case T_F64:
        memcpy(dst, p, (size_t)n * sizeof(double));
        break;
    case T_F32:
        for (Py_ssize_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, p + 4 * i, 4);
            dst[i] = (double)f;
        }
        break;
    case T_BF16:
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            float f;
            memcpy(&f, &bits, 4);
            dst[i] = (double)f;
        }
        break;
    case T_F16:
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = (double)f16_to_f32(h);
        }
        break;
    default: {
        const double *lut = LUT8[type];
        for (Py_ssize_t i = 0; i < n; i++) dst[i] = lut[p[i]];
    }
    }
}

static const double SIGN[2] = {1.0, -1.0};

/* Running sums of one pass: lane u of four takes the scalars i = u mod 4 of the full groups of
 * four, the remainder (m mod 4 scalars, after every group) goes to lane 0. */
typedef struct {
    double bank[4][16]; /* partial sketch sums per lane and bucket */
    double pd[4], px[4], pq[4], p4[4];
} Acc;

static inline double combine(const double *l, Py_ssize_t stride) {
    return (l[0] + l[stride]) + (l[2 * stride] + l[3 * stride]);
}

/* The portable body, on scalars already converted to double: full groups of four, then the
 * remainder (fewer than four scalars, only at the end of a pass) into lane 0. */
NAIG_CLONES
static void lanes_scalar(const uint8_t *codes, const double *xs, const double *rs, Py_ssize_t n, Acc *a) {
    Py_ssize_t j = 0;
    for (; j + 4 <= n; j += 4) {
        for (int u = 0; u < 4; u++) {
            double xi = xs[j + u], ri = rs[j + u], di = xi - ri, d2 = di * di;
            uint8_t c = codes[j + u];
            a->bank[u][c & 15] += SIGN[c >> 7] * xi;
            a->pd[u] += xi * ri;
            a->px[u] += xi * xi;
            a->pq[u] += d2;
            a->p4[u] += d2 * d2;
        }
    }
    for (; j < n; j++) {
        double xi = xs[j], ri = rs[j], di = xi - ri, d2 = di * di;
        uint8_t c = codes[j];
        a->bank[0][c & 15] += SIGN[c >> 7] * xi;
        a->pd[0] += xi * ri;
        a->px[0] += xi * xi;
        a->pq[0] += d2;
        a->p4[0] += d2 * d2;
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define NAIG_AVX2 1
#define AVX2 __attribute__((target("avx2,f16c")))
static int have_avx2;

/* Eight stored scalars to two vectors of four doubles (scalars 0-3, 4-7), exactly. */
#define LOADER(NAME) AVX2 static inline void NAME(const uint8_t *p, __m256d *lo, __m256d *hi)
AVX2 static inline void split_ps(__m256 f, __m256d *lo, __m256d *hi) {
    *lo = _mm256_cvtps_pd(_mm256_castps256_ps128(f));
    *hi = _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1));
}
LOADER(ld_f64) {
    *lo = _mm256_loadu_pd((const double *)p);
    *hi = _mm256_loadu_pd((const double *)(p + 32));
}
LOADER(ld_f32) { split_ps(_mm256_loadu_ps((const float *)p), lo, hi); }
LOADER(ld_bf16) { /* a bfloat16 is the top half of a float */
    __m128i w = _mm_loadu_si128((const __m128i *)p), z = _mm_setzero_si128();
    *lo = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpacklo_epi16(z, w)));
    *hi = _mm256_cvtps_pd(_mm_castsi128_ps(_mm_unpackhi_epi16(z, w)));
}
LOADER(ld_f16) { split_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), lo, hi); }

/* 8-bit floats through halves: the bytes widened to 16-bit lanes and rebuilt as the half with
 * the same mantissa bits (subnormals included), scaled by a power of two, NaNs patched. */
AVX2 static inline __m128i ld8_u16(const uint8_t *p) {
    return _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
}
AVX2 static inline void fp8_split(__m256 f, __m128i nan16, __m256d *lo, __m256d *hi) {
    if (!_mm_testz_si128(nan16, nan16)) /* rare: patch the NaN patterns */
        f = _mm256_blendv_ps(f, _mm256_set1_ps(NAN), _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16)));
    split_ps(f, lo, hi);
}
LOADER(ld_e5m2) { /* the top byte of a half: exact, with its inf and NaN */
    split_ps(_mm256_cvtph_ps(_mm_slli_epi16(ld8_u16(p), 8)), lo, hi);
}
/* e4m3 (bias 7 or 8): S.|b| << 7 is a half of value x * 2^(bias - 15). The bytes are widened
 * with their sign (s = SSSSSSSS S.EEEE.MMM), so s << 7 has S in bit 15 and in bit 14; masking
 * bit 14 leaves the half S.0EEEE.MMM0000000 in two operations. */
AVX2 static inline __m128i ld8_i16(const uint8_t *p) {
    return _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
}
AVX2 static inline __m256 e4m3_half(__m128i s, float scale) {
    __m128i h = _mm_and_si128(_mm_slli_epi16(s, 7), _mm_set1_epi16((short)0xBF80));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(scale));
}
LOADER(ld_e4m3fn) { /* NaN: S.1111.111; no inf */
    __m128i s = ld8_i16(p);
    __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(s, _mm_set1_epi16(0x7F)), _mm_set1_epi16(0x7F));
    fp8_split(e4m3_half(s, 256.0f), nan, lo, hi);
}
LOADER(ld_e4m3fnuz) { /* NaN: 0x80 only (sign-extended: 0xFF80); no inf, no -0 */
    __m128i s = ld8_i16(p);
    fp8_split(e4m3_half(s, 128.0f), _mm_cmpeq_epi16(s, _mm_set1_epi16((short)0xFF80)), lo, hi);
}
/* e5m2fnuz (bias 16): b << 8 is a half of value x * 2; exponent 31 is finite here, so it is
 * rebuilt one binade lower and not halved (a half with exponent 30 has the value itself). */
LOADER(ld_e5m2fnuz) {
    __m128i w = ld8_u16(p);
    __m128i h = _mm_slli_epi16(w, 8); /* S.EEEEE.MM00000000: the half of 2x (exponent 31 aside) */
    __m128i top = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x7BFF));
    __m256 f;
    if (_mm_testz_si128(top, top)) { /* the common case: no |x| >= 2^15 among the eight */
        f = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(0.5f));
    } else {
        h = _mm_sub_epi16(h, _mm_and_si128(top, _mm_set1_epi16(0x400)));
        __m256 scale = _mm256_blendv_ps(_mm256_set1_ps(0.5f), _mm256_set1_ps(1.0f),
                                        _mm256_castsi256_ps(_mm256_cvtepi16_epi32(top)));
        f = _mm256_mul_ps(_mm256_cvtph_ps(h), scale);
    }
    fp8_split(f, _mm_cmpeq_epi16(w, _mm_set1_epi16(0x80)), lo, hi);
}
/* e8m0: 2^(b - 127) is the double with biased exponent b + 896; 0xFF is NaN. */
AVX2 static inline __m256d e8m0_4(const uint8_t *p) {
    int32_t w;
    memcpy(&w, p, 4);
    __m256i b = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(w));
    __m256d v = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(b, _mm256_set1_epi64x(896)), 52));
    __m256d nan = _mm256_castsi256_pd(_mm256_cmpeq_epi64(b, _mm256_set1_epi64x(255)));
    return _mm256_blendv_pd(v, _mm256_set1_pd(NAN), nan);
}
LOADER(ld_e8m0) {
    *lo = e8m0_4(p);
    *hi = e8m0_4(p + 4);
}

/* One group of four scalars: lane u of the vectors is lane u of the Acc A (sums PX, PD, PQ, P4
 * held in registers), each updated with the same operations in the same order as lanes_scalar
 * (x * -1 is x with its sign bit flipped). */
#define AVX_GROUP_TO(SELF, XD, RD, CW, A, PX, PD, PQ, P4)                                          \
    {                                                                                                \
        __m256i c64 = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128((int)(CW)));                            \
        __m256i sg = _mm256_and_si256(_mm256_slli_epi64(c64, 56), sbit);                             \
        double t[4];                                                                                 \
        _mm256_storeu_pd(t, _mm256_xor_pd(XD, _mm256_castsi256_pd(sg)));                             \
        (A)->bank[0][(CW) & 15] += t[0];                                                             \
        (A)->bank[1][((CW) >> 8) & 15] += t[1];                                                      \
        (A)->bank[2][((CW) >> 16) & 15] += t[2];                                                     \
        (A)->bank[3][((CW) >> 24) & 15] += t[3];                                                     \
        PX = _mm256_add_pd(PX, _mm256_mul_pd(XD, XD));                                               \
        if (!(SELF)) {                                                                               \
            __m256d di = _mm256_sub_pd(XD, RD), d2 = _mm256_mul_pd(di, di);                          \
            PD = _mm256_add_pd(PD, _mm256_mul_pd(XD, RD));                                           \
            PQ = _mm256_add_pd(PQ, d2);                                                              \
            P4 = _mm256_add_pd(P4, _mm256_mul_pd(d2, d2));                                           \
        }                                                                                            \
    }
#define AVX_GROUP(SELF, XD, RD, CW) AVX_GROUP_TO(SELF, XD, RD, CW, a, px, pd, pq, p4)
#define AVX_LOAD_SUMS(A, PX, PD, PQ, P4)                                                             \
    __m256d PD = _mm256_loadu_pd((A)->pd), PX = _mm256_loadu_pd((A)->px);                           \
    __m256d PQ = _mm256_loadu_pd((A)->pq), P4 = _mm256_loadu_pd((A)->p4);
#define AVX_STORE_SUMS(A, PX, PD, PQ, P4)                                                            \
    _mm256_storeu_pd((A)->pd, PD);                                                                   \
    _mm256_storeu_pd((A)->px, PX);                                                                   \
    _mm256_storeu_pd((A)->pq, PQ);                                                                   \
    _mm256_storeu_pd((A)->p4, P4);

/* Scalars ahead of the one being read that the vector bodies ask the cache for (a software
 * prefetch, one per step of eight): a scattered sum holds too few loads in flight for the
 * hardware prefetcher to keep up with memory. On a 2-core Intel Xeon (Sapphire Rapids) VM,
 * 2026-12-06, the monitor's sketch of 67M float32 values went from 0.44 to 0.88 G values/s
 * (benchmarks/sketch_speed.py); the sums are unchanged, bit for bit. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 512
#endif
/* n scalars, n a multiple of 8: two groups of four per step, in order. */
#define AVX_BODY(SELF, LD, SZ, LDR, SZR)                                                             \
    {                                                                                                \
        const __m256i sbit = _mm256_set1_epi64x((long long)0x8000000000000000ULL);                   \
        AVX_LOAD_SUMS(a, px, pd, pq, p4)                                                             \
        for (Py_ssize_t j = 0; j + 8 <= n; j += 8) {                                                 \
            __m256d x0, x1, r0 = px, r1 = px;                                                        \
            uint64_t c8;                                                                             \
            _mm_prefetch((const char *)(x + (j + PREFETCH_AHEAD) * (SZ)), _MM_HINT_T0);             \
            LD(x + j * (SZ), &x0, &x1);                                                              \
            if (!(SELF)) LDR(r + j * (SZR), &r0, &r1);                                               \
            memcpy(&c8, codes + j, 8);                                                               \
            AVX_GROUP(SELF, x0, r0, (uint32_t)c8)                                                    \
            AVX_GROUP(SELF, x1, r1, (uint32_t)(c8 >> 32))                                            \
        }                                                                                            \
        if (SELF) pd = px; /* <x, x> summed in the same order as |x|^2; x - x = 0 */                 \
        AVX_STORE_SUMS(a, px, pd, pq, p4)                                                            \
    }

/* Two files x and y of one dtype against one float64 reference, interleaved: each file's sums
 * see exactly the operations of AVX_BODY, and the two independent chains keep the core busy. */
#define AVX_BODY2(LD, SZ)                                                                            \
    {                                                                                                \
        const __m256i sbit = _mm256_set1_epi64x((long long)0x8000000000000000ULL);                   \
        AVX_LOAD_SUMS(a, px, pd, pq, p4)                                                             \
        AVX_LOAD_SUMS(b, qx, qd, qq, q4)                                                             \
        for (Py_ssize_t j = 0; j + 8 <= n; j += 8) {                                                 \
            __m256d x0, x1, y0, y1, r0, r1;                                                          \
            uint64_t c8;                                                                             \
            LD(x + j * (SZ), &x0, &x1);                                                              \
            LD(y + j * (SZ), &y0, &y1);                                                              \
            ld_f64(r + j * 8, &r0, &r1);                                                             \
            memcpy(&c8, codes + j, 8);                                                               \
            AVX_GROUP_TO(0, x0, r0, (uint32_t)c8, a, px, pd, pq, p4)                                 \
            AVX_GROUP_TO(0, y0, r0, (uint32_t)c8, b, qx, qd, qq, q4)                                 \
            AVX_GROUP_TO(0, x1, r1, (uint32_t)(c8 >> 32), a, px, pd, pq, p4)                         \
            AVX_GROUP_TO(0, y1, r1, (uint32_t)(c8 >> 32), b, qx, qd, qq, q4)                         \
        }                                                                                            \
        AVX_STORE_SUMS(a, px, pd, pq, p4)                                                            \
        AVX_STORE_SUMS(b, qx, qd, qq, q4)                                                            \
    }

/* Per dtype: a reference and a file of that dtype, the file against itself, (_rf64) a file of
 * that dtype against a reference already decoded to float64 (the audit decodes each block of the
 * reference once for all its files), and (_rf64x2) two such files at once. */
#define AVX_PAIR(NAME, LD, SZ)                                                                       \
    AVX2 static void NAME(const uint8_t *codes, const uint8_t *r, const uint8_t *x, Py_ssize_t n, Acc *a) \
        AVX_BODY(0, LD, SZ, LD, SZ)                                                                  \
    AVX2 static void NAME##_rf64(const uint8_t *codes, const uint8_t *r, const uint8_t *x, Py_ssize_t n,    \
                                 Acc *a) AVX_BODY(0, LD, SZ, ld_f64, 8)                              \
    AVX2 static void NAME##_rf64x2(const uint8_t *codes, const uint8_t *r, const uint8_t *x,              \
                                   const uint8_t *y, Py_ssize_t n, Acc *a, Acc *b) AVX_BODY2(LD, SZ)  \
    AVX2 static void NAME##_self(const uint8_t *codes, const uint8_t *x, Py_ssize_t n, Acc *a) {     \
        const uint8_t *r = x;                                                                        \
        (void)r;                                                                                     \
        AVX_BODY(1, LD, SZ, LD, SZ)                                                                  \
    }
AVX_PAIR(avx_f64, ld_f64, 8)
AVX_PAIR(avx_f32, ld_f32, 4)
AVX_PAIR(avx_bf16, ld_bf16, 2)
AVX_PAIR(avx_f16, ld_f16, 2)
AVX_PAIR(avx_e4m3fn, ld_e4m3fn, 1)
AVX_PAIR(avx_e5m2, ld_e5m2, 1)
AVX_PAIR(avx_e4m3fnuz, ld_e4m3fnuz, 1)
AVX_PAIR(avx_e5m2fnuz, ld_e5m2fnuz, 1)
AVX_PAIR(avx_e8m0, ld_e8m0, 1)

typedef void (*pair_fn)(const uint8_t *, const uint8_t *, const uint8_t *, Py_ssize_t, Acc *);
typedef void (*self_fn)(const uint8_t *, const uint8_t *, Py_ssize_t, Acc *);

/* Fused bodies for a reference and a file of one dtype, or a float64 reference and a file of
 * any dtype; other mixed dtypes convert first. */
static int fused(int rt, int xt, const uint8_t *ref, const uint8_t *x, const uint8_t *codes, Py_ssize_t n,
                 Acc *a) {
    static const pair_fn pair[T_COUNT] = {avx_f64,  avx_f32,      avx_f16,      avx_bf16, avx_e4m3fn,
                                          avx_e5m2, avx_e4m3fnuz, avx_e5m2fnuz, avx_e8m0};
    static const self_fn self[T_COUNT] = {avx_f64_self,      avx_f32_self,      avx_f16_self,
                                          avx_bf16_self,     avx_e4m3fn_self,   avx_e5m2_self,
                                          avx_e4m3fnuz_self, avx_e5m2fnuz_self, avx_e8m0_self};
    static const pair_fn rf64[T_COUNT] = {avx_f64_rf64,      avx_f32_rf64,      avx_f16_rf64,
                                          avx_bf16_rf64,     avx_e4m3fn_rf64,   avx_e5m2_rf64,
                                          avx_e4m3fnuz_rf64, avx_e5m2fnuz_rf64, avx_e8m0_rf64};
    if (!have_avx2 || (rt != xt && rt != T_F64)) return 0;
    if (ref == x)
        self[xt](codes, x, n, a);
    else if (rt == xt)
        pair[xt](codes, ref, x, n, a);
    else
        rf64[xt](codes, ref, x, n, a);
    return 1;
}
typedef void (*pair2_fn)(const uint8_t *, const uint8_t *, const uint8_t *, const uint8_t *, Py_ssize_t, Acc *,
                         Acc *);

/* Two files of dtype xt against a float64 reference block; 0 when there is no vector body. */
static int fused2(int xt, const uint8_t *ref, const uint8_t *x, const uint8_t *y, const uint8_t *codes,
                  Py_ssize_t n, Acc *a, Acc *b) {
    static const pair2_fn two[T_COUNT] = {avx_f64_rf64x2,      avx_f32_rf64x2,      avx_f16_rf64x2,
                                          avx_bf16_rf64x2,     avx_e4m3fn_rf64x2,   avx_e5m2_rf64x2,
                                          avx_e4m3fnuz_rf64x2, avx_e5m2fnuz_rf64x2, avx_e8m0_rf64x2};
    if (!have_avx2) return 0;
    two[xt](codes, ref, x, y, n, a, b);
    return 1;
}
#endif

/* Scalars [b, b + n) converted to double, then summed (the vector body for multiples of 8, the
 * portable one for the rest: whole groups of four stay whole, so the order is the same). */
static void block(const uint8_t *codes, const uint8_t *ref, int rt, const uint8_t *x, int xt, Py_ssize_t b,
                  Py_ssize_t n, Acc *a) {
    double xs[BLK], rs[BLK];
    convert(x + b * ITEMSIZE[xt], xt, n, xs);
    const double *r = xs;
    if (ref != x || rt != xt) {
        convert(ref + b * ITEMSIZE[rt], rt, n, rs);
        r = rs;
    }
    Py_ssize_t groups = 0;
#ifdef NAIG_AVX2
    if (have_avx2) {
        groups = n & ~(Py_ssize_t)7; /* the vector body takes multiples of 8 */
        if (r == xs)
            avx_f64_self(codes + b, (const uint8_t *)xs, groups, a);
        else
            avx_f64(codes + b, (const uint8_t *)r, (const uint8_t *)xs, groups, a);
    }
#endif
    lanes_scalar(codes + b + groups, xs + groups, r + groups, n - groups, a);
}

/* The running sums of one pass over a piece of m scalars, fed block by block: for R == 1 the
 * lanes of `a` (the fused bodies), for R > 1 `bank` (R x 4 x 16) and the lanes of `a`. */
typedef struct {
    Acc a;
    double *bank;
} Pass;

/* Add scalars [base, base + n) of the piece to the pass (codes, ref and x point at scalar base).
 * Every block but the last must hold a multiple of BLK scalars: whole groups of four and whole
 * blocks stay whole, so the sums are those of one call over the whole piece, bit for bit. */
static void feed1(const uint8_t *codes, const uint8_t *ref, int rt, const uint8_t *x, int xt, Py_ssize_t n,
                  Acc *a) {
    Py_ssize_t b = 0;
#ifdef NAIG_AVX2
    Py_ssize_t groups = n & ~(Py_ssize_t)7;
    if (fused(rt, xt, ref, x, codes, groups, a)) b = groups;
#endif
    for (; b < n; b += BLK) block(codes, ref, rt, x, xt, b, n - b < BLK ? n - b : BLK, a);
}

/* feed1 of two files x and y of one dtype against a reference block decoded to float64: the
 * same sums as two feed1 calls, bit for bit, with the vector bodies of both files interleaved. */
static void feed1x2(const uint8_t *codes, const double *rdec, const uint8_t *x, const uint8_t *y, int xt,
                    Py_ssize_t n, Acc *a, Acc *b) {
    const uint8_t *r = (const uint8_t *)rdec;
    Py_ssize_t groups = 0;
#ifdef NAIG_AVX2
    if (fused2(xt, r, x, y, codes, n & ~(Py_ssize_t)7, a, b)) groups = n & ~(Py_ssize_t)7;
#endif
    for (Py_ssize_t k = groups; k < n; k += BLK) block(codes, r, T_F64, x, xt, k, n - k < BLK ? n - k : BLK, a);
    for (Py_ssize_t k = groups; k < n; k += BLK) block(codes, r, T_F64, y, xt, k, n - k < BLK ? n - k : BLK, b);
}

/* R > 1 sketch seeds: one read of x, R scatters per scalar (portable body). `full` is the number
 * of scalars of the whole piece in full groups of four; base is a multiple of four. */
NAIG_CLONES
static void feed_many(const uint8_t *const *codes, int R, const uint8_t *ref, int rt, const uint8_t *x, int xt,
                      Py_ssize_t base, Py_ssize_t n, Py_ssize_t full, double *restrict bank, Acc *a) {
    double xs[BLK], rs[BLK];
    for (Py_ssize_t b = 0; b < n; b += BLK) {
        Py_ssize_t k = n - b < BLK ? n - b : BLK;
        convert(x + b * ITEMSIZE[xt], xt, k, xs);
        const double *r = xs;
        if (ref != x || rt != xt) {
            convert(ref + b * ITEMSIZE[rt], rt, k, rs);
            r = rs;
        }
        for (Py_ssize_t j = 0; j < k; j++) {
            int u = base + b + j < full ? (int)(j & 3) : 0;
            double xi = xs[j], ri = r[j], di = xi - ri, d2 = di * di;
            for (int s = 0; s < R; s++) {
                uint8_t c = codes[s][b + j];
                bank[(s * 4 + u) * 16 + (c & 15)] += SIGN[c >> 7] * xi;
            }
            a->pd[u] += xi * ri;
            a->px[u] += xi * xi;
            a->pq[u] += d2;
            a->p4[u] += d2 * d2;
        }
    }
}

static void feed(Pass *p, const uint8_t *const *codes, int R, const uint8_t *ref, int rt, const uint8_t *x,
                 int xt, Py_ssize_t base, Py_ssize_t n, Py_ssize_t full) {
    if (R == 1)
        feed1(codes[0], ref, rt, x, xt, n, &p->a);
    else
        feed_many(codes, R, ref, rt, x, xt, base, n, full, p->bank, &p->a);
}

/* Combine the lanes as (l0 + l1) + (l2 + l3) and add them to out (R x 18). */
static void finish(const Pass *p, int R, double *out) {
    double stats[4] = {combine(p->a.pd, 1), combine(p->a.px, 1), combine(p->a.pq, 1), combine(p->a.p4, 1)};
    for (int s = 0; s < R; s++) {
        double *o = out + s * NSTATS;
        const double *bank = R == 1 ? &p->a.bank[0][0] : p->bank + s * 64;
        for (int k = 0; k < 14; k++) o[k] += combine(bank + k, 16);
        for (int k = 0; k < 4; k++) o[14 + k] += stats[k];
    }
}

/* One pass over m scalars in memory. */
static void run(const uint8_t *const *codes, int R, const uint8_t *ref, int rt, const uint8_t *x, int xt,
                Py_ssize_t m, double *bank, double *out) {
    Pass p;
    memset(&p.a, 0, sizeof p.a);
    p.bank = bank;
    feed(&p, codes, R, ref, rt, x, xt, 0, m, m & ~(Py_ssize_t)3);
    finish(&p, R, out);
}

NAIG_CLONES
static void hash_run(uint64_t key, Py_ssize_t m, uint8_t *restrict codes) {
    for (Py_ssize_t i = 0; i < m; i++) {
        uint64_t z = key + (uint64_t)i + 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        codes[i] = (uint8_t)(((uint32_t)(z >> 32) % 14u) | ((uint32_t)(z & 1) << 7));
    }
}

static PyObject *hash_codes(PyObject *self, PyObject *args) {
    unsigned long long key, start;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "KKw*", &key, &start, &out)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    hash_run((uint64_t)key + (uint64_t)start, out.len, (uint8_t *)out.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static int check_type(int t) {
    if (t < 0 || t >= T_COUNT) {
        PyErr_Format(PyExc_ValueError, "accumulate: unknown dtype code %d", t);
        return 0;
    }
    return 1;
}

static PyObject *accumulate(PyObject *self, PyObject *args) {
    PyObject *codes_seq;
    Py_buffer ref, xb, ob;
    int rt, xt;
    if (!PyArg_ParseTuple(args, "O!y*iy*iw*", &PyTuple_Type, &codes_seq, &ref, &rt, &xb, &xt, &ob))
        return NULL;
    Py_ssize_t R = PyTuple_GET_SIZE(codes_seq), got = 0;
    Py_buffer *cb = PyMem_Calloc(R ? R : 1, sizeof(Py_buffer));
    const uint8_t **codes = PyMem_Calloc(R ? R : 1, sizeof(uint8_t *));
    double *bank = PyMem_Calloc((size_t)(R ? R : 1) * 64, sizeof(double));
    PyObject *result = NULL;
    if (!cb || !codes || !bank) {
        PyErr_NoMemory();
        goto done;
    }
    if (!check_type(rt) || !check_type(xt)) goto done;
    Py_ssize_t m = xb.len / ITEMSIZE[xt];
    for (; got < R; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(codes_seq, got), &cb[got], PyBUF_SIMPLE) < 0) goto done;
        codes[got] = (const uint8_t *)cb[got].buf;
        if (cb[got].len != m) break;
    }
    if (R < 1 || got < R || xb.len != m * ITEMSIZE[xt] || ref.len != m * ITEMSIZE[rt] ||
        ob.len != R * NSTATS * (Py_ssize_t)sizeof(double)) {
        if (got < R) got++; /* the mismatched buffer was acquired: release it below */
        PyErr_SetString(PyExc_ValueError,
                        "accumulate: expected R >= 1 code buffers of m bytes, ref and x of m stored "
                        "scalars each, out of R x 18 float64");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    run(codes, (int)R, (const uint8_t *)ref.buf, rt, (const uint8_t *)xb.buf, xt, m, bank, (double *)ob.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    for (Py_ssize_t s = 0; s < got; s++) PyBuffer_Release(&cb[s]);
    PyMem_Free(cb);
    PyMem_Free(codes);
    PyMem_Free(bank);
    PyBuffer_Release(&ref);
    PyBuffer_Release(&xb);
    PyBuffer_Release(&ob);
    return result;
}

/* Read exactly len bytes at off (retrying short reads and EINTR); 0 on success, -1 when the
 * file ends early or the read fails. */
static int read_full(int fd, uint8_t *buf, size_t len, off_t off) {
    while (len) {
        ssize_t k = pread(fd, buf, len, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        buf += k;
        len -= (size_t)k;
        off += k;
    }
    return 0;
}

typedef struct {
    int fd, type;
    long long offset; /* byte offset of the piece's first scalar */
} Source;

/* One piece of m scalars from F files, streamed in FILE_BLK blocks that stay in cache: each
 * block's codes are hashed once and its reference bytes read once, then every file's bytes
 * are read and fed to that file's pass. Row 0 is the reference itself (its pass reads nothing
 * more). Returns -1, or the first row whose read failed. */
static Py_ssize_t stream_files(const uint64_t *keys, int R, Py_ssize_t m, const Source *src, Py_ssize_t F,
                               uint8_t *work, Pass *passes, double *out) {
    uint8_t *xbuf = work, *ybuf = work + FILE_BLK * 8, *rbuf = ybuf + FILE_BLK * 8;
    double *rdec = (double *)(rbuf + FILE_BLK * 8); /* the reference block, decoded once */
    uint8_t *cbuf = (uint8_t *)(rdec + FILE_BLK);
    const uint8_t *codes[MAX_R];
    for (int s = 0; s < R; s++) codes[s] = cbuf + (size_t)s * FILE_BLK;
    Py_ssize_t full = m & ~(Py_ssize_t)3;
    for (Py_ssize_t base = 0; base < m; base += FILE_BLK) {
        Py_ssize_t n = m - base < FILE_BLK ? m - base : FILE_BLK;
        for (int s = 0; s < R; s++) hash_run(keys[s] + (uint64_t)base, n, cbuf + (size_t)s * FILE_BLK);
        Py_ssize_t rs = ITEMSIZE[src[0].type];
        if (read_full(src[0].fd, rbuf, (size_t)(n * rs), (off_t)(src[0].offset + base * rs))) return 0;
        feed(&passes[0], codes, R, rbuf, src[0].type, rbuf, src[0].type, base, n, full);
        if (F > 1) convert(rbuf, src[0].type, n, rdec); /* exact: the sums do not change */
        for (Py_ssize_t f = 1; f < F; f++) {
            int xt = src[f].type;
            size_t bytes = (size_t)(n * ITEMSIZE[xt]);
            if (read_full(src[f].fd, xbuf, bytes, (off_t)(src[f].offset + base * ITEMSIZE[xt]))) return f;
            if (R == 1 && f + 1 < F && src[f + 1].type == xt) { /* two files at once */
                if (read_full(src[f + 1].fd, ybuf, bytes, (off_t)(src[f + 1].offset + base * ITEMSIZE[xt])))
                    return f + 1;
                feed1x2(codes[0], rdec, xbuf, ybuf, xt, n, &passes[f].a, &passes[f + 1].a);
                f++;
                continue;
            }
            feed(&passes[f], codes, R, (const uint8_t *)rdec, T_F64, xbuf, xt, base, n, full);
        }
    }
    for (Py_ssize_t f = 0; f < F; f++) finish(&passes[f], R, out + f * R * NSTATS);
    return -1;
}

/* Parse ((fd, offset, type), ...) into src; 0 with an exception set on failure. */
static int parse_sources(PyObject *rows, Source *src, Py_ssize_t F) {
    for (Py_ssize_t f = 0; f < F; f++) {
        PyObject *row = PyTuple_GET_ITEM(rows, f);
        if (!PyTuple_Check(row) || !PyArg_ParseTuple(row, "iLi", &src[f].fd, &src[f].offset, &src[f].type)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "accumulate_files: rows are (fd, offset, type)");
            return 0;
        }
        if (!check_type(src[f].type)) return 0;
    }
    return 1;
}

static PyObject *accumulate_files(PyObject *self, PyObject *args) {
    PyObject *keys_seq, *rows;
    Py_ssize_t m;
    Py_buffer ob;
    if (!PyArg_ParseTuple(args, "O!nO!w*", &PyTuple_Type, &keys_seq, &m, &PyTuple_Type, &rows, &ob)) return NULL;
    Py_ssize_t R = PyTuple_GET_SIZE(keys_seq), F = PyTuple_GET_SIZE(rows), bad = -1;
    PyObject *result = NULL;
    uint64_t keys[MAX_R];
    Source *src = PyMem_Calloc(F ? F : 1, sizeof(Source));
    Pass *passes = PyMem_Calloc(F ? F : 1, sizeof(Pass));
    double *banks = PyMem_Calloc((size_t)(F ? F : 1) * (size_t)R * 64, sizeof(double));
    uint8_t *work = PyMem_Malloc((size_t)FILE_BLK * (32 + (size_t)(R ? R : 1)));
    if (!src || !passes || !banks || !work) {
        PyErr_NoMemory();
        goto done;
    }
    if (R < 1 || R > MAX_R || F < 1 || m < 0 || ob.len != F * R * NSTATS * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "accumulate_files: expected 1..%d keys, >= 1 rows, m >= 0 and an out of "
                     "rows x R x 18 float64", MAX_R);
        goto done;
    }
    for (Py_ssize_t s = 0; s < R; s++) {
        keys[s] = (uint64_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(keys_seq, s));
        if (PyErr_Occurred()) goto done;
    }
    if (!parse_sources(rows, src, F)) goto done;
    for (Py_ssize_t f = 0; f < F; f++) passes[f].bank = banks + (size_t)f * (size_t)R * 64;
    Py_BEGIN_ALLOW_THREADS
    bad = stream_files(keys, (int)R, m, src, F, work, passes, (double *)ob.buf);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(bad);
done:
    PyMem_Free(src);
    PyMem_Free(passes);
    PyMem_Free(banks);
    PyMem_Free(work);
    PyBuffer_Release(&ob);
    return result;
}

/* The monitor's sketch (naig.monitor.signals.MonitorSketch): pieces of tensors in memory, read once.
 * Piece p is (address, type, length, start, row): `length` stored scalars at `address` that are the
 * flat indices start .. start + length - 1 of the tensor whose R keys are keys[row * R .. + R).
 * Each piece is hashed and summed in blocks of MON_BLK scalars (codes in a buffer that stays in the
 * first-level cache, the block read from memory once and from cache for blocks r > 0; 1024 rather
 * than 16384: with the prefetch, 0.88 -> 0.96 G values/s on the machine above; with AVX-512 the block's
 * multiples of 8 go through mon_block's fused body, 1.08 G values/s there); out (R * 14 + 2 float64):
 * out[r * 14 + a] += (S_r x)_a, out[R * 14] += |x|^2 (both in the four float64 lanes of feed1),
 * out[R * 14 + 1] += the number of non-finite scalars, counted in a second pass only when |x|^2
 * is not finite (a finite float64 sum of squares has no NaN or infinite term). */
#ifndef MON_BLK
#define MON_BLK 1024
#endif

static double count_nonfinite(const uint8_t *x, int t, Py_ssize_t len) {
    double xs[BLK], bad = 0;
    for (Py_ssize_t b = 0; b < len; b += BLK) {
        Py_ssize_t n = len - b < BLK ? len - b : BLK;
        convert(x + b * ITEMSIZE[t], t, n, xs);
        for (Py_ssize_t j = 0; j < n; j++) bad += !isfinite(xs[j]);
    }
    return bad;
}

#ifdef NAIG_AVX2
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,f16c")))
#define AVX512IFMA __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512ifma,avx2,f16c")))
static int have_avx512, have_ifma;

/* splitmix64 of eight hash inputs z = key + i + 0x9E3779B97F4A7C15, as in hash_run. */
AVX512 static inline __m512i mix8(__m512i z) {
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                           _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ULL));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                           _mm512_set1_epi64((long long)0x94D049BB133111EBULL));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}
/* lanes + (z >> 32) mod 14: q = ((z >> 33) * 0x92492493) >> 34 is (z >> 32) / 14 for every
 * 31-bit z >> 33 (7 * 0x92492493 - 2^34 = 5 and 5 * 2^31 < 2^34) ... */
AVX512 static inline __m512i bucket8(__m512i z, __m512i lanes) {
    __m512i q = _mm512_srli_epi64(_mm512_mul_epu32(_mm512_srli_epi64(z, 33), _mm512_set1_epi64(0x92492493LL)), 34);
    return _mm512_add_epi64(_mm512_sub_epi64(_mm512_srli_epi64(z, 32), _mm512_mul_epu32(q, _mm512_set1_epi64(14))),
                            lanes);
}
/* ... or with 52-bit multiplies (Lemire, Kaser and Kurz 2019, "Faster remainder by direct
 * computation"): with M = ceil(2^52 / 14), h mod 14 = ((M h mod 2^52) * 14) >> 52 for every
 * 32-bit h (checked for all 2^32), two instructions instead of five. */
AVX512IFMA static inline __m512i bucket8_ifma(__m512i z, __m512i lanes) {
    __m512i low = _mm512_madd52lo_epu64(_mm512_setzero_si512(), _mm512_srli_epi64(z, 32),
                                        _mm512_set1_epi64(0x124924924924aLL));
    return _mm512_madd52hi_epu64(lanes, low, _mm512_set1_epi64(14));
}

/* The monitor's body with the hash inside the loop (AVX-512): the codes of eight scalars are
 * computed in vectors (ports the scattered sum does not use) and their signed values and bucket
 * offsets written to a ring of MON_RING; the scalars MON_LAG behind are added to their buckets
 * in the same iteration, from stores long retired (read right after a vector store, each scalar
 * load waits for it: 0.67 G values/s instead of 1.1). Lanes, groups and the order of every
 * float64 addition are those of AVX_BODY(1, ...) on hash_run's codes: the sums are the same bit
 * for bit, but for the sign of a NaN sum (see isa above). n is a multiple of 8. */
#define MON_LAG 64
#define MON_RING 128
#define MON_AVX512(NAME, TARGET, BUCKET, LD, SZ)                                                     \
    TARGET static void NAME(uint64_t key, const uint8_t *x, Py_ssize_t n, Acc *a) {                  \
        const __m512i lanes = _mm512_setr_epi64(0, 16, 32, 48, 0, 16, 32, 48), one = _mm512_set1_epi64(1); \
        const __m256d sbit = _mm256_castsi256_pd(_mm256_set1_epi64x((long long)0x8000000000000000ULL)); \
        __m512i i = _mm512_add_epi64(_mm512_set1_epi64((long long)(key + 0x9E3779B97F4A7C15ULL)),   \
                                     _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));                     \
        double *bank = &a->bank[0][0], t[MON_RING];                                                  \
        int64_t o[MON_RING];                                                                         \
        __m256d px = _mm256_loadu_pd(a->px);                                                         \
        Py_ssize_t j = 0;                                                                            \
        for (; j < n; j += 8) {                                                                      \
            __m512i z = mix8(i);                                                                     \
            i = _mm512_add_epi64(i, _mm512_set1_epi64(8));                                           \
            __mmask8 neg = _mm512_test_epi64_mask(z, one);                                           \
            __m256d x0, x1;                                                                          \
            _mm_prefetch((const char *)(x + (j + PREFETCH_AHEAD) * (SZ)), _MM_HINT_T0);             \
            LD(x + j * (SZ), &x0, &x1);                                                              \
            Py_ssize_t w = j & (MON_RING - 1), r = (j - MON_LAG) & (MON_RING - 1);                   \
            _mm256_storeu_pd(t + w, _mm256_mask_xor_pd(x0, neg & 15, x0, sbit));                     \
            _mm256_storeu_pd(t + w + 4, _mm256_mask_xor_pd(x1, neg >> 4, x1, sbit));                 \
            _mm512_storeu_si512(o + w, BUCKET(z, lanes));                                            \
            px = _mm256_add_pd(_mm256_add_pd(px, _mm256_mul_pd(x0, x0)), _mm256_mul_pd(x1, x1));     \
            if (j >= MON_LAG)                                                                        \
                for (int k = 0; k < 8; k++) bank[o[r + k]] += t[r + k];                              \
        }                                                                                            \
        for (Py_ssize_t k = n > MON_LAG ? n - MON_LAG : 0; k < n; k++)                               \
            bank[o[k & (MON_RING - 1)]] += t[k & (MON_RING - 1)];                                    \
        _mm256_storeu_pd(a->px, px);                                                                 \
        _mm256_storeu_pd(a->pd, px); /* <x, x> as AVX_BODY(1, ...) leaves it */                      \
    }
#define MON_DTYPES(PRE, TARGET, BUCKET)                                                              \
    MON_AVX512(PRE##_f64, TARGET, BUCKET, ld_f64, 8)                                                 \
    MON_AVX512(PRE##_f32, TARGET, BUCKET, ld_f32, 4)                                                 \
    MON_AVX512(PRE##_f16, TARGET, BUCKET, ld_f16, 2)                                                 \
    MON_AVX512(PRE##_bf16, TARGET, BUCKET, ld_bf16, 2)
MON_DTYPES(mon, AVX512, bucket8)
MON_DTYPES(mon_ifma, AVX512IFMA, bucket8_ifma)
#endif

/* Add the n scalars x of type t (hash key `key` at the first) to the sums a: the fused AVX-512
 * body for the multiples of 8 where it applies, hash_run and feed1 for the rest. */
static void mon_block(uint64_t key, const uint8_t *x, int t, Py_ssize_t n, Acc *a, uint8_t *codes) {
    Py_ssize_t done = 0;
#ifdef NAIG_AVX2
    typedef void (*mon_fn)(uint64_t, const uint8_t *, Py_ssize_t, Acc *);
    static const mon_fn plain[4] = {mon_f64, mon_f32, mon_f16, mon_bf16};
    static const mon_fn ifma[4] = {mon_ifma_f64, mon_ifma_f32, mon_ifma_f16, mon_ifma_bf16};
    if (have_avx512 && t <= T_BF16) {
        done = n & ~(Py_ssize_t)7;
        (have_ifma ? ifma : plain)[t](key, x, done, a);
    }
#endif
    if (done == n) return;
    hash_run(key + (uint64_t)done, n - done, codes);
    const uint8_t *xr = x + done * ITEMSIZE[t];
    feed1(codes, xr, t, xr, t, n - done, a);
}

static void monitor_run(const int64_t *pieces, Py_ssize_t P, const uint64_t *keys, int R, Acc *acc,
                        uint8_t *codes, double *out) {
    for (Py_ssize_t p = 0; p < P; p++) {
        const int64_t *pc = pieces + 5 * p;
        const uint8_t *x = (const uint8_t *)(uintptr_t)pc[0];
        int t = (int)pc[1];
        Py_ssize_t len = (Py_ssize_t)pc[2];
        uint64_t start = (uint64_t)pc[3];
        const uint64_t *k = keys + (size_t)pc[4] * (size_t)R;
        for (Py_ssize_t base = 0; base < len; base += MON_BLK) {
            Py_ssize_t n = len - base < MON_BLK ? len - base : MON_BLK;
            const uint8_t *xb = x + base * ITEMSIZE[t];
            for (int r = 0; r < R; r++) mon_block(k[r] + start + (uint64_t)base, xb, t, n, &acc[r], codes);
        }
    }
    for (int r = 0; r < R; r++)
        for (int a = 0; a < 14; a++) out[r * 14 + a] += combine(&acc[r].bank[0][a], 16);
    double sq = combine(acc[0].px, 1);
    out[R * 14] += sq;
    if (isfinite(sq)) return;
    for (Py_ssize_t p = 0; p < P; p++) {
        const int64_t *pc = pieces + 5 * p;
        out[R * 14 + 1] += count_nonfinite((const uint8_t *)(uintptr_t)pc[0], (int)pc[1], (Py_ssize_t)pc[2]);
    }
}

static PyObject *monitor_sketch(PyObject *self, PyObject *args) {
    Py_buffer pb, kb, ob;
    int R;
    if (!PyArg_ParseTuple(args, "y*y*iw*", &pb, &kb, &R, &ob)) return NULL;
    PyObject *result = NULL;
    Acc *acc = NULL;
    uint8_t *codes = NULL;
    Py_ssize_t P = pb.len / (5 * (Py_ssize_t)sizeof(int64_t)), T = R > 0 ? kb.len / (8 * (Py_ssize_t)R) : 0;
    if (R < 1 || pb.len != P * 5 * (Py_ssize_t)sizeof(int64_t) || kb.len != T * R * 8 ||
        ob.len != (R * 14 + 2) * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "monitor_sketch: expected P x 5 int64 pieces, T x R uint64 keys, "
                        "R >= 1 and an out of R * 14 + 2 float64");
        goto done;
    }
    const int64_t *pieces = (const int64_t *)pb.buf;
    for (Py_ssize_t p = 0; p < P; p++) {
        const int64_t *pc = pieces + 5 * p;
        if (!check_type((int)pc[1])) goto done;
        if (pc[2] < 0 || pc[3] < 0 || pc[4] < 0 || pc[4] >= T || (pc[2] > 0 && pc[0] == 0)) {
            PyErr_Format(PyExc_ValueError, "monitor_sketch: piece %zd has a bad length, start, row or address", p);
            goto done;
        }
    }
    acc = PyMem_Calloc((size_t)R, sizeof(Acc));
    codes = PyMem_Malloc(MON_BLK);
    if (!acc || !codes) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    monitor_run(pieces, P, (const uint64_t *)kb.buf, R, acc, codes, (double *)ob.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(acc);
    PyMem_Free(codes);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&ob);
    return result;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer raw, ob;
    int t;
    if (!PyArg_ParseTuple(args, "y*iw*", &raw, &t, &ob)) return NULL;
    PyObject *result = NULL;
    if (!check_type(t)) goto done;
    Py_ssize_t m = raw.len / ITEMSIZE[t];
    if (raw.len != m * ITEMSIZE[t] || ob.len != m * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "decode: expected m stored scalars and an out of m float64");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    convert((const uint8_t *)raw.buf, t, m, (double *)ob.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&raw);
    PyBuffer_Release(&ob);
    return result;
}

static PyObject *isa(PyObject *self, PyObject *args) {
#ifdef NAIG_AVX2
    return PyUnicode_FromString(have_ifma ? "avx512-ifma" : have_avx512 ? "avx512" : have_avx2 ? "avx2" : "portable");
#else
    return PyUnicode_FromString("portable");
#endif
}

static PyMethodDef methods[] = {
    {"isa", isa, METH_NOARGS, "isa(): the vector bodies in use: avx512-ifma, avx512, avx2 or portable."},
    {"hash_codes", hash_codes, METH_VARARGS, "hash_codes(key, start, out_uint8): sketch codes."},
    {"accumulate", accumulate, METH_VARARGS,
     "accumulate(codes_tuple, ref, ref_type, x, x_type, out_R_by_18): fused pass."},
    {"decode", decode, METH_VARARGS, "decode(raw, type, out_float64): exact upcast."},
    {"monitor_sketch", monitor_sketch, METH_VARARGS,
     "monitor_sketch(pieces_Px5_int64, keys_TxR_uint64, R, out_R14plus2): the monitor's one-read sketch "
     "of tensors in memory."},
    {"accumulate_files", accumulate_files, METH_VARARGS,
     "accumulate_files(keys_tuple, m, ((fd, offset, type), ...), out_F_by_R_by_18): a piece read from files; "
     "returns -1 or the first row whose read failed."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernel(void) {
    init_tables();
#ifdef NAIG_AVX2
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    have_avx512 = have_avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    have_ifma = have_avx512 && __builtin_cpu_supports("avx512ifma");
    /* NAIG_KERNEL_ISA caps the vector bodies (tests compare every body on one machine). */
    const char *raw = getenv("NAIG_KERNEL_ISA");
    char cap[16] = "";  /* the value without surrounding white space (any case); longer: no body's name */
    if (raw) {
        size_t a = 0, b = strlen(raw);
        while (a < b && isspace((unsigned char)raw[a])) a++;
        while (b > a && isspace((unsigned char)raw[b - 1])) b--;
        if (b - a < sizeof cap) { memcpy(cap, raw + a, b - a); cap[b - a] = 0; }
        else strcpy(cap, "?");
    }
    int level = !*cap || !strcasecmp(cap, "avx512-ifma") ? 4 : !strcasecmp(cap, "avx512") ? 3
              : !strcasecmp(cap, "avx2") ? 2 : !strcasecmp(cap, "portable") ? 1 : 0;
    if (level == 0) {  /* said once per process (at import), quoted: %R escapes a newline */
        PyObject *value = PyUnicode_DecodeFSDefault(raw);
        int failed = !value || PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                                                "NAIG_KERNEL_ISA=%.60R is not portable, avx2, avx512 or "
                                                "avx512-ifma: ignored (the CPU's best bodies used)", value) < 0;
        Py_XDECREF(value);
        if (failed)
            return NULL;
        level = 4;
    }
    if (level == 1) have_avx2 = 0;
    if (level == 1 || level == 2) have_avx512 = 0;
    if (level >= 1 && level <= 3) have_ifma = 0;
#endif
    return PyModule_Create(&module);
}
