/* Fused sketch kernel for naig (docs/design.md §5): the fast path of naig.sketch.kernels.
 *
 * hash_codes(key, start, out):  out[i] = a_i | (sign_bit_i << 7) for flat indices
 *     start <= start + i < start + len(out), where h_i = splitmix64(key + index),
 *     a_i = (h_i >> 32) mod 14 and sign_bit_i = h_i & 1 (1 means s_i = -1).
 * accumulate(codes, ref, x, out):  one pass over a chunk, float64 accumulation:
 *     out[0:14] += S x,  out[14] += <x, ref>,  out[15] += |x|^2,  out[16] += |x - ref|^2.
 *     ref and x are float32 or float64 buffers of the same format and length.
 * Both release the GIL. The readable reference is naig.sketch; naig.kernels holds the
 * numpy path with the same contract, and tests check all three agree in float64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static const double SIGN[2] = {1.0, -1.0};

static inline uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static PyObject *hash_codes(PyObject *self, PyObject *args) {
    unsigned long long key, start;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "KKw*", &key, &start, &out)) return NULL;
    uint8_t *codes = (uint8_t *)out.buf;
    Py_ssize_t m = out.len;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m; i++) {
        uint64_t h = splitmix64((uint64_t)key + (uint64_t)start + (uint64_t)i);
        codes[i] = (uint8_t)(((uint32_t)(h >> 32) % 14u) | ((h & 1) << 7));
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* Four independent accumulator banks break the store-to-load chains of the
 * scatter; the three inner products use four partial sums each. */
#define ACCUMULATE(T)                                                         \
    do {                                                                      \
        const T *r = (const T *)ref.buf, *x = (const T *)xb.buf;              \
        double bank[4][16] = {{0}}, pd[4] = {0}, px[4] = {0}, pq[4] = {0};    \
        Py_ssize_t i = 0;                                                     \
        for (; i + 4 <= m; i += 4) {                                          \
            for (int u = 0; u < 4; u++) {                                     \
                double xi = (double)x[i + u], ri = (double)r[i + u];          \
                double di = xi - ri;                                          \
                uint8_t c = codes[i + u];                                     \
                bank[u][c & 15] += SIGN[c >> 7] * xi;                          \
                pd[u] += xi * ri; px[u] += xi * xi; pq[u] += di * di;         \
            }                                                                 \
        }                                                                     \
        for (; i < m; i++) {                                                  \
            double xi = (double)x[i], ri = (double)r[i], di = xi - ri;        \
            uint8_t c = codes[i];                                             \
            bank[0][c & 15] += SIGN[c >> 7] * xi;                              \
            pd[0] += xi * ri; px[0] += xi * xi; pq[0] += di * di;             \
        }                                                                     \
        for (int a = 0; a < 16; a++)                                          \
            acc[a] = (bank[0][a] + bank[1][a]) + (bank[2][a] + bank[3][a]);   \
        dot = (pd[0] + pd[1]) + (pd[2] + pd[3]);                              \
        xx = (px[0] + px[1]) + (px[2] + px[3]);                               \
        dd = (pq[0] + pq[1]) + (pq[2] + pq[3]);                               \
    } while (0)

static PyObject *accumulate(PyObject *self, PyObject *args) {
    Py_buffer cb, ref, xb, ob;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &cb, &ref, &xb, &ob)) return NULL;
    Py_ssize_t m = cb.len, isz = m ? ref.len / m : 4;
    PyObject *result = NULL;
    if (ob.len != 17 * (Py_ssize_t)sizeof(double) || ref.len != xb.len ||
        (isz != 4 && isz != 8) || ref.len != m * isz) {
        PyErr_SetString(PyExc_ValueError,
                        "accumulate: expected codes (m,), ref and x of m float32 or m float64, "
                        "out of 17 float64");
        goto done;
    }
    {
        const uint8_t *codes = (const uint8_t *)cb.buf;
        double *out = (double *)ob.buf, acc[16] = {0}, dot = 0, xx = 0, dd = 0;
        Py_BEGIN_ALLOW_THREADS
        if (isz == 4) ACCUMULATE(float); else ACCUMULATE(double);
        Py_END_ALLOW_THREADS
        for (int a = 0; a < 14; a++) out[a] += acc[a];
        out[14] += dot; out[15] += xx; out[16] += dd;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&cb); PyBuffer_Release(&ref); PyBuffer_Release(&xb); PyBuffer_Release(&ob);
    return result;
}

static PyMethodDef methods[] = {
    {"hash_codes", hash_codes, METH_VARARGS, "hash_codes(key, start, out_uint8): sketch codes."},
    {"accumulate", accumulate, METH_VARARGS, "accumulate(codes, ref, x, out17): fused pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernel(void) { return PyModule_Create(&module); }
