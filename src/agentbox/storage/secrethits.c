/* One pass over a buffer for the secret scan's pre-filter (storage/secretwindows.py):
 * every offset where a needle matches, in the bytes themselves and, in the same pass, in
 * their even and odd bytes (the two views that turn UTF-16 into plain text), without
 * copying either view out.
 *
 * A needle is a sequence of elements, each a set of bytes (a 256-bit map) repeated a fixed
 * number of times: literals, case-folded literals and shapes such as ":" then 35 token
 * bytes. In a case-folded needle a letter s, k or i may also be the UTF-8 of a letter
 * that Python's IGNORECASE takes for it (long s, Kelvin sign, dotted and dotless i): the
 * detectors run on decoded text, so "\u017fecret" is a "secret" to them, and to this pass.
 *
 * The loop costs one table load per byte and view: a bitmap of the two-byte starts any
 * needle can have (a few hundred of 65536). Only where it says yes are the needles tried.
 * Built as a shared library and called through ctypes, which releases the GIL for the
 * call: no process per file, no copy of the buffer, other threads run meanwhile. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

#define ELEM 40 /* 32 bytes of byte set, uint32 repeat count, uint32 fold traps */
#define MAX_NEEDLES 256
#define PER_FIRST 32
#define TRAP_S 1u /* U+017F, C5 BF */
#define TRAP_K 2u /* U+212A, E2 84 AA */
#define TRAP_I 4u /* U+0130 and U+0131, C4 B0 and C4 B1 */

struct compiled {
    uint32_t needles;
    uint32_t offset[MAX_NEEDLES]; /* of each needle's elements in the program */
    uint32_t sizes[MAX_NEEDLES];  /* elements */
    uint32_t folded[MAX_NEEDLES];
    uint8_t first[256];                  /* needles that can start with each byte */
    uint8_t by_first[256][PER_FIRST];    /* which, in program order */
    uint8_t pairs[8192];                 /* bit (b0 << 8 | b1): some needle starts so */
    /* A coarser filter for 32 bytes at a time (AVX2), of the needles' first three bytes:
     * in 8 buckets, each byte looked up by its low and its high nibble (tables 0-1: the
     * first byte, 2-3: the second, 4-5: the third; a bit per bucket). */
    uint8_t nibbles[6][16];
    int avx2;
};

#ifdef HAVE_AVX2_PATH
static int have_avx2(void) {
    static int known = -1; /* a race here only computes the same answer twice */
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") != 0;
    }
    return known;
}
#endif

size_t secret_compiled_size(void) { return sizeof(struct compiled); }

static inline int in_set(const uint8_t *set, uint8_t b) { return set[b >> 3] & (1u << (b & 7)); }

/* Bytes (in steps of stride) of the fold trap at p that stands for a letter of traps. */
static inline size_t trap_width(const uint8_t *buf, size_t len, size_t p, size_t stride,
                                uint32_t traps) {
    uint8_t b = buf[p];
    size_t q = p + stride, r = p + 2 * stride;
    if ((traps & TRAP_S) && b == 0xC5 && q < len && buf[q] == 0xBF) return 2;
    if ((traps & TRAP_I) && b == 0xC4 && q < len && (buf[q] == 0xB0 || buf[q] == 0xB1))
        return 2;
    if ((traps & TRAP_K) && b == 0xE2 && r < len && buf[q] == 0x84 && buf[r] == 0xAA) return 3;
    return 0;
}

static int match_at(const uint8_t *buf, size_t len, size_t at, size_t stride,
                    const uint8_t *elems, uint32_t n, uint32_t folded) {
    size_t p = at;
    for (uint32_t e = 0; e < n; e++) {
        const uint8_t *set = elems + (size_t)e * ELEM;
        uint32_t count, traps;
        memcpy(&count, set + 32, 4);
        memcpy(&traps, set + 36, 4);
        for (uint32_t c = 0; c < count; c++) {
            if (p >= len) return 0;
            if (in_set(set, buf[p])) {
                p += stride;
                continue;
            }
            size_t w = folded && traps ? trap_width(buf, len, p, stride, traps) : 0;
            if (!w) return 0;
            p += w * stride;
        }
    }
    return 1;
}

/* prog: uint32 needles; per needle: uint32 folded, uint32 elements, elements * ELEM;
 * then the 8192-byte pair bitmap. Returns 0, or -1 for a program this pass cannot hold
 * (the caller then uses its own pass). */
