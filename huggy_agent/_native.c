/* The package's compiled kernels: host noise, a single-observation MLP policy, and the reader
 * of the HTTP API's common act body (`json_obs_row`, further down; its core, with no Python API,
 * is json_act_body.h, which the fuzz target in fuzz/ compiles too).
 *
 * Noise (`gaussian_noise`, `uniform_noise`) is the same computation as huggy_agent/noise.py,
 * operation for operation: 64-bit integer hashing, then float64 + - * / and sqrt, each correctly
 * rounded by IEEE 754. The extension is compiled with -ffp-contract=off, so no multiply and add
 * is fused, and the results are bit-identical to numpy's. The float64 constants (the series
 * coefficients, ln 2, ...) come from noise.py with every call: one definition.
 *
 * The MLP (`mlp_plan`, `mlp_act`, `mlp_forward`) is a frozen copy of a policy's weights: an
 * optional normalizer, Linear + SiLU layers, a continuous head. Weights are stored row by row,
 * each row padded with zeros to a multiple of 8 floats and aligned to 32 bytes, so the dot
 * products run without tails; all layers in one allocation (on 2 MB pages where Linux grants
 * them), read in order, with the rows ahead prefetched (`arena_floats`, `gemv_avx2`). Two
 * kernels: `avx2` (AVX2 + FMA intrinsics, x86-64 CPUs that have them) and `generic` (plain C
 * that compilers vectorize for any CPU). Float32 throughout; the results differ from a BLAS by
 * summation order only. A second thread, the row helper (`row_helper_arm`), can share one
 * observation's hidden layers, with the same results bit for bit.
 *
 * Every buffer is passed through the buffer protocol, so the module needs no numpy headers.
 * Calls release the GIL while they compute.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#if !defined(_WIN32) && !defined(__STDC_NO_ATOMICS__)
#define HUGGY_THREADS 1
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define HUGGY_X86 1
#include <immintrin.h>
#endif

#include "json_act_body.h"

/* Whether this CPU runs the avx2 kernels: the noise's needs AVX2 only (it never fuses a
 * multiply-add), the MLP's AVX2 and FMA. */
