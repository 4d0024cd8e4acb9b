/* data/unicode: UTF-8 coding and table lookups (tables: unicode_data.c, generated). */
#include "data/unicode.h"

uint32_t nl_unicode_flags(uint32_t cp) {
    if (cp > 0x10FFFF) return NL_UF_UNDEF;
    /* last range whose first <= cp (nl_ucd_flags[0].first == 0) */
    size_t lo = 0, hi = nl_ucd_flags_n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (nl_ucd_flags[mid].first <= cp) lo = mid;
        else hi = mid;
    }
    return nl_ucd_flags[lo].flags;
}

uint32_t nl_unicode_tolower(uint32_t cp) {
    size_t lo = 0, hi = nl_ucd_lower_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (nl_ucd_lower[mid].a < cp) lo = mid + 1;
        else hi = mid;
    }
    return (lo < nl_ucd_lower_n && nl_ucd_lower[lo].a == cp) ? nl_ucd_lower[lo].b : cp;
}

int nl_unicode_in_spans(const nl_ucd_pair *spans, size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) { /* first span with hi >= cp */
        size_t mid = lo + (hi - lo) / 2;
        if (spans[mid].b < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && spans[lo].a <= cp;
}

int nl_utf8_next(const uint8_t *s, size_t len, size_t *pos, uint32_t *cp) {
    size_t i = *pos;
    if (i >= len) return -1;
    uint8_t c = s[i];
    if (c < 0x80) {
        *cp = c;
        *pos = i + 1;
        return 0;
    }
    int n;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 1;
        v = c & 0x1F;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        v = c & 0x0F;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        v = c & 0x07;
        min = 0x10000;
    } else return -1; /* continuation byte, overlong lead C0/C1, or F5..FF */
    if (len - i - 1 < (size_t)n) return -1;
    for (int k = 1; k <= n; k++) {
        uint8_t cc = s[i + k];
        if ((cc & 0xC0) != 0x80) return -1;
        v = (v << 6) | (cc & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return -1;
    *cp = v;
    *pos = i + 1 + n;
    return 0;
}

size_t nl_utf8_validate(const uint8_t *s, size_t len) {
    size_t pos = 0;
    uint32_t cp;
    while (pos < len) {
        if (s[pos] < 0x80) {
            pos++;
            continue;
        }
        if (nl_utf8_next(s, len, &pos, &cp) != 0) return pos;
    }
    return len;
}

int nl_utf8_put(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