int secret_compile(const uint8_t *prog, struct compiled *out) {
    memset(out, 0, sizeof *out);
    memcpy(&out->needles, prog, 4);
    if (out->needles > MAX_NEEDLES) return -1;
    const uint8_t *p = prog + 4;
    for (uint32_t k = 0; k < out->needles; k++) {
        memcpy(&out->folded[k], p, 4);
        memcpy(&out->sizes[k], p + 4, 4);
        out->offset[k] = (uint32_t)(p + 8 - prog);
        const uint8_t *set = p + 8;
        uint32_t traps = 0;
        if (out->sizes[k]) memcpy(&traps, set + 36, 4);
        for (int b = 0; b < 256; b++) {
            int lead = out->folded[k] && ((b == 0xC5 && (traps & TRAP_S)) ||
                                          (b == 0xE2 && (traps & TRAP_K)) ||
                                          (b == 0xC4 && (traps & TRAP_I)));
            if (out->sizes[k] && (in_set(set, (uint8_t)b) || lead)) {
                if (out->first[b] == PER_FIRST) return -1;
                out->by_first[b][out->first[b]++] = (uint8_t)k;
            }
        }
        p += 8 + (size_t)out->sizes[k] * ELEM;
    }
    memcpy(out->pairs, p, sizeof out->pairs);
    memcpy(out->nibbles, p + sizeof out->pairs, sizeof out->nibbles);
#ifdef HAVE_AVX2_PATH
    out->avx2 = have_avx2();
#endif
    return 0;
}

/* Every needle matching at i in steps of stride, written as (where, needle, view). */
static size_t probe(const uint8_t *buf, size_t len, size_t i, size_t stride, uint64_t where,
                    uint8_t view, const uint8_t *prog, const struct compiled *c,
                    uint64_t *out_at, uint32_t *out_needle, uint8_t *out_view, size_t n) {
    uint8_t b = buf[i];
    for (uint32_t j = 0; j < c->first[b]; j++) {
        uint32_t k = c->by_first[b][j];
        if (match_at(buf, len, i, stride, prog + c->offset[k], c->sizes[k], c->folded[k])) {
            out_at[n] = where;
            out_needle[n] = k;
            out_view[n] = view;
            n++;
        }
    }
    return n;
}

static inline int pair_at(const struct compiled *c, uint8_t b0, uint8_t b1) {
    unsigned pr = (unsigned)b0 << 8 | b1;
    return c->pairs[pr >> 3] & (1u << (pr & 7));
}

/* Both kinds of hit at byte i: plain (view 0, offset i) and strided (view 1 or 2 by the
 * parity of i, offset i/2). */
static size_t probe_both(const uint8_t *buf, size_t len, size_t i, int plain, int view,
                         const uint8_t *prog, const struct compiled *c, uint64_t *out_at,
                         uint32_t *out_needle, uint8_t *out_view, size_t n) {
    if (plain) n = probe(buf, len, i, 1, i, 0, prog, c, out_at, out_needle, out_view, n);
    if (view)
        n = probe(buf, len, i, 2, i >> 1, (uint8_t)(1 + (i & 1)), prog, c, out_at, out_needle,
                  out_view, n);
    return n;
}

#ifdef HAVE_AVX2_PATH
__attribute__((target("avx2"))) static inline __m256i bucket_bits(__m256i v, __m256i lo_tab,
                                                                   __m256i hi_tab) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_shuffle_epi8(lo_tab, _mm256_and_si256(v, low));
    __m256i hi = _mm256_shuffle_epi8(hi_tab, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
    return _mm256_and_si256(lo, hi);
}

/* The hot loop 32 bytes at a time, from *at while 32 more fit before stop (which leaves
 * four bytes after it in the buffer). Returns the hit count; *at is where it stopped, and
 * *full is set when max_out ran short there. */
__attribute__((target("avx2"))) static size_t hot_avx2(
    const uint8_t *buf, size_t len, size_t *at, size_t stop, int views, const uint8_t *prog,
    const struct compiled *c, uint64_t *out_at, uint32_t *out_needle, uint8_t *out_view,
    size_t n, size_t max_out, int *full) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i t[6];
    for (int k = 0; k < 6; k++)
        t[k] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)c->nibbles[k]));
    size_t room = 2 * (size_t)c->needles, i = *at;
    for (; i + 32 <= stop; i += 32) {
#define AT(k) _mm256_loadu_si256((const __m256i *)(buf + i + (k)))
        __m256i first = bucket_bits(AT(0), t[0], t[1]);
        __m256i next = _mm256_and_si256(bucket_bits(AT(1), t[2], t[3]),
                                        bucket_bits(AT(2), t[4], t[5]));
        if (views)
            next = _mm256_or_si256(next, _mm256_and_si256(bucket_bits(AT(2), t[2], t[3]),
                                                          bucket_bits(AT(4), t[4], t[5])));
#undef AT
        __m256i both = _mm256_and_si256(first, next);
        uint32_t bits = ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(both, zero));
        while (bits) {
            size_t p = i + (size_t)__builtin_ctz(bits);
            bits &= bits - 1;
            int one = pair_at(c, buf[p], buf[p + 1]);
            int two = views && pair_at(c, buf[p], buf[p + 2]);
            if (!(one | two)) continue;
            if (n + room > max_out) {
                *at = p;
                *full = 1;
                return n;
            }
            n = probe_both(buf, len, p, one, two, prog, c, out_at, out_needle, out_view, n);
        }
    }
    *at = i;
    return n;
}