static int runs_avx2_noise(void) {
#ifdef HUGGY_X86
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static int runs_avx2_mlp(void) {
#ifdef HUGGY_X86
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Noise
 * ------------------------------------------------------------------------------------------- */

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define MIX1 0xBF58476D1CE4E5B9ULL
#define MIX2 0x94D049BB133111EBULL
#define UNIFORM_DOMAIN 0x5DEECE66D5A17C3BULL
#define POLY_TERMS 9
/* constants[]: LN2_HI, LN2_LO, SQRT_HALF, HALF_PI, then the atanh, cos and sin series, each
 * POLY_TERMS coefficients, highest power first (noise.py's _POLYNOMIALS). */
#define CONSTANTS (4 + 3 * POLY_TERMS)
#define NOISE_BLOCK 256

static inline uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + GOLDEN;
    z = (z ^ (z >> 30)) * MIX1;
    z = (z ^ (z >> 27)) * MIX2;
    return z ^ (z >> 31);
}

/* Horner's rule as noise.py's _three_polynomials runs it: x * c[0], then (+ c[k]) * x for
 * k = 1 .. POLY_TERMS - 2, then + c[POLY_TERMS - 1]. */
static inline double horner(const double *c, double x) {
    double result = x * c[0];
    for (int k = 1; k < POLY_TERMS - 1; k++) {
        result += c[k];
        result *= x;
    }
    return result + c[POLY_TERMS - 1];
}

/* noise.py's _box_muller for one pair (a in (0, 1], b in [0, 1)), in float64 operations and
 * 64-bit masks only (no branches, calls or integer conversions), so that compilers vectorize a
 * loop of it; the values are noise.py's, bit for bit:
 * - frexp(a) from a's bits (a is a normal number, a >= 2**-53): m is a with the exponent of 1/2,
 *   and the exponent field k is read as the double 2**52 + k minus 2**52 (exact);
 * - floor(b * 4), for b * 4 in [0, 4), as the count of 1, 2 and 3 that it reaches (exact);
 * - the quadrant's cosine as a selection and a negation.
 * Every value is the one noise.py computes, by the same float64 operations in the same order. */
static inline double box_muller(double a, double b, const double *k) {
    const double ln2_hi = k[0], ln2_lo = k[1], sqrt_half = k[2], half_pi = k[3];
    uint64_t a_bits, m_bits, field_bits;
    memcpy(&a_bits, &a, sizeof a_bits);
    m_bits = (a_bits & 0x000FFFFFFFFFFFFFULL) | 0x3FE0000000000000ULL;
    field_bits = (a_bits >> 52) | 0x4330000000000000ULL;
    double m, field;
    memcpy(&m, &m_bits, sizeof m);
    memcpy(&field, &field_bits, sizeof field);
    double exponent = (field - 0x1p52) - 1022.0;  /* frexp's exponent */
    int low = m < sqrt_half;
    m = low ? m * 2.0 : m;
    double e = exponent - (low ? 1.0 : 0.0);
    double s = (m - 1.0) / (m + 1.0);
    double t = b * 4.0;
    double quadrant = (t >= 1.0 ? 1.0 : 0.0) + (t >= 2.0 ? 1.0 : 0.0) + (t >= 3.0 ? 1.0 : 0.0);
    double f = t - quadrant;
    int upper = f > 0.5;
    double y = (upper ? 1.0 - f : f) * half_pi;
    double y2 = y * y;
    double atanh2 = horner(k + 4, s * s);
    double cos_y = horner(k + 4 + POLY_TERMS, y2);
    double sin_y = horner(k + 4 + 2 * POLY_TERMS, y2);
    double log_a = e * ln2_hi + (e * ln2_lo + s * atanh2);
    sin_y *= y;
    double cos_x = upper ? sin_y : cos_y;
    double sin_x = upper ? cos_y : sin_y;
    /* quadrant 0: cos x, 1: -sin x, 2: -cos x, 3: sin x */
    int odd = (t >= 1.0 && t < 2.0) || t >= 3.0;
    int negative = t >= 1.0 && t < 3.0;
    double cos_b = odd ? sin_x : cos_x;
    cos_b = negative ? -cos_b : cos_b;
    return sqrt(-2.0 * log_a) * cos_b;
}

/* Box-Muller over a block of pairs into float32; the AVX2 build (no fused multiply-add) runs
 * the same IEEE operations four pairs at a time, so it gives the same bits. */
static void box_muller_block_generic(const double *a, const double *b, float *out, int count,
                                     const double *k) {
    for (int i = 0; i < count; i++) out[i] = (float)box_muller(a[i], b[i], k);
}

#ifdef HUGGY_X86
__attribute__((target("avx2"))) static void box_muller_block_avx2(
    const double *a, const double *b, float *out, int count, const double *k) {
    for (int i = 0; i < count; i++) out[i] = (float)box_muller(a[i], b[i], k);
}
#endif

typedef void (*BoxMullerBlock)(const double *, const double *, float *, int, const double *);

/* The block function of the noise kernel named `kernel` ("avx2" or "generic"; NULL: the fastest
 * this CPU runs); NULL with ValueError for a kernel this CPU cannot run. */
static BoxMullerBlock box_muller_kernel(const char *kernel) {
    int avx2 = runs_avx2_noise();
    if (kernel == NULL) kernel = avx2 ? "avx2" : "generic";
    if (strcmp(kernel, "generic") == 0) return box_muller_block_generic;
#ifdef HUGGY_X86
    if (strcmp(kernel, "avx2") == 0 && avx2) return box_muller_block_avx2;
#endif
    PyErr_Format(PyExc_ValueError, "noise kernel '%s' does not run on this CPU; expected "
                 "'generic'%s", kernel, avx2 ? " or 'avx2'" : "");
    return NULL;
}

static int get_buffer(PyObject *object, Py_buffer *view, int writable, const char *format,
                      Py_ssize_t items, const char *what) {
    if (PyObject_GetBuffer(object, view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_C_CONTIGUOUS |
                           PyBUF_FORMAT) < 0)
        return -1;
    if (strcmp(view->format, format) != 0 || view->len != items * view->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd C-contiguous items of format '%s', got "
                     "%zd bytes of format '%s'", what, items, format, view->len, view->format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* An integer argument (anything with __index__, numpy's integers too) as uint64 or Py_ssize_t. */
static int as_uint64(PyObject *object, uint64_t *value) {
    PyObject *index = PyNumber_Index(object);
    if (!index) return -1;
    *value = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    return PyErr_Occurred() ? -1 : 0;
}

static int as_count(PyObject *object, Py_ssize_t *value, const char *what) {
    PyObject *index = PyNumber_Index(object);
    if (!index) return -1;
    *value = PyLong_AsSsize_t(index);
    Py_DECREF(index);
    if (PyErr_Occurred()) return -1;
    if (*value < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0, got %zd", what, *value);
        return -1;
    }
    return 0;
}

/* The (seed, row_offset, rows, cols, ...) arguments of a noise function taking `expected`. */
static int parse_stream(const char *name, PyObject *const *args, Py_ssize_t nargs,
                        Py_ssize_t expected, uint64_t *seed, uint64_t *row_offset,
                        Py_ssize_t *rows, Py_ssize_t *cols) {
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, expected, nargs);
        return -1;
    }
    if (as_uint64(args[0], seed) < 0 || as_uint64(args[1], row_offset) < 0 ||
        as_count(args[2], rows, "rows") < 0 || as_count(args[3], cols, "cols") < 0)
        return -1;
    return 0;
}

/* gaussian_noise(seed, row_offset, rows, cols, constants, out[, kernel]): fills out, float32
 * (rows, cols); kernel: "avx2" or "generic" (default: the fastest this CPU runs), the same bits. */
static PyObject *gaussian_noise(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    uint64_t seed, row_offset;
    Py_ssize_t rows, cols;
    const char *kernel = NULL;
    if (nargs != 6 && nargs != 7) {
        PyErr_Format(PyExc_TypeError, "gaussian_noise takes 6 or 7 arguments, got %zd", nargs);
        return NULL;
    }
    if (nargs == 7) {
        kernel = PyUnicode_AsUTF8(args[6]);
        if (kernel == NULL) return NULL;
        nargs = 6;
    }
    BoxMullerBlock box_muller_block = box_muller_kernel(kernel);
    if (box_muller_block == NULL) return NULL;
    if (parse_stream("gaussian_noise", args, nargs, 6, &seed, &row_offset, &rows, &cols) < 0)
        return NULL;
    Py_buffer constants, out;
    if (get_buffer(args[4], &constants, 0, "d", CONSTANTS, "constants") < 0) return NULL;
    if (get_buffer(args[5], &out, 1, "f", rows * cols, "out") < 0) {
        PyBuffer_Release(&constants);
        return NULL;
    }
    const double *k = constants.buf;
    float *values = out.buf;
    uint64_t key = splitmix64(seed), columns = (uint64_t)cols, first = row_offset * columns;
    Py_ssize_t total = rows * cols;
    Py_BEGIN_ALLOW_THREADS
    /* Entry i of the output is the pair of counters 2 (first + i), 2 (first + i) + 1, as
     * (row_offset + r) * cols + c for row r and column c. In blocks: the hashing and the
     * uniforms first (64-bit integers), then Box-Muller over the block, which compilers
     * vectorize (no branches, no calls). */
    double uniform_a[NOISE_BLOCK], uniform_b[NOISE_BLOCK];
    for (Py_ssize_t start = 0; start < total; start += NOISE_BLOCK) {
        int count = (int)(total - start < NOISE_BLOCK ? total - start : NOISE_BLOCK);
        for (int i = 0; i < count; i++) {
            uint64_t counter = (first + (uint64_t)(start + i)) * 2u;
            uint64_t bits_a = splitmix64(key ^ splitmix64(counter)) >> 11;
            uint64_t bits_b = splitmix64(key ^ splitmix64(counter + 1u)) >> 11;
            uniform_a[i] = ((double)bits_a + 1.0) * 0x1p-53;
            uniform_b[i] = (double)bits_b * 0x1p-53;
        }
        box_muller_block(uniform_a, uniform_b, values + start, count, k);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&constants);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* uniform_noise(seed, row_offset, rows, cols, out): fills out, float64 (rows, cols). */
static PyObject *uniform_noise(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    uint64_t seed, row_offset;
    Py_ssize_t rows, cols;
    if (parse_stream("uniform_noise", args, nargs, 5, &seed, &row_offset, &rows, &cols) < 0)
        return NULL;
    Py_buffer out;
    if (get_buffer(args[4], &out, 1, "d", rows * cols, "out") < 0) return NULL;
    double *values = out.buf;
    uint64_t key = splitmix64(seed ^ UNIFORM_DOMAIN), columns = (uint64_t)cols;
    for (Py_ssize_t r = 0; r < rows; r++) {
        uint64_t row = row_offset + (uint64_t)r;
        for (Py_ssize_t c = 0; c < cols; c++) {
            uint64_t bits = splitmix64(key ^ splitmix64(row * columns + (uint64_t)c)) >> 11;
            values[r * cols + c] = (double)bits * 0x1p-53;
        }
    }
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------
 * MLP
 * ------------------------------------------------------------------------------------------- */

#define LANES 8
#define ALIGNMENT 32
#define BLOCK_ROWS 32 /* rows of a hidden layer computed together (a multiple of 4) */
#define NORMALIZER_CLIP 5.0f
#define PPO_CLIP 3.0f
#define SAC_LOG_SIGMA_LOW -20.0f
#define SAC_LOG_SIGMA_HIGH 2.0f

typedef struct {
    int out, in, in_pad; /* rows, inputs, inputs padded to LANES */
    float *weight;       /* out x in_pad, aligned, in the plan's arena */
    float *bias;         /* out, aligned, in the plan's arena */
} Layer;

typedef void (*GemvFn)(const Layer *, const float *, float *, int, int);
typedef void (*SiluFn)(float *, int);

typedef struct {
    int inputs, actions, hidden_layers, widest; /* widest: the largest in_pad / out */
    size_t hidden_floats;                        /* the hidden layers' weights */
    int sac;                                     /* head: 0 PPO (shared log-sigma), 1 SAC */
    float *mean, *std;                           /* NULL without a normalizer */
    Layer *layers;           /* hidden layers, then the output layer: mu (and SAC's log-sigma) */
    float *arena;            /* every layer's weights and biases, in order, in one allocation */
    float *log_sigma;        /* PPO's shared log-sigma (actions); NULL for SAC */
    GemvFn gemv;
    SiluFn silu;
    const char *kernel;
} Plan;

static size_t padded(size_t n) { return (n + LANES - 1) / LANES * LANES; }

static float *aligned_floats(size_t n) {
    void *memory = NULL;
    size_t bytes = (n * sizeof(float) + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
    if (posix_memalign(&memory, ALIGNMENT, bytes ? bytes : ALIGNMENT) != 0) return NULL;
    memset(memory, 0, bytes);
    return memory;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* `n` zeroed floats for a plan's weights. From 1 MB on, aligned to 2 MB and (on Linux) marked
 * for transparent huge pages before the first write: a single observation reads every weight
 * once, and when other work has evicted them from the caches, most of that read is spent on
 * misses; 2 MB pages make the misses' page walks (costly under a hypervisor) few. */
static float *arena_floats(size_t n) {
    size_t bytes = n * sizeof(float);
    if (bytes < HUGE_PAGE / 2) return aligned_floats(n);
    bytes = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *memory = NULL;
    if (posix_memalign(&memory, HUGE_PAGE, bytes) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(memory, bytes, MADV_HUGEPAGE); /* a hint: without huge pages, the same floats */
#endif
    memset(memory, 0, bytes);
    return memory;
}

/* exp(x) for float32 x, to about 2 ulp (Cephes' expf polynomial), written so that compilers
 * vectorize loops over it: round to nearest by adding and subtracting 1.5 * 2**23 (exact without
 * contraction), scale by 2**n through the exponent bits. */
static inline float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* x * sigmoid(x) = x / (1 + exp(-x)), in place. */
static void silu_generic(float *values, int n) {
    for (int i = 0; i < n; i++) values[i] = values[i] / (1.0f + exp_approx(-values[i]));
}

static inline float sum_lanes(const float *lanes) {
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
           ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

/* GEMV kernels: rows [first, end) of y = W x + bias. Four rows at a time from `first`, then one
 * at a time, so that a row's sum is the same whichever range it is computed in, as long as ranges
 * start at multiples of 4 (`BLOCK_ROWS`) and the last one ends at the layer's end. */

/* Four rows at a time, LANES partial sums each (independent chains a compiler vectorizes). */
static void gemv_generic(const Layer *layer, const float *x, float *y, int first, int end) {
    const int in_pad = layer->in_pad;
    int j = first;
    for (; j + 4 <= end; j += 4) {
        const float *w = layer->weight + (size_t)j * in_pad;
        float lanes[4][LANES] = {{0}};
        for (int i = 0; i < in_pad; i += LANES)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < LANES; l++)
                    lanes[r][l] += w[(size_t)r * in_pad + i + l] * x[i + l];
        for (int r = 0; r < 4; r++) y[j + r] = sum_lanes(lanes[r]) + layer->bias[j + r];
    }
    for (; j < end; j++) {
        const float *w = layer->weight + (size_t)j * in_pad;
        float lanes[LANES] = {0};
        for (int i = 0; i < in_pad; i += LANES)
            for (int l = 0; l < LANES; l++) lanes[l] += w[i + l] * x[i + l];
        y[j] = sum_lanes(lanes) + layer->bias[j];
    }
}

#ifdef HUGGY_X86
__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Four rows at a time, one accumulator each: four weight streams, x loaded once per step. The
 * same columns of the rows eight ahead are prefetched meanwhile, so that weights evicted from the
 * caches stream in while others are used (past the layer's end, that is the next layer's weights
 * in the arena; a prefetch never faults). */
__attribute__((target("avx2,fma"))) static void gemv_avx2(const Layer *layer, const float *x,
                                                           float *y, int first, int end) {
    const int in_pad = layer->in_pad;
    int j = first;
    for (; j + 4 <= end; j += 4) {
        const float *w0 = layer->weight + (size_t)j * in_pad;
        const float *w1 = w0 + in_pad, *w2 = w1 + in_pad, *w3 = w2 + in_pad;
        const char *next = (const char *)(w3 + 5 * (size_t)in_pad);
        const size_t row_bytes = (size_t)in_pad * sizeof(float);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int i = 0; i < in_pad; i += LANES) {
            if ((i & (2 * LANES - 1)) == 0) { /* one 64-byte line of each row per two steps */
                const char *line = next + (size_t)i * sizeof(float);
                _mm_prefetch(line, _MM_HINT_T0);
                _mm_prefetch(line + row_bytes, _MM_HINT_T0);
                _mm_prefetch(line + 2 * row_bytes, _MM_HINT_T0);
                _mm_prefetch(line + 3 * row_bytes, _MM_HINT_T0);
            }
            __m256 xv = _mm256_load_ps(x + i);
            a0 = _mm256_fmadd_ps(_mm256_load_ps(w0 + i), xv, a0);
            a1 = _mm256_fmadd_ps(_mm256_load_ps(w1 + i), xv, a1);
            a2 = _mm256_fmadd_ps(_mm256_load_ps(w2 + i), xv, a2);
            a3 = _mm256_fmadd_ps(_mm256_load_ps(w3 + i), xv, a3);
        }
        y[j] = hsum256(a0) + layer->bias[j];
        y[j + 1] = hsum256(a1) + layer->bias[j + 1];
        y[j + 2] = hsum256(a2) + layer->bias[j + 2];
        y[j + 3] = hsum256(a3) + layer->bias[j + 3];
    }
    for (; j < end; j++) {
        const float *w = layer->weight + (size_t)j * in_pad;
        __m256 a = _mm256_setzero_ps();
        for (int i = 0; i < in_pad; i += LANES)
            a = _mm256_fmadd_ps(_mm256_load_ps(w + i), _mm256_load_ps(x + i), a);
        y[j] = hsum256(a) + layer->bias[j];
    }
}

__attribute__((target("avx2,fma"))) static void silu_avx2(float *values, int n) {
    for (int i = 0; i < n; i++) values[i] = values[i] / (1.0f + exp_approx(-values[i]));
}
#endif

static void free_plan(Plan *plan) {
    free(plan->arena);
    free(plan->layers);
    free(plan->mean);
    free(plan->std);
    free(plan->log_sigma);
    free(plan);
}

static void plan_capsule_destructor(PyObject *capsule) {
    free_plan(PyCapsule_GetPointer(capsule, "huggy_agent._native.Plan"));
}

/* Copies `rows` x `cols` float32 from a buffer into an aligned, zero-padded layout. */
static int copy_matrix(PyObject *object, int rows, int cols, int row_stride, float *into,
                       const char *what) {
    Py_buffer view;
    if (get_buffer(object, &view, 0, "f", (Py_ssize_t)rows * cols, what) < 0) return -1;
    const float *from = view.buf;
    for (int r = 0; r < rows; r++)
        memcpy(into + (size_t)r * row_stride, from + (size_t)r * cols, cols * sizeof(float));
    PyBuffer_Release(&view);
    return 0;
}

/* mlp_plan(mean | None, std | None, layers, log_sigma | None, sac, kernel) -> capsule.
 * layers: a sequence of (weight (out, in), bias (out,)) float32 buffers with their shapes as
 * (weight, bias, out, in) tuples: the hidden layers, then the output layer (mu, and for SAC the
 * log-sigma rows after it: 2 x actions rows). log_sigma: PPO's (actions,) shared log-sigma.
 * kernel: "avx2" or "generic". */
static PyObject *mlp_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "mlp_plan takes 6 arguments");
        return NULL;
    }
    PyObject *layers = PySequence_Fast(args[2], "layers must be a sequence");
    if (!layers) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(layers);
    int sac = PyObject_IsTrue(args[4]);
    const char *kernel = PyUnicode_AsUTF8(args[5]);
    Plan *plan = calloc(1, sizeof(Plan));
    if (!plan || count < 1 || sac < 0 || !kernel) goto fail;
    if (strcmp(kernel, "generic") == 0) {
        plan->gemv = gemv_generic;
        plan->silu = silu_generic;
        plan->kernel = "generic";
#ifdef HUGGY_X86
    } else if (strcmp(kernel, "avx2") == 0 && runs_avx2_mlp()) {
        plan->gemv = gemv_avx2;
        plan->silu = silu_avx2;
        plan->kernel = "avx2";
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "kernel %s does not run on this CPU", kernel);
        goto fail;
    }
    plan->sac = sac;
    plan->hidden_layers = (int)count - 1;
    plan->layers = calloc(count, sizeof(Layer));
    if (!plan->layers) goto fail;
    size_t weight_floats = 0, arena_size = 0;
    for (int pass = 0; pass < 2; pass++) { /* sizes, then the arena: weights in order, biases */
        if (pass == 1 && !(plan->arena = arena_floats(arena_size))) goto fail;
        size_t weight_at = 0, bias_at = weight_floats;
        for (Py_ssize_t l = 0; l < count; l++) {
            int out, in;
            PyObject *weight, *bias;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(layers, l), "OOii", &weight, &bias,
                                  &out, &in))
                goto fail;
            Layer *layer = &plan->layers[l];
            layer->out = out;
            layer->in = in;
            layer->in_pad = (int)padded(in);
            size_t weights = (size_t)out * layer->in_pad;
            if (pass == 0) {
                if (l < count - 1) plan->hidden_floats += weights;
                weight_floats += weights;
                arena_size += weights + padded(out);
                continue;
            }
            layer->weight = plan->arena + weight_at;
            layer->bias = plan->arena + bias_at;
            weight_at += weights;
            bias_at += padded(out);
            if (copy_matrix(weight, out, in, layer->in_pad, layer->weight, "weight") < 0 ||
                copy_matrix(bias, 1, out, out, layer->bias, "bias") < 0)
                goto fail;
            if (l == 0) plan->inputs = in;
            if (layer->in_pad > plan->widest) plan->widest = layer->in_pad;
            if ((int)padded(out) > plan->widest) plan->widest = (int)padded(out);
        }
    }
    Layer *last = &plan->layers[count - 1];
    plan->actions = sac ? last->out / 2 : last->out;
    if (args[0] != Py_None) {
        plan->mean = aligned_floats(plan->inputs);
        plan->std = aligned_floats(plan->inputs);
        if (!plan->mean || !plan->std) goto fail;
        if (copy_matrix(args[0], 1, plan->inputs, plan->inputs, plan->mean, "mean") < 0 ||
            copy_matrix(args[1], 1, plan->inputs, plan->inputs, plan->std, "std") < 0)
            goto fail;
    }
    if (!sac) {
        plan->log_sigma = aligned_floats(plan->actions);
        if (!plan->log_sigma ||
            copy_matrix(args[3], 1, plan->actions, plan->actions, plan->log_sigma,
                        "log_sigma") < 0)
            goto fail;
    }
    Py_DECREF(layers);
    PyObject *capsule = PyCapsule_New(plan, "huggy_agent._native.Plan", plan_capsule_destructor);
    if (!capsule) free_plan(plan);
    return capsule;
fail:
    Py_DECREF(layers);
    if (plan) free_plan(plan);
    if (!PyErr_Occurred()) PyErr_NoMemory();
    return NULL;
}

