/* libFuzzer target for the reader of the serving API's common act body: json_act_read in
 * huggy_agent/json_act_body.h, the code the extension's json_obs_row runs (`make fuzz`).
 *
 * Each input is a body. The reader runs on it once for every row length an accepted body could
 * have (see LLVMFuzzerTestOneInput), each row allocated to exactly that length, so that
 * AddressSanitizer catches a write past it; libFuzzer's copy of the body is exactly its size,
 * so a read past it is caught too. Where the reader accepts, the body is checked against
 * references written apart from it:
 *   - the body is ASCII and valid JSON (RFC 8259, by the small validator below);
 *   - its keys are among obs, deterministic, seed and row_offset, each once, obs present;
 *   - the options are what true/false and strtoull say, the defaults where a key is absent;
 *   - "obs" holds exactly the row's length of numbers, and each value is, bit for bit, glibc's
 *     strtod of its token (correctly rounded, as Python's float() is) cast to float, with an
 *     integer's zero positive (Python's int has no -0): so every value is finite and written;
 *   - no other row length is accepted.
 * A failed check aborts, which libFuzzer reports as a crash, and it keeps the body.
 */
#define _GNU_SOURCE /* memmem */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_act_body.h"

static void fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("json_act_body_fuzz: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    abort();
}

/* A cursor over the body, which is not NUL-terminated. */
struct text {
    const char *p, *end;
};

/* The next byte (0-255), or -1 at the end. */
static int peek(const struct text *t) { return t->p < t->end ? (unsigned char)*t->p : -1; }

static void skip_space(struct text *t) {
    for (int c = peek(t); c == ' ' || c == '\t' || c == '\n' || c == '\r'; c = peek(t)) t->p++;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }

/* One or more digits. */
static int valid_digits(struct text *t) {
    const char *start = t->p;
    while (is_digit(peek(t))) t->p++;
    return t->p > start;
}

static int valid_number(struct text *t) {
    if (peek(t) == '-') t->p++;
    if (peek(t) == '0') {
        t->p++;
    } else if (!(peek(t) >= '1' && peek(t) <= '9') || !valid_digits(t)) {
        return 0;
    }
    if (peek(t) == '.') {
        t->p++;
        if (!valid_digits(t)) return 0;
    }
    if (peek(t) == 'e' || peek(t) == 'E') {
        t->p++;
        if (peek(t) == '+' || peek(t) == '-') t->p++;
        if (!valid_digits(t)) return 0;
    }
    return 1;
}

