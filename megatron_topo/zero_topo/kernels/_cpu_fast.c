/* Single-pass-per-block CPU kernels for the block quantization format of reference.py.
 *
 * The reference is the definition; this file must match it bit for bit. How:
 *   - every fp32 operation the reference does is done once, in the same order, as a plain IEEE
 *     operation: x / scale is a true division, dequantization is (float)q * scale, sums are
 *     ((d0 + d1) + d2) + ..., accumulate adds the finished sum into out. The file is compiled with
 *     -ffp-contract=off (never an FMA) and without -ffast-math.
 *   - absmax is an integer max over |x|'s bit patterns (sign bit cleared): for non-negative IEEE
 *     values the integer order is the float order, and NaN/inf have the largest patterns, so one
 *     compare tells a non-finite block (scale NaN, payload 0, as the reference).
 *   - round half to even of y in [-qmax, qmax] is (y + 1.5*2**23)'s low mantissa bits (the add
 *     rounds to an integer in the current rounding mode, i.e. half to even); clamping first is the
 *     same as clamping after (rounding is monotone and qmax is an integer).
 *   - a block whose scale is not > 0 (all zero, underflowed, or NaN) gets a zero payload, which is
 *     what the reference's nan_to_num(x / scale) gives.
 *   - bf16 <-> fp32 on the bit patterns (round to nearest even, as torch); fp16 with the compiler's
 *     F16C instructions, else the compiler's _Float16, else exact integer code (all IEEE, RNE).
 * Each function handles blocks [b0, b1) so the caller can split work between threads.
 */
#include <stdint.h>
#include <string.h>

#define DT_F32 0
#define DT_BF16 1
#define DT_F16 2
#define MAXB 8192
#define ROUND_MAGIC 12582912.0f /* 1.5 * 2**23 */
#define ROUND_BITS 0x4B400000u

typedef int64_t i64;

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