/* Rows [block * BLOCK_ROWS, ...) of hidden layer `l`: y = silu(W x + bias), and y's padding
 * zeroed by the block that ends the layer. Every value is the same as when the whole layer is
 * computed at once (see the GEMV kernels; SiLU is elementwise). */
static void hidden_block(const Plan *plan, int l, const float *x, float *y, int block) {
    const Layer *layer = &plan->layers[l];
    const int first = block * BLOCK_ROWS;
    const int end = first + BLOCK_ROWS < layer->out ? first + BLOCK_ROWS : layer->out;
    plan->gemv(layer, x, y, first, end);
    plan->silu(y + first, end - first);
    if (end == layer->out)
        for (int i = layer->out; i < (int)padded(layer->out); i++) y[i] = 0.0f;
}

static inline int layer_blocks(const Layer *layer) {
    return (layer->out + BLOCK_ROWS - 1) / BLOCK_ROWS;
}

/* ---------------------------------------------------------------------------------------------
 * The row helper: a second core for the hidden layers of one observation
 *
 * One observation reads every weight once; when other work has evicted them from the caches, one
 * core's share of the memory's bandwidth bounds the pass (about 140 us for Huggy's 2.2 MB on a
 * cloud vCPU, against 40 us with the weights cached). Two cores reading half each take about
 * half as long. But waking a sleeping thread costs as much (50 to 150 us under a hypervisor), so
 * the helper is woken ahead of the pass: `row_helper_arm`, called when a request enters an idle
 * server, wakes it, and it then waits, spinning, until the next pass (of any plan) or
 * ARM_WAIT_NS after the arm, then sleeps again.
 *
 * A pass shared with the helper is split into blocks of BLOCK_ROWS rows per hidden layer, which
 * either thread claims (an atomic counter per layer) and computes whole; both wait for the
 * layer's last block before the next layer. The caller never waits for the helper to join, only
 * for blocks the helper has claimed, so a helper that comes late, or not at all, costs nothing
 * but the counters. Each value is computed by the same code as in one thread (`hidden_block`):
 * the results are bit-identical either way.
 * ------------------------------------------------------------------------------------------- */

