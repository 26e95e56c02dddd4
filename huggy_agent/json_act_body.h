/* The reader of the serving API's common act body, read straight into a float32 row: no
 * Python API, so that `_native.c` (its `json_obs_row`) and the fuzz target (fuzz/) compile the
 * same code.
 *
 * json_act_read accepts only the plainest form: a JSON object holding "obs" (a list of exactly
 * `count` numbers, count at least 1) and optionally "deterministic" (true or false), "seed" (null
 * or an integer in [0, 2**64)) and "row_offset" (an integer in [0, 2**64)), each key once and
 * without escapes, JSON whitespace anywhere between tokens. Anything else (another key or form,
 * an escape, a value out of range, a number not finite in float32, a number too long for the
 * fast path below and over 64 characters, an exponent of 100000 or more, a syntax error) is
 * declined, and the caller reads the body the slow way, which words any error. Each number
 * becomes what Python's float() reads, cast to float32 as numpy casts it (rounded to float64,
 * then to float32), except that an integer reads as a Python int does: -0 is +0. It reads only
 * the `length` bytes of the body (no terminating NUL needed) and writes only row[0, count). */
#ifndef HUGGY_JSON_ACT_BODY_H
#define HUGGY_JSON_ACT_BODY_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum json_act_result { JSON_ACT_DECLINED = 0, JSON_ACT_READ = 1 };

/* What the body gives besides its row: deterministic 1 unless it says false; has_seed 0 where it
 * gives no seed or a null one (seed is then 0); row_offset 0 unless it gives one. */
struct json_act_options {
    int deterministic;
    int has_seed;
    uint64_t seed;
    uint64_t row_offset;
};

/* 10**0 .. 10**22: every power of ten that float64 holds exactly. */
static const double POWERS_OF_TEN[] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};
#define FLOAT32_OVERFLOW 0x1.ffffffp+127 /* the least magnitude that rounds to infinity */
#define NUMBER_TEXT_MAX 64               /* longer numbers are declined */
#define EXPONENT_MAX 100000              /* numbers with longer exponents are declined */