/* mask: which of each 32 bytes count (every one, or every other from the first). */
__attribute__((target("avx2"))) static size_t newlines_avx2(const uint8_t *buf, size_t *at,
                                                             size_t hi, uint32_t mask) {
    const __m256i nl = _mm256_set1_epi8('\n');
    size_t n = 0, i = *at;
    for (; i + 32 <= hi; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(buf + i));
        uint32_t bits = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, nl)) & mask;
        n += (size_t)__builtin_popcount(bits);
    }
    *at = i;
    return n;
}
#endif

/* Hits starting in [lo, hi) of the bytes (view 0, offset i) and, with views, at view
 * offsets j in [lo/2, hi/2) of the even bytes (view 1, byte 2j) and the odd bytes (view
 * 2, byte 2j+1). A needle may end past hi (up to len). Starts at byte `from` (0 the
 * first time) and returns how many hits it wrote; *next is where to call again when
 * max_out ran short, or len when it is done. Hits come in the order of their bytes. */
size_t secret_hits(const uint8_t *buf, size_t len, size_t lo, size_t hi, int views,
                   size_t from, const uint8_t *prog, const struct compiled *c,
                   uint64_t *out_at, uint32_t *out_needle, uint8_t *out_view, size_t max_out,
                   size_t *next) {
    if (hi > len) hi = len;
    if (lo > hi) lo = hi;
    size_t vlo = lo & ~(size_t)1, vhi = views ? hi & ~(size_t)1 : 0;
    if (!views) vlo = vhi = 0;
    size_t start = views && vlo < lo ? vlo : lo, end = hi;
    if (from > start) start = from;
    /* The core: both kinds due and two bytes after i in the buffer, so no bound checks;
     * the few bytes either side of it go through the checked loop. */
    size_t core_lo = lo, core_hi = views ? vhi : hi;
    if (core_hi + 2 > len) core_hi = len >= 2 ? len - 2 : 0;
    if (core_hi < core_lo) core_hi = core_lo;
    size_t room = 2 * (size_t)c->needles; /* the most hits one byte can give */
    size_t n = 0;
    for (size_t i = start; i < end; i++) {
        if (i >= core_lo && i < core_hi) {
#ifdef HAVE_AVX2_PATH
            if (c->avx2) {
                int full = 0;
                size_t stop = core_hi + 4 <= len ? core_hi : (len >= 4 ? len - 4 : 0);
                n = hot_avx2(buf, len, &i, stop, views, prog, c, out_at, out_needle, out_view,
                             n, max_out, &full);
                if (full) {
                    *next = i;
                    return n;
                }
            }
#endif
            /* The hot loop: one or two table loads a byte, a branch almost never taken. */
            size_t stop = core_hi;
            if (views) {
                for (; i < stop; i++) {
                    uint8_t b = buf[i];
                    int one = pair_at(c, b, buf[i + 1]), two = pair_at(c, b, buf[i + 2]);
                    if (__builtin_expect(!(one | two), 1)) continue;
                    if (n + room > max_out) {
                        *next = i;
                        return n;
                    }
                    n = probe_both(buf, len, i, one, two, prog, c, out_at, out_needle,
                                   out_view, n);
                }
            } else {
                for (; i < stop; i++) {
                    if (__builtin_expect(!pair_at(c, buf[i], buf[i + 1]), 1)) continue;
                    if (n + room > max_out) {
                        *next = i;
                        return n;
                    }
                    n = probe_both(buf, len, i, 1, 0, prog, c, out_at, out_needle, out_view,
                                   n);
                }
            }
            i--; /* the outer loop's i++ */
            continue;
        }
        int plain = i >= lo && i < hi, view = views && i >= vlo && i < vhi;
        if (!(plain || view) || !c->first[buf[i]]) continue;
        if (n + room > max_out) {
            *next = i;
            return n;
        }
        n = probe_both(buf, len, i, plain, view, prog, c, out_at, out_needle, out_view, n);
    }
    *next = len;
    return n;
}

/* Newline bytes at buf[lo], buf[lo + stride], ... before hi (stride 1 or 2): a
 * finding's line number is counted from them, in the bytes or in a view. */
size_t secret_newlines(const uint8_t *buf, size_t lo, size_t hi, size_t stride) {
    size_t n = 0, i = lo;
#ifdef HAVE_AVX2_PATH
    if (have_avx2() && (stride == 1 || stride == 2))
        n = newlines_avx2(buf, &i, hi, stride == 2 ? 0x55555555u : 0xffffffffu);
#endif
    for (; i < hi; i += stride) n += buf[i] == '\n';
    return n;
}