#ifdef HUGGY_THREADS
#define SHARED_LAYERS_MAX 8           /* hidden layers of a plan that a shared pass can take */
#define SHARED_MIN_FLOATS (64 * 1024) /* smaller hidden layers stay in the caches: not shared */
#define ARM_WAIT_NS 200000LL          /* how long an armed helper waits for a pass */

typedef struct {
    const Plan *plan;
    float *buffers[2]; /* hidden layer l reads buffers[l % 2] and writes the other */
    atomic_int next[SHARED_LAYERS_MAX], done[SHARED_LAYERS_MAX]; /* blocks claimed, finished */
} SharedPass;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int started, armed;         /* under lock: the thread runs; an arm it has not taken yet */
    atomic_llong deadline;      /* ns (CLOCK_MONOTONIC): the latest arm's end */
    atomic_int awake;           /* the helper waits for a pass now, spinning */
    atomic_int open;            /* a pass is open to the helper */
    atomic_int inside;          /* the helper is inside the open pass */
    atomic_int owned;           /* a caller holds `pass` */
    atomic_llong joined;        /* passes the helper computed blocks of */
    SharedPass pass;
} helper = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(HUGGY_X86)
    _mm_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#define SPINS_PER_YIELD 64 /* about 1-2 us of pauses */

/* One turn of a spin wait: a pause, and every SPINS_PER_YIELD turns a yield of the CPU. Where
 * the scheduler has put the waiting thread on the CPU of the thread it waits for (the other
 * busy: a woken helper preempts the caller that woke it), the one waited for runs again within
 * microseconds instead of after the spinner's time slice; alone on its CPU the yield returns at
 * once. */