static const char *json_space(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static int json_digit(const char *p, const char *end) { return p < end && *p >= '0' && *p <= '9'; }

static int json_literal(const char **p, const char *end, const char *word) {
    size_t length = strlen(word);
    if ((size_t)(end - *p) < length || memcmp(*p, word, length) != 0) return 0;
    *p += length;
    return 1;
}

/* A JSON integer in [0, 2**64): no sign, fraction or exponent. 0 where the text is not one. */
static int json_uint64(const char **p, const char *end, uint64_t *value) {
    const char *q = *p;
    uint64_t v = 0;
    if (!json_digit(q, end)) return 0;
    if (*q == '0') {
        q++;
    } else {
        for (; json_digit(q, end); q++) {
            unsigned digit = (unsigned)(*q - '0');
            if (v > (UINT64_MAX - digit) / 10) return 0;
            v = v * 10 + digit;
        }
    }
    if (json_digit(q, end) || (q < end && (*q == '.' || *q == 'e' || *q == 'E'))) return 0;
    *p = q;
    *value = v;
    return 1;
}

/* The magnitude of a number's text (sign excluded) rounded to float64, then to float32.
 *
 * The fast path: a significand w of at most 19 digits and a decimal exponent within +-22 give
 * x = w * 10**e (or w / 10**-e) within a relative 2**-52 of the exact value (w rounds once to
 * float64, 10**|e| is exact, the product or quotient rounds once), and so does the exact
 * value's float64 rounding. When x(1 - 2**-48) and x(1 + 2**-48) round to the same float32,
 * every value between them does (rounding is monotonic), that float64 rounding among them: the
 * result is exactly the slow path's. Otherwise (about one number in 2**23) strtod reads the
 * text, correctly rounded, as Python's float() does. 0 where the magnitude is not finite in
 * float32 or the text is too long. */
static int json_magnitude(const char *text, size_t length, uint64_t w, int significant,
                          int64_t scale, float *magnitude) {
    if (significant <= 19 && scale >= -22 && scale <= 22) {
        double x = scale >= 0 ? (double)w * POWERS_OF_TEN[scale]
                              : (double)w / POWERS_OF_TEN[-scale];
        double high = x * (1.0 + 0x1p-48);
        if (high < FLOAT32_OVERFLOW) {
            float rounded = (float)(x * (1.0 - 0x1p-48));
            if (rounded == (float)high) {
                *magnitude = rounded;
                return 1;
            }
        }
    }
    char copy[NUMBER_TEXT_MAX + 1];
    char *stop;
    if (length > NUMBER_TEXT_MAX) return 0;
    memcpy(copy, text, length);
    copy[length] = '\0';
    double value = strtod(copy, &stop);
    if (stop != copy + length || !(value < FLOAT32_OVERFLOW)) return 0; /* a locale's comma */
    *magnitude = (float)value;
    return 1;
}

/* A JSON number as float32 (see json_magnitude). 0 where the text is not a JSON number or its
 * value is not finite in float32. */
static int json_float32(const char **p, const char *end, float *value) {
    const char *q = *p;
    int negative = 0, integer = 1, significant = 0;
    uint64_t w = 0;
    int64_t scale = 0, exponent = 0;
    if (q < end && *q == '-') {
        negative = 1;
        q++;
    }
    const char *digits = q;
#define JSON_SIGNIFICAND_DIGIT()                                                               \
    do {                                                                                       \
        if ((w || *q != '0') && significant < 20 && ++significant <= 19)                       \
            w = w * 10 + (uint64_t)(*q - '0');                                                 \
    } while (0)
    if (!json_digit(q, end)) return 0;
    if (*q == '0') {
        q++;
    } else {
        for (; json_digit(q, end); q++) JSON_SIGNIFICAND_DIGIT();
    }
    if (q < end && *q == '.') {
        integer = 0;
        if (!json_digit(++q, end)) return 0;
        for (; json_digit(q, end); q++, scale--) JSON_SIGNIFICAND_DIGIT();
    }
#undef JSON_SIGNIFICAND_DIGIT
    if (q < end && (*q == 'e' || *q == 'E')) {
        int exponent_negative = 0;
        integer = 0;
        q++;
        if (q < end && (*q == '+' || *q == '-')) exponent_negative = *q++ == '-';
        if (!json_digit(q, end)) return 0;
        for (; json_digit(q, end); q++) {
            if (exponent >= EXPONENT_MAX) return 0; /* its value is 0 or infinite in float32 */
            exponent = exponent * 10 + (*q - '0');
        }
        scale += exponent_negative ? -exponent : exponent;
    }
    float magnitude;
    if (significant == 0) { /* every digit 0 */
        magnitude = 0.0f;
    } else if (!json_magnitude(digits, (size_t)(q - digits), w, significant, scale, &magnitude)) {
        return 0;
    }
    *value = negative && !(integer && magnitude == 0.0f) ? -magnitude : magnitude;
    *p = q;
    return 1;
}

enum { FIELD_OBS = 1, FIELD_DETERMINISTIC = 2, FIELD_SEED = 4, FIELD_ROW_OFFSET = 8 };

static unsigned json_field(const char *key, size_t length) {
    static const struct { const char *name; unsigned field; } FIELDS[] = {
        {"obs", FIELD_OBS}, {"deterministic", FIELD_DETERMINISTIC}, {"seed", FIELD_SEED},
        {"row_offset", FIELD_ROW_OFFSET}};
    for (size_t i = 0; i < sizeof FIELDS / sizeof FIELDS[0]; i++)
        if (strlen(FIELDS[i].name) == length && memcmp(FIELDS[i].name, key, length) == 0)
            return FIELDS[i].field;
    return 0;
}

/* A JSON list of exactly `count` numbers into row. */
static int json_row(const char **p, const char *end, float *row, size_t count) {
    const char *q = *p;
    if (q >= end || *q++ != '[') return 0;
    for (size_t i = 0; i < count; i++) {
        q = json_space(q, end);
        if (!json_float32(&q, end, &row[i])) return 0;
        q = json_space(q, end);
        if (q >= end || *q++ != (i + 1 < count ? ',' : ']')) return 0;
    }
    *p = q;
    return 1;
}

/* Reads an object of the plain form; 0 where the body is not one. */
static int json_act_body(const char *p, const char *end, float *row, size_t count,
                         struct json_act_options *options) {
    unsigned seen = 0;
    p = json_space(p, end);
    if (p >= end || *p++ != '{') return 0;
    for (;;) {
        p = json_space(p, end);
        if (p >= end || *p++ != '"') return 0;
        const char *key = p;
        while (p < end && *p != '"' && *p != '\\') p++;
        if (p >= end || *p != '"') return 0;
        unsigned field = json_field(key, (size_t)(p++ - key));
        if (field == 0 || (seen & field)) return 0;
        seen |= field;
        p = json_space(p, end);
        if (p >= end || *p++ != ':') return 0;
        p = json_space(p, end);
        int read;
        switch (field) {
        case FIELD_OBS:
            read = json_row(&p, end, row, count);
            break;
        case FIELD_DETERMINISTIC:
            options->deterministic = json_literal(&p, end, "true");
            read = options->deterministic || json_literal(&p, end, "false");
            break;
        case FIELD_SEED:
            read = json_literal(&p, end, "null") ||
                   (options->has_seed = json_uint64(&p, end, &options->seed));
            break;
        default:
            read = json_uint64(&p, end, &options->row_offset);
        }
        if (!read) return 0;
        p = json_space(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p >= end || *p++ != '}') return 0;
        return json_space(p, end) == end && (seen & FIELD_OBS);
    }
}

/* Reads body[0, length) into row[0, count) and *options (see above): JSON_ACT_READ, or
 * JSON_ACT_DECLINED where the body is not of the plain form (then row and *options may be
 * partly written). An empty body is declined before any pointer arithmetic, so body may then
 * be NULL. */
static enum json_act_result json_act_read(const char *body, size_t length, float *row,
                                          size_t count, struct json_act_options *options) {
    *options = (struct json_act_options){.deterministic = 1, .has_seed = 0, .seed = 0,
                                         .row_offset = 0};
    if (length == 0 || count == 0) return JSON_ACT_DECLINED;
    return json_act_body(body, body + length, row, count, options) ? JSON_ACT_READ
                                                                    : JSON_ACT_DECLINED;
}

#endif /* HUGGY_JSON_ACT_BODY_H */