#if defined(__F16C__) && !defined(MT_NO_F16C)
#include <immintrin.h>
#define F16_IMPL 2 /* F16C instructions (IEEE conversions, round to nearest even) */
static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f32_to_f16(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
static void f16_to_f32_n(const uint16_t *src, i64 n, float *dst) {
    i64 i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = f16_to_f32(src[i]);
}
static void f32_to_f16_n(const float *src, i64 n, uint16_t *dst) {
    i64 i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = f32_to_f16(src[i]);
}
#else
#if defined(__FLT16_MANT_DIG__) && !defined(MT_NO_FLOAT16)
#define F16_IMPL 1 /* the compiler's _Float16 */
static inline float f16_to_f32(uint16_t h) { _Float16 v; memcpy(&v, &h, 2); return (float)v; }
static inline uint16_t f32_to_f16(float f) { _Float16 v = (_Float16)f; uint16_t h; memcpy(&h, &v, 2); return h; }
#else
#define F16_IMPL 0 /* integer code */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) return u2f(f2u((float)m * 0x1p-24f) | sign); /* zero/subnormal: exact, normal fp32 */
    if (e == 31) return u2f(sign | 0x7F800000u | (m << 13));
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}
static inline uint16_t f32_to_f16(float f) { /* IEEE round to nearest even, integer only */
    uint32_t u = f2u(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: inf */
    if (a >= 0x38800000u) { /* normal fp16 */
        uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
        r = r + 0xFFFu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return (uint16_t)sign; /* < 2**-25: rounds to 0 */
    { /* subnormal fp16: value = mant * 2**(e-150); result = round(value / 2**-24) */
        uint32_t e = a >> 23, mant = (a & 0x7FFFFFu) | 0x800000u, shift = 126u - e; /* 14..24 */
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
}
#endif
static void f16_to_f32_n(const uint16_t *src, i64 n, float *dst) {
    for (i64 i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}
static void f32_to_f16_n(const float *src, i64 n, uint16_t *dst) {
    for (i64 i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}
#endif

/* ---------------------------------------------------------------------------- quantize */

/* absmax bit pattern (sign cleared) over n elements; fp32 pattern for every dtype */
static uint32_t absmax_bits(const void *x, int dt, i64 n) {
    if (dt == DT_F32) {
        const uint32_t *p = (const uint32_t *)x;
        uint32_t m = 0;
        for (i64 i = 0; i < n; i++) { uint32_t a = p[i] & 0x7FFFFFFFu; m = a > m ? a : m; }
        return m;
    }
    const uint16_t *p = (const uint16_t *)x;
    uint16_t m = 0;
    for (i64 i = 0; i < n; i++) { uint16_t a = p[i] & 0x7FFFu; m = a > m ? a : m; }
    if (dt == DT_BF16) return (uint32_t)m << 16;
    if (m >= 0x7C00u) return 0x7F800000u | ((uint32_t)(m & 0x3FFu) << 13) | (m > 0x7C00u); /* inf/NaN */
    return f2u(f16_to_f32(m));
}

/* y = x / s for one block of n elements in fp32 */
static void load_f32(const void *x, int dt, i64 n, float *dst) {
    if (dt == DT_BF16) {
        const uint16_t *p = (const uint16_t *)x;
        for (i64 i = 0; i < n; i++) dst[i] = bf16_to_f32(p[i]);
    } else if (dt == DT_F16) {
        f16_to_f32_n((const uint16_t *)x, n, dst);
    } else {
        memcpy(dst, x, (size_t)n * 4);
    }
}

/* quantize one full block of fp32 values (already upcast), scale known and > 0 */
static void quant_values8(const float *xs, i64 B, float s, float qmax, int8_t *q) {
    for (i64 i = 0; i < B; i++) {
        float y = xs[i] / s;
        y = y > qmax ? qmax : y;
        y = y < -qmax ? -qmax : y;
        q[i] = (int8_t)(int32_t)(f2u(y + ROUND_MAGIC) - ROUND_BITS);
    }
}

static void quant_values4(const float *xs, i64 B, float s, float qmax, uint8_t *q) {
    for (i64 j = 0; j < B / 2; j++) {
        float y0 = xs[2 * j] / s, y1 = xs[2 * j + 1] / s;
        y0 = y0 > qmax ? qmax : y0;
        y0 = y0 < -qmax ? -qmax : y0;
        y1 = y1 > qmax ? qmax : y1;
        y1 = y1 < -qmax ? -qmax : y1;
        uint32_t a = f2u(y0 + ROUND_MAGIC) - ROUND_BITS, b = f2u(y1 + ROUND_MAGIC) - ROUND_BITS;
        q[j] = (uint8_t)((a & 0xFu) | ((b & 0xFu) << 4));
    }
}

static void quant_values8_bf16(const uint16_t *xs, i64 B, float s, float qmax, int8_t *q) {
    for (i64 i = 0; i < B; i++) {
        float y = bf16_to_f32(xs[i]) / s;
        y = y > qmax ? qmax : y;
        y = y < -qmax ? -qmax : y;
        q[i] = (int8_t)(int32_t)(f2u(y + ROUND_MAGIC) - ROUND_BITS);
    }
}

/* scale from the absmax pattern: NaN for a non-finite block, else absmax / qmax */
static inline float block_scale(uint32_t am, float qmax) {
    if (am >= 0x7F800000u) return u2f(0x7FC00000u);
    return u2f(am) / qmax;
}

/* one block (B elements at x, all valid), output payload q (int8 B or uint8 B/2), scale *s */
static void quant_block(const void *x, int dt, i64 B, int bits, void *q, float *s, float *buf) {
    float qmax = bits == 8 ? 127.0f : 7.0f;
    float sc = block_scale(absmax_bits(x, dt, B), qmax);
    *s = sc;
    i64 qbytes = bits == 8 ? B : B / 2;
    if (!(sc > 0.0f)) { memset(q, 0, (size_t)qbytes); return; }
    if (dt == DT_F16) { f16_to_f32_n((const uint16_t *)x, B, buf); x = buf; dt = DT_F32; }
    if (bits == 8) {
        if (dt == DT_F32) quant_values8((const float *)x, B, sc, qmax, (int8_t *)q);
        else quant_values8_bf16((const uint16_t *)x, B, sc, qmax, (int8_t *)q);
    } else {
        const float *xs = (const float *)x;
        if (dt != DT_F32) { load_f32(x, dt, B, buf); xs = buf; }
        quant_values4(xs, B, sc, qmax, (uint8_t *)q);
    }
}

/* x: n valid elements (dtype dt); blocks [b0, b1) of size B; q, s: the whole outputs */
void mt_quantize(const void *x, int dt, i64 n, i64 B, int bits, i64 b0, i64 b1, void *q, float *s) {
    static __thread float buf[MAXB];
    static __thread uint16_t hbuf[MAXB];
    int es = dt == DT_F32 ? 4 : 2;
    i64 qw = bits == 8 ? B : B / 2;
    for (i64 b = b0; b < b1; b++) {
        const char *xb = (const char *)x + b * B * es;
        void *qb = (char *)q + b * qw;
        i64 valid = n - b * B;
        if (valid >= B) {
            quant_block(xb, dt, B, bits, qb, s + b, buf);
        } else { /* ragged last block, zero padded */
            void *pad = dt == DT_F32 ? (void *)buf : (void *)hbuf;
            memcpy(pad, xb, (size_t)(valid * es));
            memset((char *)pad + valid * es, 0, (size_t)((B - valid) * es));
            if (dt == DT_F32) {
                static __thread float fbuf[MAXB];
                quant_block(pad, dt, B, bits, qb, s + b, fbuf);
            } else {
                quant_block(pad, dt, B, bits, qb, s + b, buf);
            }
        }
    }
}

/* ---------------------------------------------------------------------------- dequantize */

/* dst[i] = (float)q[i] * s over one block (B values) */
static inline void deq_block(const void *q, int bits, i64 B, float s, float *dst) {
    if (bits == 8) {
        const int8_t *p = (const int8_t *)q;
        for (i64 i = 0; i < B; i++) dst[i] = (float)p[i] * s;
    } else {
        const uint8_t *p = (const uint8_t *)q;
        for (i64 j = 0; j < B / 2; j++) {
            int8_t lo = (int8_t)(uint8_t)(p[j] << 4), hi = (int8_t)p[j];
            dst[2 * j] = (float)(lo >> 4) * s;
            dst[2 * j + 1] = (float)(hi >> 4) * s;
        }
    }
}

/* dst[i] += (float)q[i] * s (the product rounded first) */
static inline void deq_add_block(const void *q, int bits, i64 B, float s, float *dst) {
    if (bits == 8) {
        const int8_t *p = (const int8_t *)q;
        for (i64 i = 0; i < B; i++) dst[i] = dst[i] + (float)p[i] * s;
    } else {
        const uint8_t *p = (const uint8_t *)q;
        for (i64 j = 0; j < B / 2; j++) {
            int8_t lo = (int8_t)(uint8_t)(p[j] << 4), hi = (int8_t)p[j];
            dst[2 * j] = dst[2 * j] + (float)(lo >> 4) * s;
            dst[2 * j + 1] = dst[2 * j + 1] + (float)(hi >> 4) * s;
        }
    }
}

static void store_cast(const float *src, i64 n, int dt, void *out) {
    if (dt == DT_F32) {
        memcpy(out, src, (size_t)n * 4);
    } else if (dt == DT_BF16) {
        uint16_t *o = (uint16_t *)out;
        for (i64 i = 0; i < n; i++) o[i] = f32_to_bf16(src[i]);
    } else {
        f32_to_f16_n(src, n, (uint16_t *)out);
    }
}

/* out (n elements, dtype dt) from blocks [b0, b1) */
void mt_dequantize(const void *q, const float *s, int bits, i64 B, i64 n, i64 b0, i64 b1,
                   void *out, int dt) {
    static __thread float buf[MAXB];
    int es = dt == DT_F32 ? 4 : 2;
    i64 qw = bits == 8 ? B : B / 2;
    for (i64 b = b0; b < b1; b++) {
        i64 valid = n - b * B;
        valid = valid < B ? valid : B;
        char *ob = (char *)out + b * B * es;
        if (dt == DT_F32 && valid == B) {
            deq_block((const char *)q + b * qw, bits, B, s[b], (float *)ob);
        } else {
            deq_block((const char *)q + b * qw, bits, B, s[b], buf);
            store_cast(buf, valid, dt, ob);
        }
    }
}

/* k stacked payloads (row strides in bytes / floats); acc = ((d0 + d1) + ...) per block */
static inline void sum_block(const char *q, i64 qstride, const float *s, i64 sstride, i64 k,
                             int bits, i64 B, i64 b, float *acc) {
    i64 qw = bits == 8 ? B : B / 2;
    deq_block(q + b * qw, bits, B, s[b], acc);
    for (i64 j = 1; j < k; j++) deq_add_block(q + j * qstride + b * qw, bits, B, s[j * sstride + b], acc);
}

void mt_dequant_sum(const void *q, i64 qstride, const float *s, i64 sstride, i64 k, int bits, i64 B,
                    i64 n, i64 b0, i64 b1, float *out, int accumulate) {
    static __thread float buf[MAXB];
    for (i64 b = b0; b < b1; b++) {
        i64 valid = n - b * B;
        valid = valid < B ? valid : B;
        float *ob = out + b * B;
        if (!accumulate && valid == B) {
            sum_block((const char *)q, qstride, s, sstride, k, bits, B, b, ob);
            continue;
        }
        sum_block((const char *)q, qstride, s, sstride, k, bits, B, b, buf);
        if (accumulate) for (i64 i = 0; i < valid; i++) ob[i] = ob[i] + buf[i];
        else memcpy(ob, buf, (size_t)valid * 4);
    }
}

void mt_dequant_sum_requant(const void *q, i64 qstride, const float *s, i64 sstride, i64 k, int bits,
                            i64 B, int out_bits, i64 b0, i64 b1, void *q_out, float *s_out) {
    static __thread float buf[MAXB];
    static __thread float buf2[MAXB];
    i64 ow = out_bits == 8 ? B : B / 2;
    for (i64 b = b0; b < b1; b++) {
        sum_block((const char *)q, qstride, s, sstride, k, bits, B, b, buf);
        quant_block(buf, DT_F32, B, out_bits, (char *)q_out + b * ow, s_out + b, buf2);
    }
}

int mt_abi_version(void) { return 1; }
int mt_f16_impl(void) { return F16_IMPL; }