static inline void spin_turn(unsigned *turns) {
    if (++*turns % SPINS_PER_YIELD == 0)
        sched_yield();
    else
        cpu_relax();
}

/* Claim and compute blocks of each hidden layer in turn, waiting for each layer's last block
 * before the next. Returns the number of blocks this thread computed. */
static int work_on(SharedPass *pass) {
    const Plan *plan = pass->plan;
    int computed = 0;
    for (int l = 0; l < plan->hidden_layers; l++) {
        const int blocks = layer_blocks(&plan->layers[l]);
        const float *x = pass->buffers[l % 2];
        float *y = pass->buffers[(l + 1) % 2];
        int block;
        while ((block = atomic_fetch_add(&pass->next[l], 1)) < blocks) {
            hidden_block(plan, l, x, y, block);
            atomic_fetch_add(&pass->done[l], 1);
            computed++;
        }
        unsigned turns = 0;
        while (atomic_load(&pass->done[l]) < blocks) spin_turn(&turns);
    }
    return computed;
}

static void *helper_main(void *unused) {
    (void)unused;
    for (;;) {
        pthread_mutex_lock(&helper.lock);
        while (!helper.armed) pthread_cond_wait(&helper.wake, &helper.lock);
        helper.armed = 0;
        pthread_mutex_unlock(&helper.lock);
        atomic_store(&helper.awake, 1);
        unsigned turns = 0;
        for (;;) {
            atomic_store(&helper.inside, 1); /* then check `open`: the caller's close waits */
            if (atomic_load(&helper.open)) {
                if (work_on(&helper.pass)) atomic_fetch_add(&helper.joined, 1);
                atomic_store(&helper.inside, 0);
                break;
            }
            atomic_store(&helper.inside, 0);
            if (monotonic_ns() > atomic_load(&helper.deadline)) break;
            spin_turn(&turns);
        }
        atomic_store(&helper.awake, 0);
    }
    return NULL;
}

