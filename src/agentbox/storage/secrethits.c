/* One pass over a buffer for the secret scan's pre-filter (storage/secretwindows.py):
 * every offset where a needle matches. A needle is a sequence of elements, each a set
 * of bytes (a 256-bit map) repeated a fixed number of times: literals, case-folded
 * literals and shapes such as ":" then 35 token bytes. A table of the bytes that can
 * start a needle skips the rest at one load per byte. Built as a shared library and
 * called through ctypes: no process per file, no copy of the buffer. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define ELEM 36 /* 32 bytes of byte set, then a little-endian uint32 repeat count */

static inline int in_set(const uint8_t *set, uint8_t b) { return set[b >> 3] & (1u << (b & 7)); }

static size_t match_len(const uint8_t *buf, size_t at, size_t len, const uint8_t *elems,
                        uint32_t n) {
    size_t p = at;
    for (uint32_t e = 0; e < n; e++) {
        const uint8_t *set = elems + (size_t)e * ELEM;
        uint32_t count;
        memcpy(&count, set + 32, 4);
        for (uint32_t c = 0; c < count; c++, p++)
            if (p >= len || !in_set(set, buf[p])) return 0;
    }
    return 1;
}

/* prog: uint32 needles; then per needle: uint32 elements, elements * ELEM bytes.
 * Writes up to max_out (offset, needle) pairs for offsets in [lo, hi); a needle may end
 * past hi (up to len). Returns how many (max_out: call again from the last one), or
 * (size_t)-1 for a program this pass cannot hold (then the caller uses its own). */
size_t secret_hits(const uint8_t *buf, size_t len, size_t lo, size_t hi, const uint8_t *prog,
                   uint64_t *out_at, uint32_t *out_needle, size_t max_out) {
    uint32_t needles;
    memcpy(&needles, prog, 4);
    if (needles > 256) return (size_t)-1; /* the caller falls back to Python */
    const uint8_t *start[256];
    uint32_t sizes[256];
    uint8_t first[256] = {0};
    uint8_t by_first[256][32]; /* needles that can start with each byte, in order */
    const uint8_t *p = prog + 4;
    for (uint32_t k = 0; k < needles; k++) {
        memcpy(&sizes[k], p, 4);
        start[k] = p + 4;
        for (int b = 0; b < 256; b++)
            if (sizes[k] && in_set(start[k], (uint8_t)b)) {
                if (first[b] == 32) return (size_t)-1;
                by_first[b][first[b]++] = (uint8_t)k;
            }
        p += 4 + (size_t)sizes[k] * ELEM;
    }
    size_t n = 0;
    if (hi > len) hi = len;
    for (size_t i = lo; i < hi; i++) {
        if (!first[buf[i]]) continue;
        for (uint32_t j = 0; j < first[buf[i]]; j++) {
            uint32_t k = by_first[buf[i]][j];
            if (match_len(buf, i, len, start[k], sizes[k])) {
                out_at[n] = i;
                out_needle[n] = k;
                if (++n == max_out) return n;
            }
        }
    }
    return n;
}