static int valid_string(struct text *t) {
    if (peek(t) != '"') return 0;
    t->p++;
    for (;;) {
        int c = peek(t);
        if (c < 0x20) return 0; /* the end, or a control character */
        t->p++;
        if (c == '"') return 1;
        if (c != '\\') continue;
        c = peek(t);
        if (c < 0) return 0;
        t->p++;
        if (c == 'u') {
            for (int i = 0; i < 4; i++, t->p++) {
                c = peek(t);
                if (!(is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return 0;
            }
        } else if (c == 0 || !strchr("\"\\/bfnrt", c)) {
            return 0;
        }
    }
}

static int valid_word(struct text *t, const char *word) {
    size_t length = strlen(word);
    if ((size_t)(t->end - t->p) < length || memcmp(t->p, word, length) != 0) return 0;
    t->p += length;
    return 1;
}

static int valid_value(struct text *t, int depth);

/* The members of an array (object: key-value pairs) after its opening bracket, and its end. */
static int valid_members(struct text *t, int depth, int object) {
    int close = object ? '}' : ']';
    skip_space(t);
    if (peek(t) == close) {
        t->p++;
        return 1;
    }
    for (;;) {
        skip_space(t);
        if (object) {
            if (!valid_string(t)) return 0;
            skip_space(t);
            if (peek(t) != ':') return 0;
            t->p++;
            skip_space(t);
        }
        if (!valid_value(t, depth + 1)) return 0;
        skip_space(t);
        int c = peek(t);
        if (c != close && c != ',') return 0;
        t->p++;
        if (c == close) return 1;
    }
}

static int valid_value(struct text *t, int depth) {
    if (depth > 16) return 0; /* deeper than any body the reader may accept */
    switch (peek(t)) {
    case '{':
        t->p++;
        return valid_members(t, depth, 1);
    case '[':
        t->p++;
        return valid_members(t, depth, 0);
    case '"':
        return valid_string(t);
    case 't':
        return valid_word(t, "true");
    case 'f':
        return valid_word(t, "false");
    case 'n':
        return valid_word(t, "null");
    default:
        return valid_number(t);
    }
}

static int valid_json(const char *body, size_t size) {
    struct text t = {body, body + size};
    skip_space(&t);
    if (!valid_value(&t, 0)) return 0;
    skip_space(&t);
    return t.p == t.end;
}

/* Just past the colon (and whitespace) that follows the key `name`, or NULL where the key is
 * absent. In an accepted body, which holds no string but its keys, a quoted name can only be a
 * key; a second one is a repeated key. */
static const char *value_of(const char *body, size_t size, const char *name, int *keys) {
    char quoted[32];
    size_t length = (size_t)snprintf(quoted, sizeof quoted, "\"%s\"", name);
    const char *found = memmem(body, size, quoted, length);
    if (!found) return NULL;
    struct text t = {found + length, body + size};
    if (memmem(t.p, (size_t)(t.end - t.p), quoted, length)) fail("accepted a repeated %s", name);
    ++*keys;
    skip_space(&t);
    if (peek(&t) != ':') fail("accepted %s without a colon after it", name);
    t.p++;
    skip_space(&t);
    return t.p;
}

/* The integer option at `at` (JSON: no sign, fraction, exponent or leading zero). */
static uint64_t integer_option(const char *at, const char *end, const char *name) {
    char digits[24];
    size_t length = 0;
    while (at + length < end && is_digit(at[length])) length++;
    const char *after = at + length;
    if (length == 0 || length > 20 || (at[0] == '0' && length > 1) ||
        (after < end && (*after == '.' || *after == 'e' || *after == 'E')))
        fail("accepted %s that is not an integer in [0, 2**64)", name);
    memcpy(digits, at, length);
    digits[length] = '\0';
    errno = 0;
    unsigned long long value = strtoull(digits, NULL, 10);
    if (errno) fail("accepted %s = %s, not below 2**64", name, digits);
    return value;
}

/* The checks of an accepted body (see the top of the file). */
static void check_accepted(const char *body, size_t size, const float *row, size_t length,
                           const struct json_act_options *options) {
    for (size_t i = 0; i < size; i++)
        if ((unsigned char)body[i] >= 0x80) fail("accepted a body that is not ASCII");
    if (!valid_json(body, size)) fail("accepted a body that is not valid JSON");
    const char *end = body + size;
    int keys = 0;

    const char *at = value_of(body, size, "deterministic", &keys);
    int deterministic = 1;
    if (at && (size_t)(end - at) >= 4 && memcmp(at, "true", 4) == 0) {
        deterministic = 1;
    } else if (at && (size_t)(end - at) >= 5 && memcmp(at, "false", 5) == 0) {
        deterministic = 0;
    } else if (at) {
        fail("accepted a deterministic that is neither true nor false");
    }
    if (options->deterministic != deterministic)
        fail("deterministic %d, the body says %d", options->deterministic, deterministic);

    at = value_of(body, size, "seed", &keys);
    int has_seed = at && !((size_t)(end - at) >= 4 && memcmp(at, "null", 4) == 0);
    uint64_t seed = has_seed ? integer_option(at, end, "seed") : 0;
    if (options->has_seed != has_seed || options->seed != seed)
        fail("seed (%d, %llu), the body says (%d, %llu)", options->has_seed,
             (unsigned long long)options->seed, has_seed, (unsigned long long)seed);

    at = value_of(body, size, "row_offset", &keys);
    uint64_t row_offset = at ? integer_option(at, end, "row_offset") : 0;
    if (options->row_offset != row_offset)
        fail("row_offset %llu, the body says %llu", (unsigned long long)options->row_offset,
             (unsigned long long)row_offset);

    at = value_of(body, size, "obs", &keys);
    size_t quotes = 0;
    for (size_t i = 0; i < size; i++) quotes += body[i] == '"';
    if (quotes != 2 * (size_t)keys) fail("accepted a string or key besides the four");
    if (!at || *at != '[') fail("accepted a body without an obs list");
    struct text t = {at + 1, end};
    for (size_t i = 0; i < length; i++) {
        skip_space(&t);
        const char *token = t.p;
        if (!valid_number(&t)) fail("accepted a non-number at obs[%zu]", i);
        size_t token_length = (size_t)(t.p - token);
        char *copy = malloc(token_length + 1);
        if (!copy) fail("out of memory");
        memcpy(copy, token, token_length);
        copy[token_length] = '\0';
        char *stop;
        double value = strtod(copy, &stop);
        if (stop != copy + token_length) fail("strtod stopped early in %s", copy);
        if (!(fabs(value) < 0x1.ffffffp+127)) fail("accepted %s, not finite in float32", copy);
        float expected = (float)value;
        if (expected == 0.0f && !strpbrk(copy, ".eE")) expected = 0.0f; /* an integer's zero */
        uint32_t got_bits, expected_bits;
        memcpy(&got_bits, &row[i], sizeof got_bits);
        memcpy(&expected_bits, &expected, sizeof expected_bits);
        if (got_bits != expected_bits)
            fail("obs[%zu] = %s read as 0x%08x (%.9g), expected 0x%08x (%.9g)", i, copy,
                 got_bits, (double)row[i], expected_bits, (double)expected);
        free(copy);
        skip_space(&t);
        if (peek(&t) != (i + 1 < length ? ',' : ']'))
            fail("accepted an obs list of another length than %zu", length);
        t.p++;
    }
}

/* An accepted body holds 1 to 4 keys and a list of n numbers, so n - 1 + (keys - 1) commas: n
 * is one of commas - 2 .. commas + 1 (and at least 1). Every one is tried, and at most one may
 * be accepted; a row of 0 must be declined. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    size_t commas = 0;
    for (size_t i = 0; i < size; i++) commas += body[i] == ',';
    struct json_act_options options;
    float unused;
    if (json_act_read(body, size, &unused, 0, &options) != JSON_ACT_DECLINED)
        fail("accepted a body for a row of 0 numbers");
    size_t accepted = 0;
    for (size_t length = commas > 2 ? commas - 2 : 1; length <= commas + 1; length++) {
        float *row = malloc(length * sizeof *row);
        if (!row) fail("out of memory");
        memset(row, 0xff, length * sizeof *row); /* a NaN: any value left unwritten shows */
        memset(&options, 0xa5, sizeof options);
        enum json_act_result result = json_act_read(body, size, row, length, &options);
        if (result == JSON_ACT_READ) {
            if (accepted++) fail("accepted the body for two row lengths");
            check_accepted(body, size, row, length, &options);
        } else if (result != JSON_ACT_DECLINED) {
            fail("result %d, neither read nor declined", (int)result);
        }
        free(row);
    }
    return 0;
}