/* A forked child has no helper thread: it starts its own on its first arm. */
static void helper_after_fork(void) {
    pthread_mutex_init(&helper.lock, NULL);
    pthread_cond_init(&helper.wake, NULL);
    helper.started = helper.armed = 0;
    atomic_store(&helper.awake, 0);
    atomic_store(&helper.open, 0);
    atomic_store(&helper.inside, 0);
    atomic_store(&helper.owned, 0);
}

/* Wake the helper (starting it on the first call); 0 if no thread could be started. */
static int arm_helper(void) {
    pthread_mutex_lock(&helper.lock);
    if (!helper.started) {
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&thread, &attributes, helper_main, NULL) == 0) {
            helper.started = 1;
            static int registered = 0;
            if (!registered) registered = pthread_atfork(NULL, NULL, helper_after_fork) == 0;
        }
        pthread_attr_destroy(&attributes);
    }
    if (helper.started) {
        atomic_store(&helper.deadline, monotonic_ns() + ARM_WAIT_NS);
        if (!helper.armed) {
            helper.armed = 1;
            pthread_cond_signal(&helper.wake);
        }
    }
    int started = helper.started;
    pthread_mutex_unlock(&helper.lock);
    return started;
}

/* The hidden layers of `plan` (input in a, the other buffer b) shared with the helper, if it is
 * awake and free and the layers are worth it; 0 (nothing computed) otherwise. */
static int share_hidden_layers(const Plan *plan, float *a, float *b) {
    if (!atomic_load(&helper.awake) || plan->hidden_layers > SHARED_LAYERS_MAX ||
        plan->hidden_floats < SHARED_MIN_FLOATS)
        return 0;
    int free_slot = 0;
    if (!atomic_compare_exchange_strong(&helper.owned, &free_slot, 1)) return 0;
    SharedPass *pass = &helper.pass;
    pass->plan = plan;
    pass->buffers[0] = a;
    pass->buffers[1] = b;
    for (int l = 0; l < plan->hidden_layers; l++) {
        atomic_store(&pass->next[l], 0);
        atomic_store(&pass->done[l], 0);
    }
    atomic_store(&helper.open, 1);
    work_on(pass);
    atomic_store(&helper.open, 0);
    unsigned turns = 0;
    while (atomic_load(&helper.inside)) spin_turn(&turns); /* the helper has left the pass */
    atomic_store(&helper.owned, 0);
    return 1;
}
#else
static int arm_helper(void) { return 0; }
static int share_hidden_layers(const Plan *plan, float *a, float *b) {
    (void)plan, (void)a, (void)b;
    return 0;
}
#endif

/* One observation through the plan: the outputs (mu, then SAC's raw log-sigma) into `outputs`.
 * Returns 0, or -1 when an observation value is not finite. */
static int run_plan(const Plan *plan, const float *obs, float *outputs, float *scratch) {
    float *a = scratch, *b = scratch + plan->widest;
    for (int i = 0; i < plan->inputs; i++) {
        if (!isfinite(obs[i])) return -1;
        float value = obs[i];
        if (plan->mean) {
            value = (value - plan->mean[i]) / plan->std[i];
            value = value < -NORMALIZER_CLIP ? -NORMALIZER_CLIP
                                             : (value > NORMALIZER_CLIP ? NORMALIZER_CLIP : value);
        }
        a[i] = value;
    }
    for (int i = plan->inputs; i < plan->widest; i++) a[i] = 0.0f;
    if (!share_hidden_layers(plan, a, b)) {
        for (int l = 0; l < plan->hidden_layers; l++)
            for (int block = 0; block < layer_blocks(&plan->layers[l]); block++)
                hidden_block(plan, l, l % 2 ? b : a, l % 2 ? a : b, block);
    }
    const Layer *output = &plan->layers[plan->hidden_layers];
    plan->gemv(output, plan->hidden_layers % 2 ? b : a, outputs, 0, output->out);
    return 0;
}

static Plan *get_plan(PyObject *capsule) {
    return PyCapsule_GetPointer(capsule, "huggy_agent._native.Plan");
}

static inline float clamp_log_sigma(float value) {
    return value < SAC_LOG_SIGMA_LOW ? SAC_LOG_SIGMA_LOW
                                     : (value > SAC_LOG_SIGMA_HIGH ? SAC_LOG_SIGMA_HIGH : value);
}

/* The actions of one row from its raw outputs (mu, then SAC's raw log-sigma) and noise z (NULL:
 * deterministic). PPO: clip(mu + z exp(log_sigma), -3, 3) / 3; SAC: tanh(mu + z exp(log_sigma)). */
static void head(const Plan *plan, const float *raw, const float *z, float *actions) {
    const int c = plan->actions;
    for (int i = 0; i < c; i++) {
        float action = raw[i];
        if (z) {
            float log_sigma = plan->sac ? clamp_log_sigma(raw[c + i]) : plan->log_sigma[i];
            action = action + z[i] * expf(log_sigma);
        }
        if (plan->sac) {
            actions[i] = tanhf(action);
        } else {
            action = action < -PPO_CLIP ? -PPO_CLIP : (action > PPO_CLIP ? PPO_CLIP : action);
            actions[i] = action / PPO_CLIP;
        }
    }
}

/* mlp_act and mlp_forward: (plan, obs, out, extra, rows) -> bool, False (and `out` written only
 * up to that row) if an observation value is not finite.
 * - act: `out` the actions (rows, actions); `extra` the noise (rows, actions), or None for
 *   deterministic actions;
 * - forward: `out` mu (rows, actions); `extra` SAC's log-sigma (rows, actions), clamped to
 *   [-20, 2], or None for PPO (whose shared log-sigma is the caller's). */
static PyObject *run_rows(const char *name, int act, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "%s takes 5 arguments, got %zd", name, nargs);
        return NULL;
    }
    Plan *plan = get_plan(args[0]);
    Py_ssize_t rows;
    if (!plan || as_count(args[4], &rows, "rows") < 0) return NULL;
    const int c = plan->actions;
    int has_extra = act ? args[3] != Py_None : plan->sac;
    Py_buffer obs, out, extra;
    if (get_buffer(args[1], &obs, 0, "f", rows * plan->inputs, "obs") < 0) return NULL;
    if (get_buffer(args[2], &out, 1, "f", rows * c, act ? "actions" : "mu") < 0) {
        PyBuffer_Release(&obs);
        return NULL;
    }
    if (has_extra && get_buffer(args[3], &extra, !act, "f", rows * c,
                                act ? "noise" : "log_sigma") < 0) {
        PyBuffer_Release(&obs);
        PyBuffer_Release(&out);
        return NULL;
    }
    int status = 0;
    float *scratch = aligned_floats((size_t)2 * plan->widest + 2 * padded(c));
    if (!scratch) status = -2;
    Py_BEGIN_ALLOW_THREADS
    float *raw = scratch ? scratch + 2 * plan->widest : NULL;
    for (Py_ssize_t r = 0; r < rows && status == 0; r++) {
        status = run_plan(plan, (const float *)obs.buf + r * plan->inputs, raw, scratch);
        if (status) break;
        float *row_out = (float *)out.buf + r * c;
        float *row_extra = has_extra ? (float *)extra.buf + r * c : NULL;
        if (act) {
            head(plan, raw, row_extra, row_out);
        } else {
            memcpy(row_out, raw, c * sizeof(float));
            for (int i = 0; row_extra && i < c; i++) row_extra[i] = clamp_log_sigma(raw[c + i]);
        }
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    PyBuffer_Release(&obs);
    PyBuffer_Release(&out);
    if (has_extra) PyBuffer_Release(&extra);
    if (status == -2) return PyErr_NoMemory();
    return PyBool_FromLong(status == 0);
}

static PyObject *mlp_act(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return run_rows("mlp_act", 1, args, nargs);
}

static PyObject *mlp_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    return run_rows("mlp_forward", 0, args, nargs);
}

/* mlp_kernel(plan) -> str: the kernel the plan runs. */
static PyObject *mlp_kernel(PyObject *self, PyObject *capsule) {
    (void)self;
    Plan *plan = get_plan(capsule);
    return plan ? PyUnicode_FromString(plan->kernel) : NULL;
}

/* row_helper_arm() -> bool: wake the row helper for the next one-observation pass; False where
 * the package was built without threads or none could be started. */
static PyObject *row_helper_arm(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(arm_helper());
}

/* row_helper_state() -> (awake, joined): whether the helper waits for a pass now, and how many
 * passes it has computed blocks of in this process. */
static PyObject *row_helper_state(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#ifdef HUGGY_THREADS
    return Py_BuildValue("(NL)", PyBool_FromLong(atomic_load(&helper.awake)),
                         (long long)atomic_load(&helper.joined));
#else
    return Py_BuildValue("(NL)", PyBool_FromLong(0), 0LL);
#endif
}

/* kernels() -> tuple[str, ...]: the MLP kernels this CPU runs, fastest first. */
static PyObject *kernels(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (runs_avx2_mlp()) return Py_BuildValue("(ss)", "avx2", "generic");
    return Py_BuildValue("(s)", "generic");
}

/* noise_kernels() -> tuple[str, ...]: the noise kernels this CPU runs, fastest first. */
static PyObject *noise_kernels(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (runs_avx2_noise()) return Py_BuildValue("(ss)", "avx2", "generic");
    return Py_BuildValue("(s)", "generic");
}

/* json_obs_row(body, row) -> (deterministic, seed, row_offset) | None: json_act_read (see
 * json_act_body.h) of the body's bytes; row a writable C-contiguous float32 buffer of the
 * policy's observation size, filled on success (left undefined on None); seed None where the
 * body gives none or null. */
static PyObject *json_obs_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "json_obs_row takes 2 arguments, got %zd", nargs);
        return NULL;
    }
    Py_buffer body, row;
    if (PyObject_GetBuffer(args[0], &body, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &row, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) <
        0) {
        PyBuffer_Release(&body);
        return NULL;
    }
    if (strcmp(row.format, "f") != 0 || row.len == 0) {
        PyErr_Format(PyExc_ValueError, "row: expected a non-empty C-contiguous float32 buffer, "
                     "got %zd bytes of format '%s'", row.len, row.format);
        PyBuffer_Release(&body);
        PyBuffer_Release(&row);
        return NULL;
    }
    struct json_act_options options;
    enum json_act_result read = json_act_read((const char *)body.buf, (size_t)body.len,
                                              (float *)row.buf,
                                              (size_t)(row.len / row.itemsize), &options);
    PyBuffer_Release(&body);
    PyBuffer_Release(&row);
    if (read != JSON_ACT_READ) Py_RETURN_NONE;
    PyObject *seed_object = Py_None;
    if (options.has_seed && !(seed_object = PyLong_FromUnsignedLongLong(options.seed)))
        return NULL;
    if (!options.has_seed) Py_INCREF(Py_None);
    return Py_BuildValue("(NNK)", PyBool_FromLong(options.deterministic), seed_object,
                         (unsigned long long)options.row_offset);
}

static PyMethodDef methods[] = {
    {"gaussian_noise", (PyCFunction)(void (*)(void))gaussian_noise, METH_FASTCALL, NULL},
    {"uniform_noise", (PyCFunction)(void (*)(void))uniform_noise, METH_FASTCALL, NULL},
    {"mlp_plan", (PyCFunction)(void (*)(void))mlp_plan, METH_FASTCALL, NULL},
    {"mlp_act", (PyCFunction)(void (*)(void))mlp_act, METH_FASTCALL, NULL},
    {"mlp_forward", (PyCFunction)(void (*)(void))mlp_forward, METH_FASTCALL, NULL},
    {"mlp_kernel", mlp_kernel, METH_O, NULL},
    {"row_helper_arm", row_helper_arm, METH_NOARGS, NULL},
    {"row_helper_state", row_helper_state, METH_NOARGS, NULL},
    {"kernels", kernels, METH_NOARGS, NULL},
    {"noise_kernels", noise_kernels, METH_NOARGS, NULL},
    {"json_obs_row", (PyCFunction)(void (*)(void))json_obs_row, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The package's compiled kernels (see _native.c).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
