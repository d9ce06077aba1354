/* Line protocol tokenizer for the analyzer: one pass over a chunk of lines, in C.
 *
 * A Scanner keeps, across the chunks it is given, every series head (measurement + tags, byte for
 * byte as written) and every group (measurement + field keys in order) it has seen, each under a
 * small id. Scanner.scan(data) walks every line of a chunk once and returns what analyzer/parse.py
 * needs to build columns:
 *
 *   - the heads and groups first seen in this chunk (their bytes: parse.py parses a head once);
 *   - for every line in the plain form InfluxDB reads without surprises (see below), ordered by
 *     group (groups in order of first appearance in the chunk, lines in chunk order within one):
 *     its head id, the index of its first field, its timestamp and where it lies in the chunk;
 *   - for every field: the value as a double (NaN for strings) and a type code; the exact int64
 *     of integers beyond +-2^53 and where string values lie, as short side lists;
 *   - for every group parse.py has planned (Scanner.columns: the fields it keeps), those fields'
 *     values and types gathered column by column;
 *   - the start and end of every other line: parse.py hands those to the reference parser
 *     (gpufleet/lineprotocol.py, InfluxDB 1.x's own rules), which decides and counts.
 *
 * A writer sends its series in one order, so the head that followed the previous line's head last
 * time is compared first, before the table of heads. A series writes one or two field sets (fast
 * and slow tier) in one order, so a line's keys are compared with those of its series' last group
 * as they are met (equal bytes followed by "=" are that key, no scan for the byte that ends it),
 * and where they part, with its other group's; its numbers first take a fast path for the usual
 * short integers and decimals. Whatever the fast paths do not take goes the general way.
 *
 * The plain form, all as InfluxDB 1.6.7 reads it: no leading whitespace; the head ends at the
 * first space whose previous byte is not a backslash (escapes and quotes in the head are parsed
 * once per series by parse.py); one space; fields key=value with keys free of backslashes,
 * quotes, commas, spaces and equals signs; values: a string (quoted, backslash escapes, closed
 * right before a comma or space), an integer -?digits followed by i within int64, a boolean
 * (t T true True TRUE f F false False FALSE), or a float -?digits[.digits][e[+-]digits]
 * (finite); one space; a timestamp -?digits within [-2^63+2, 2^63-2] ending the line. Anything
 * else, valid or not, takes the reference parser.
 *
 * Numbers are converted exactly: decimal tokens with at most 19 significant digits and a
 * small power of ten take Clinger's fast path (one correctly rounded IEEE operation),
 * everything else goes through PyOS_string_to_double, Python's own correctly rounded strtod.
 * The module uses only the stable parts of the C API and no numpy headers; results travel as
 * bytearrays that parse.py views with numpy.frombuffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { T_FLOAT = 1, T_INT = 2, T_BOOL = 3, T_STR = 4 }; /* 0: absent (parse.py) */

typedef struct {
    PyObject *obj; /* bytearray */
    char *p;
    Py_ssize_t n, cap, item;
} Vec;

static int vec_init(Vec *v, Py_ssize_t cap, Py_ssize_t item) {
    if (cap < 1) cap = 1;
    v->obj = PyByteArray_FromStringAndSize(NULL, cap * item);
    if (!v->obj) return -1;
    v->p = PyByteArray_AS_STRING(v->obj);
    v->n = 0;
    v->cap = cap;
    v->item = item;
    return 0;
}

static int vec_finish(Vec *v) { return PyByteArray_Resize(v->obj, v->n * v->item); }

static int vec_grow(Vec *v, Py_ssize_t cap) {
    if (PyByteArray_Resize(v->obj, cap * v->item)) return -1;
    v->p = PyByteArray_AS_STRING(v->obj);
    v->cap = cap;
    return 0;
}

#define AT(v, T) ((T *)(v).p)

/* ------------------------------------------------------------------ hashing */
static inline uint64_t mix(uint64_t h, uint64_t w) {
    h ^= w * 0x9E3779B97F4A7C15ULL;
    h = (h << 31) | (h >> 33);
    return h * 0xC2B2AE3D27D4EB4FULL;
}

/* Four lanes of 8-byte words (a series head is ~120 bytes: the lanes' multiplies overlap), folded
 * into one hash with mix(). The tables compare bytes: the hash only has to spread. */
static inline uint64_t lane(uint64_t h, uint64_t w, uint64_t k) {
    h = (h ^ w) * k;
    return (h << 29) | (h >> 35);
}

static uint64_t hash_bytes(const char *s, Py_ssize_t n, uint64_t h) {
    uint64_t w, x, y, z, a = h, b = ~h, c = h ^ 0x452821E638D01377ULL, e = h ^ 0xBE5466CF34E90C6CULL;
    Py_ssize_t len = n;
    while (n >= 32) {
        memcpy(&w, s, 8);
        memcpy(&x, s + 8, 8);
        memcpy(&y, s + 16, 8);
        memcpy(&z, s + 24, 8);
        a = lane(a, w, 0x9E3779B97F4A7C15ULL);
        b = lane(b, x, 0xC2B2AE3D27D4EB4FULL);
        c = lane(c, y, 0x165667B19E3779F9ULL);
        e = lane(e, z, 0xD6E8FEB86659FD93ULL);
        s += 32;
        n -= 32;
    }
    h = mix(mix(mix(a, b), c), e);
    while (n >= 8) {
        memcpy(&w, s, 8);
        h = mix(h, w);
        s += 8;
        n -= 8;
    }
    w = 0;
    memcpy(&w, s, (size_t)n);
    return mix(h, w ^ ((uint64_t)len << 48));
}

/* Open-addressing table of ids; the caller compares candidates itself. */
typedef struct {
    int64_t *slot; /* id + 1, 0 = empty */
    uint64_t *hash;
    Py_ssize_t mask, used;
} Table;

static int table_init(Table *t, Py_ssize_t want) {
    Py_ssize_t cap = 64;
    while (cap < 2 * want) cap <<= 1;
    t->slot = PyMem_Calloc((size_t)cap, sizeof(int64_t));
    t->hash = PyMem_Calloc((size_t)cap, sizeof(uint64_t));
    t->mask = cap - 1;
    t->used = 0;
    if (!t->slot || !t->hash) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void table_free(Table *t) {
    PyMem_Free(t->slot);
    PyMem_Free(t->hash);
}

static int table_grow(Table *t) {
    Py_ssize_t cap = (t->mask + 1) * 2, i;
    int64_t *slot = PyMem_Calloc((size_t)cap, sizeof(int64_t));
    uint64_t *hash = PyMem_Calloc((size_t)cap, sizeof(uint64_t));
    if (!slot || !hash) {
        PyMem_Free(slot);
        PyMem_Free(hash);
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i <= t->mask; i++) {
        if (t->slot[i]) {
            Py_ssize_t j = (Py_ssize_t)(t->hash[i] & (uint64_t)(cap - 1));
            while (slot[j]) j = (j + 1) & (cap - 1);
            slot[j] = t->slot[i];
            hash[j] = t->hash[i];
        }
    }
    table_free(t);
    t->slot = slot;
    t->hash = hash;
    t->mask = cap - 1;
    return 0;
}

/* ------------------------------------------------------------------ numbers */
static const double POW10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int slow_double(const char *s, Py_ssize_t n, double *out) {
    char buf[512];
    char *end;
    double v;
    if (n <= 0 || n >= (Py_ssize_t)sizeof(buf)) return -1;
    memcpy(buf, s, (size_t)n);
    buf[n] = 0;
    v = PyOS_string_to_double(buf, &end, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (end != buf + n) return -1;
    *out = v;
    return 0;
}

/* A float token in InfluxDB's grammar: -?(digits[.digits*]|.digits)([eE][+-]?digits)?, finite.
 * 0 on success. */
static int parse_float(const char *s, Py_ssize_t n, double *out) {
    const char *p = s, *e = s + n;
    int neg = 0, digits = 0, sig = 0;
    uint64_t m = 0;
    int64_t exp10 = 0;
    if (p < e && *p == '-') neg = 1, p++;
    for (; p < e && (unsigned)(*p - '0') < 10; p++, digits++) {
        if (m || *p != '0') {
            if (sig < 19) m = m * 10 + (uint64_t)(*p - '0');
            else exp10++;
            sig++;
        }
    }
    if (p < e && *p == '.') {
        p++;
        for (; p < e && (unsigned)(*p - '0') < 10; p++, digits++) {
            if (m || *p != '0') {
                if (sig < 19) {
                    m = m * 10 + (uint64_t)(*p - '0');
                    exp10--;
                }
                sig++;
            } else {
                exp10--;
            }
        }
    }
    if (!digits) return -1;
    if (p < e && (*p == 'e' || *p == 'E')) {
        int eneg = 0, ed = 0;
        int64_t x = 0;
        p++;
        if (p < e && (*p == '-' || *p == '+')) eneg = (*p++ == '-');
        for (; p < e && (unsigned)(*p - '0') < 10; p++, ed++)
            if (x < 100000) x = x * 10 + (*p - '0');
        if (!ed) return -1;
        exp10 += eneg ? -x : x;
    }
    if (p != e) return -1;
    if (sig <= 19 && m < (1ULL << 53) && exp10 >= -22 && exp10 <= 22) {
        double v = (double)m;
        v = exp10 < 0 ? v / POW10[-exp10] : v * POW10[exp10];
        *out = neg ? -v : v;
        return 0;
    }
    if (slow_double(s, n, out) || !isfinite(*out)) return -1; /* InfluxDB refuses an overflow */
    return 0;
}

/* -?digits (the i already cut off) within int64. */
static int parse_int(const char *s, Py_ssize_t n, int64_t *out) {
    const char *p = s, *e = s + n;
    int neg = 0;
    uint64_t m = 0;
    if (p < e && *p == '-') neg = 1, p++;
    if (p == e) return -1;
    for (; p < e; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (d >= 10) return -1;
        /* m * 10 + d overflows: UINT64_MAX is 1844674407370955161 * 10 + 5 (no division here) */
        if (m >= 1844674407370955161ULL && (m > 1844674407370955161ULL || d > 5)) return -1;
        m = m * 10 + d;
    }
    if (m > (uint64_t)INT64_MAX + (uint64_t)neg) return -1;
    *out = neg ? (int64_t)(0 - m) : (int64_t)m;
    return 0;
}

static int parse_bool(const char *s, Py_ssize_t n, double *out) {
    static const char *T[] = {"t", "T", "true", "True", "TRUE"};
    static const char *F[] = {"f", "F", "false", "False", "FALSE"};
    int i;
    for (i = 0; i < 5; i++) {
        if ((Py_ssize_t)strlen(T[i]) == n && !memcmp(s, T[i], (size_t)n)) {
            *out = 1.0;
            return 0;
        }
        if ((Py_ssize_t)strlen(F[i]) == n && !memcmp(s, F[i], (size_t)n)) {
            *out = 0.0;
            return 0;
        }
    }
    return -1;
}

/* Type code of a plain value token, or 0 when it is not one (the reference parser decides). */
static int parse_value(const char *s, Py_ssize_t n, double *out, int64_t *iv) {
    char last = s[n - 1];
    if (last == 'i') {
        if (parse_int(s, n - 1, iv)) return 0;
        *out = (double)*iv;
        return T_INT;
    }
    if ((unsigned)(last - '0') < 10 || last == '.') return parse_float(s, n, out) ? 0 : T_FLOAT;
    return parse_bool(s, n, out) ? 0 : T_BOOL;
}

/* A run of decimal digits from p (up to pe): where it ends, its value added to *m (*m * 10^k +
 * the k digits, modulo 2^64: the callers bound k). lim: the end of the buffer (8-byte reads stay
 * before it). Eight digits at a time where the byte order allows: for long runs (timestamps);
 * values, mostly a few digits, read faster one byte at a time (digits). */
static const uint64_t IPOW10[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SWAR_DIGITS 1
static inline uint64_t eight_digits(uint64_t x) { /* 8 ASCII digits, the first in the low byte */
    x -= 0x3030303030303030ULL;
    x = x * 10 + (x >> 8);
    return (((x & 0x000000FF000000FFULL) * (100 + (1000000ULL << 32))) +
            (((x >> 16) & 0x000000FF000000FFULL) * (1 + (10000ULL << 32)))) >>
           32;
}

static inline int leading_digits(uint64_t x) { /* how many of x's bytes, from the low one, are digits */
    const uint64_t hi = 0xF0F0F0F0F0F0F0F0ULL, zeros = 0x3030303030303030ULL;
    uint64_t z = ((x & hi) ^ zeros) | (((x + 0x0606060606060606ULL) & hi) ^ zeros); /* 0 bytes: digits */
    uint64_t t = (((z & 0x7F7F7F7F7F7F7F7FULL) + 0x7F7F7F7F7F7F7F7FULL) | z) & 0x8080808080808080ULL;
    return t ? __builtin_ctzll(t) >> 3 : 8; /* a carry only reaches bytes after the first non-digit */
}
#endif

static inline const char *digit_run(const char *p, const char *pe, const char *lim, uint64_t *m) {
    uint64_t v = *m;
#ifdef SWAR_DIGITS
    while (p + 8 <= lim) {
        uint64_t x;
        int k;
        memcpy(&x, p, 8);
        k = leading_digits(x);
        if (p + k > pe) break;
        if (k == 8) {
            v = v * 100000000ULL + eight_digits(x);
            p += 8;
            continue;
        }
        if (k) {
            x = (x << (8 * (8 - k))) | (0x3030303030303030ULL >> (8 * k)); /* leading zeros */
            v = v * IPOW10[k] + eight_digits(x);
            p += k;
        }
        *m = v;
        return p;
    }
#else
    (void)lim;
#endif
    for (; p < pe && (unsigned)(*p - '0') < 10; p++) v = v * 10 + (uint64_t)(*p - '0');
    *m = v;
    return p;
}

static inline const char *digits(const char *p, const char *pe, uint64_t *m) {
    uint64_t v = *m;
    for (; p < pe && (unsigned)(*p - '0') < 10; p++) v = v * 10 + (uint64_t)(*p - '0');
    *m = v;
    return p;
}

/* Timestamp: -?digits within InfluxDB's range [-2^63+2, 2^63-2]. */
static int parse_ts(const char *s, Py_ssize_t n, int64_t *out, const char *lim) {
    const char *p = s + (n > 0 && *s == '-');
    uint64_t m = 0;
    Py_ssize_t k = n - (p - s);
    if (k < 1 || k > 19 || digit_run(p, s + n, lim, &m) != s + n) return -1; /* 19 digits: < 2^64 */
    if (m > (uint64_t)INT64_MAX - 1) return -1;
    *out = p > s ? -(int64_t)m : (int64_t)m;
    return 0;
}

/* ------------------------------------------------------------------ scan */
/* SWAR (8 bytes at a time): a mask with the high bit set in the first byte of x equal to c (the
 * bits above the first match may be wrong: only the lowest set bit is read). */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL
static inline uint64_t eq_mask(uint64_t x, unsigned char c) {
    uint64_t y = x ^ (ONES * c);
    return (y - ONES) & ~y & HIGHS;
}

/* The bytes that end a field key or an unquoted value: = , space backslash quote. */
static const unsigned char KEY_STOP[256] = {['='] = 1, [','] = 1, [' '] = 1, ['\\'] = 1, ['"'] = 1};

/* The first byte at or after j and before e that is one of KEY_STOP's (e if none); the buffer
 * holds n bytes, so a word read past e (and not past n) is fine. */
static inline Py_ssize_t key_stop(const char *d, Py_ssize_t j, Py_ssize_t e, Py_ssize_t n) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (j + 8 <= n && j < e) {
        uint64_t x, m;
        memcpy(&x, d + j, 8);
        m = eq_mask(x, '=') | eq_mask(x, ',') | eq_mask(x, ' ') | eq_mask(x, '\\') | eq_mask(x, '"');
        if (m) {
            j += __builtin_ctzll(m) >> 3;
            return j < e ? j : e;
        }
        j += 8;
    }
    if (j >= e) return e;
#else
    (void)n;
#endif
    while (j < e && !KEY_STOP[(unsigned char)d[j]]) j++;
    return j;
}


/* Are the n bytes at a and b equal? (short keys: word compares, no call) */
static inline int bytes_eq(const char *a, const char *b, Py_ssize_t n) {
    uint64_t x, y;
    if (n >= 8) {
        Py_ssize_t i;
        for (i = 0; i + 8 <= n; i += 8) {
            memcpy(&x, a + i, 8);
            memcpy(&y, b + i, 8);
            if (x != y) return 0;
        }
        if (i == n) return 1;
        memcpy(&x, a + n - 8, 8); /* the tail, as the last 8 bytes (overlapping) */
        memcpy(&y, b + n - 8, 8);
        return x == y;
    }
    if (n >= 4) {
        uint32_t u, w;
        memcpy(&u, a, 4);
        memcpy(&w, b, 4);
        if (u != w) return 0;
        memcpy(&u, a + n - 4, 4);
        memcpy(&w, b + n - 4, 4);
        return u == w;
    }
    while (n-- > 0)
        if (*a++ != *b++) return 0;
    return 1;
}

/* A number value in its usual short form, -?digits then i (an integer, at most 18 digits: within
 * int64) or -?digits[.digits] (a float, at most 15 digits: exact in a double, one correctly
 * rounded division), followed by a comma or a space: its type, with *end at that byte. 0 for
 * anything else: the general path (parse_value) decides, with the same result for every token
 * taken here. */
static inline int fast_number(const char *p, const char *pe, double *out, int64_t *iv, const char **end) {
    const char *d0;
    uint64_t m = 0;
    Py_ssize_t nd, nf;
    int neg = 0;
    if (p < pe && *p == '-') neg = 1, p++;
    d0 = p;
    p = digits(p, pe, &m);
    nd = p - d0;
    if (!nd || nd > 18 || p >= pe) return 0;
    if (*p == 'i') {
        if (++p >= pe || (*p != ',' && *p != ' ')) return 0;
        *iv = neg ? -(int64_t)m : (int64_t)m;
        *out = (double)*iv;
        *end = p;
        return T_INT;
    }
    if (nd > 15) return 0;
    if (*p == '.') {
        const char *f = ++p;
        double v;
        p = digits(p, pe, &m);
        nf = p - f;
        if (nd + nf > 15 || p >= pe) return 0;
        v = nf ? (double)m / POW10[nf] : (double)m;
        *out = neg ? -v : v;
    } else {
        *out = neg ? -(double)m : (double)m;
    }
    if (*p != ',' && *p != ' ') return 0;
    *end = p;
    return T_FLOAT;
}

/* ------------------------------------------------------------------ growable arrays */
typedef struct {
    int64_t *p;
    Py_ssize_t n, cap;
} I64;

static int i64_reserve(I64 *a, Py_ssize_t need) {
    Py_ssize_t cap = a->cap ? a->cap : 64;
    int64_t *p;
    if (need <= a->cap) return 0;
    while (cap < need) cap *= 2;
    p = PyMem_Realloc(a->p, (size_t)cap * sizeof(int64_t));
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    a->p = p;
    a->cap = cap;
    return 0;
}

static inline int i64_push(I64 *a, int64_t v) {
    if (a->n == a->cap && i64_reserve(a, a->n + 1)) return -1;
    a->p[a->n++] = v;
    return 0;
}

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} Blob;

/* Append n bytes; their offset in *off. */
static int blob_add(Blob *b, const char *s, Py_ssize_t n, int64_t *off) {
    if (b->n + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 4096;
        char *p;
        while (cap < b->n + n) cap *= 2;
        p = PyMem_Realloc(b->p, (size_t)cap);
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, (size_t)n);
    *off = b->n;
    b->n += n;
    return 0;
}

/* ------------------------------------------------------------------ the scanner */
typedef struct {
    PyObject_HEAD
    Table heads, groups;
    Blob hb, gb;                       /* head bytes; group measurement and key bytes */
    I64 h_off, h_len, h_meas, h_rec0, h_rec1, h_next; /* per head: bytes, measurement length, last 2
                                                      * groups, the head of the line after its last */
    I64 g_moff, g_mlen, g_k0, g_nf, g_stamp, g_local, g_plan, g_nplan; /* per group (plan: columns wanted) */
    I64 plan;                          /* the groups' wanted field positions */
    I64 k_off, k_len;                  /* per group key (a group's keys: g_k0 .. g_k0 + g_nf) */
    I64 tk0, tkn;                      /* scratch: the key spans of the line being read */
    I64 loc;                           /* per call: local group -> group id */
    int64_t calls, prev, trust; /* prev: the head of the last line read; trust: how well h_next guesses */
} Scanner;

static void scanner_free(Scanner *s) {
    I64 *arrs[] = {&s->h_off, &s->h_len, &s->h_meas, &s->h_rec0, &s->h_rec1, &s->h_next, &s->g_moff, &s->g_mlen,
                   &s->g_k0,  &s->g_nf,  &s->g_stamp, &s->g_local, &s->g_plan, &s->g_nplan, &s->plan, &s->k_off, &s->k_len, &s->tk0,
                   &s->tkn,   &s->loc};
    size_t i;
    for (i = 0; i < sizeof(arrs) / sizeof(arrs[0]); i++) PyMem_Free(arrs[i]->p);
    PyMem_Free(s->hb.p);
    PyMem_Free(s->gb.p);
    table_free(&s->heads);
    table_free(&s->groups);
}

static PyObject *scanner_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Scanner *s;
    if ((args && PyTuple_Size(args)) || (kw && PyDict_Size(kw))) {
        PyErr_SetString(PyExc_TypeError, "Scanner() takes no arguments");
        return NULL;
    }
    s = (Scanner *)PyType_GenericAlloc(type, 0); /* zeroed */
    if (!s) return NULL;
    s->prev = -1;
    if (table_init(&s->heads, 1024) || table_init(&s->groups, 64)) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static void scanner_dealloc(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    scanner_free((Scanner *)self);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

/* The id of the head d[a:a+n], added when new (-1 on error). */
static Py_ssize_t head_id(Scanner *S, const char *d, Py_ssize_t a, Py_ssize_t n) {
    uint64_t h = hash_bytes(d + a, n, 0x243F6A8885A308D3ULL);
    Py_ssize_t s = (Py_ssize_t)(h & (uint64_t)S->heads.mask), id;
    int64_t off;
    const char *q, *hd = d + a;
    while (S->heads.slot[s]) {
        if (S->heads.hash[s] == h) {
            Py_ssize_t c = S->heads.slot[s] - 1;
            if (S->h_len.p[c] == n && bytes_eq(S->hb.p + S->h_off.p[c], hd, n)) return c;
        }
        s = (s + 1) & S->heads.mask;
    }
    id = S->h_off.n;
    /* the measurement ends at the first comma whose previous byte is not a backslash (the head's
     * first byte is no comma: such lines take the reference parser) */
    for (q = hd; (q = memchr(q + 1, ',', (size_t)(hd + n - q - 1))) && q[-1] == '\\';)
        ;
    if (blob_add(&S->hb, hd, n, &off) || i64_push(&S->h_off, off) || i64_push(&S->h_len, n) ||
        i64_push(&S->h_meas, q ? q - hd : n) || i64_push(&S->h_rec0, -1) || i64_push(&S->h_rec1, -1) ||
        i64_push(&S->h_next, -1))
        return -1;
    S->heads.slot[s] = id + 1;
    S->heads.hash[s] = h;
    if (++S->heads.used * 2 > S->heads.mask && table_grow(&S->heads)) return -1;
    return id;
}

/* Are group g's first nf keys those of the line being read (tk0/tkn)? */
static int group_has_prefix(const Scanner *S, Py_ssize_t g, const char *d, Py_ssize_t nf) {
    const int64_t *ko = S->k_off.p + S->g_k0.p[g], *kl = S->k_len.p + S->g_k0.p[g];
    Py_ssize_t k;
    for (k = 0; k < nf; k++)
        if (kl[k] != S->tkn.p[k] || !bytes_eq(S->gb.p + ko[k], d + S->tk0.p[k], kl[k])) return 0;
    return 1;
}

/* Has group g the nf keys of the line being read, and no more? */
static int group_has_keys(const Scanner *S, Py_ssize_t g, const char *d, Py_ssize_t nf) {
    return S->g_nf.p[g] == nf && group_has_prefix(S, g, d, nf);
}

/* The id of the group (measurement d[a:a+ml], the line's nf keys), added when new (-1 on error). */
static Py_ssize_t group_id(Scanner *S, const char *d, Py_ssize_t a, Py_ssize_t ml, Py_ssize_t nf) {
    uint64_t h = hash_bytes(d + a, ml, 0x13198A2E03707344ULL ^ (uint64_t)nf);
    Py_ssize_t s, k, id;
    int64_t off;
    for (k = 0; k < nf; k++) h = hash_bytes(d + S->tk0.p[k], S->tkn.p[k], h);
    for (s = (Py_ssize_t)(h & (uint64_t)S->groups.mask); S->groups.slot[s]; s = (s + 1) & S->groups.mask) {
        Py_ssize_t c = S->groups.slot[s] - 1;
        if (S->groups.hash[s] == h && S->g_mlen.p[c] == ml && bytes_eq(S->gb.p + S->g_moff.p[c], d + a, ml) &&
            group_has_keys(S, c, d, nf))
            return c;
    }
    id = S->g_moff.n;
    if (blob_add(&S->gb, d + a, ml, &off) || i64_push(&S->g_moff, off) || i64_push(&S->g_mlen, ml) ||
        i64_push(&S->g_k0, S->k_off.n) || i64_push(&S->g_nf, nf) || i64_push(&S->g_stamp, -1) ||
        i64_push(&S->g_local, -1) || i64_push(&S->g_plan, -1) || i64_push(&S->g_nplan, 0))
        return -1;
    for (k = 0; k < nf; k++)
        if (blob_add(&S->gb, d + S->tk0.p[k], S->tkn.p[k], &off) || i64_push(&S->k_off, off) ||
            i64_push(&S->k_len, S->tkn.p[k]))
            return -1;
    S->groups.slot[s] = id + 1;
    S->groups.hash[s] = h;
    if (++S->groups.used * 2 > S->groups.mask && table_grow(&S->groups)) return -1;
    return id;
}

/* The lines' columns in group order (a counting sort of the line order) as bytearrays. */
static PyObject *grouped(const int64_t *v, const int64_t *pos, Py_ssize_t n) {
    PyObject *o = PyByteArray_FromStringAndSize(NULL, n * 8);
    Py_ssize_t i;
    if (!o) return NULL;
    for (i = 0; i < n; i++) ((int64_t *)PyByteArray_AS_STRING(o))[pos[i]] = v[i];
    return o;
}

static PyObject *bytes_list(const Blob *b, const int64_t *off, const int64_t *len, Py_ssize_t from, Py_ssize_t to) {
    PyObject *l = PyList_New(to - from), *x;
    Py_ssize_t i;
    if (!l) return NULL;
    for (i = from; i < to; i++) {
        if (!(x = PyBytes_FromStringAndSize(b->p + off[i], len[i]))) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i - from, x);
    }
    return l;
}

static PyObject *scanner_scan(PyObject *self, PyObject *arg) {
    Scanner *S = (Scanner *)self;
    Py_buffer view;
    const char *d;
    Py_ssize_t n, pos, lcap, real = 0, nl = 0, i, h_start = S->h_off.n, g_start = S->g_moff.n;
    int64_t *L = NULL; /* per good line, in line order: head, local group, first field, time, start, end */
    Vec F_val, F_type, B_idx, B_val, Q_idx, Q_v0, Q_vn, S_start, S_end;
    Vec *all[] = {&F_val, &F_type, &B_idx, &B_val, &Q_idx, &Q_v0, &Q_vn, &S_start, &S_end};
    const int nvec = (int)(sizeof(all) / sizeof(all[0]));
    PyObject *result = NULL, *cols[6] = {NULL}, *newh = NULL, *newg = NULL, *gid = NULL, *bounds = NULL, *picked = NULL;
    int ok = 0;

    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    d = view.buf;
    n = view.len;
    S->calls++;
    S->loc.n = 0;
    lcap = n / 128 + 64; /* lines (grown as needed) */
    for (i = 0; i < nvec; i++) all[i]->obj = NULL;
    if (vec_init(&F_val, n / 16, 8) || vec_init(&F_type, n / 16, 1) || vec_init(&B_idx, 16, 8) ||
        vec_init(&B_val, 16, 8) || vec_init(&Q_idx, 16, 8) || vec_init(&Q_v0, 16, 8) || vec_init(&Q_vn, 16, 8) ||
        vec_init(&S_start, 64, 8) || vec_init(&S_end, 64, 8))
        goto done;
    L = PyMem_Malloc((size_t)lcap * 6 * sizeof(int64_t));
    if (!L) {
        PyErr_NoMemory();
        goto done;
    }

    for (pos = 0; pos < n;) {
        const char *nlp = memchr(d + pos, '\n', (size_t)(n - pos));
        Py_ssize_t e = nlp ? nlp - d : n, i0 = pos, j, f0 = F_val.n, nf, hid, cand, alt, cnf = 0, g, k;
        Py_ssize_t b0 = B_idx.n, q0 = Q_idx.n;
        const int64_t *ckoff = NULL, *cklen = NULL;
        int64_t ts = 0;
        int good = 0, match;
        pos = e + 1;
        if (e == i0 || d[i0] == '#') continue;
        if (d[i0] == ' ' || d[i0] == '\t' || d[i0] == '\0') { /* leading whitespace: skipped, then */
            for (j = i0; j < e && (d[j] == ' ' || d[j] == '\t' || d[j] == '\0'); j++)
                ;
            if (j == e || d[j] == '#') continue; /* blank or a comment */
            real++;
            goto slow;
        }
        real++;
        if (F_val.n + (e - i0) / 2 + 1 > F_val.cap) { /* a field takes at least 2 bytes */
            Py_ssize_t cap = 2 * F_val.cap + (e - i0);
            if (vec_grow(&F_val, cap) || vec_grow(&F_type, cap)) goto done;
        }
        if (i64_reserve(&S->tk0, (e - i0) / 2 + 1) || i64_reserve(&S->tkn, (e - i0) / 2 + 1)) goto done;
        /* head: up to the first space whose previous byte is not a backslash (InfluxDB's rule,
         * even for an escaped backslash); quotes are literal there */
        if (d[i0] == ',') goto slow;
        {
            const char *q;
            for (j = i0 + 1; (q = memchr(d + j, ' ', (size_t)(e - j))) && q[-1] == '\\'; j = q - d + 1)
                ;
            j = q ? q - d : e;
        }
        if (j >= e - 1 || d[j + 1] == ' ' || d[j + 1] == '\t' || d[j + 1] == '\0') goto slow;
        /* a writer sends its series in one order: the head that followed this line's predecessor
         * last time is tried first, byte for byte, before the table (while that pays: trust) */
        {
            Py_ssize_t next = S->prev >= 0 ? S->h_next.p[S->prev] : -1, hl = j - i0;
            if (S->trust >= 0 && next >= 0 && S->h_len.p[next] == hl &&
                bytes_eq(S->hb.p + S->h_off.p[next], d + i0, hl)) {
                hid = next;
            } else {
                if ((hid = head_id(S, d, i0, hl)) < 0) goto done;
                if (S->prev >= 0) S->h_next.p[S->prev] = hid;
            }
            S->trust = hid == next ? (S->trust < 32 ? S->trust + 1 : 32) : (S->trust > -32 ? S->trust - 4 : -32);
            S->prev = hid;
        }
        cand = S->h_rec0.p[hid]; /* the keys of the series' last group, compared as they come */
        if ((match = cand >= 0)) {
            cnf = S->g_nf.p[cand];
            ckoff = S->k_off.p + S->g_k0.p[cand];
            cklen = S->k_len.p + S->g_k0.p[cand];
        }
        /* fields */
        j++;
        for (k = 0;; k++) {
            Py_ssize_t k0 = j, v0, kl;
            double v = NAN;
            int64_t iv = 0;
            int type;
            if (match && k < cnf && k0 + (kl = cklen[k]) < e && d[k0 + kl] == '=' &&
                bytes_eq(d + k0, S->gb.p + ckoff[k], kl)) {
                j = k0 + kl; /* the group's key: checked when the group was made */
            } else if (match && (alt = S->h_rec1.p[hid]) >= 0 && alt != cand && S->g_nf.p[alt] > k &&
                       k0 + (kl = S->k_len.p[S->g_k0.p[alt] + k]) < e && d[k0 + kl] == '=' &&
                       bytes_eq(d + k0, S->gb.p + S->k_off.p[S->g_k0.p[alt] + k], kl) &&
                       group_has_prefix(S, alt, d, k)) {
                /* the series' other field set (fast and slow tier) from here on */
                cand = alt;
                cnf = S->g_nf.p[cand];
                ckoff = S->k_off.p + S->g_k0.p[cand];
                cklen = S->k_len.p + S->g_k0.p[cand];
                j = k0 + kl;
            } else {
                match = 0;
                j = key_stop(d, j, e, n);
                if (j >= e || d[j] != '=' || j == k0) goto slow;
            }
            S->tk0.p[k] = k0;
            S->tkn.p[k] = j - k0;
            v0 = ++j;
            if (j < e && d[j] == '"') {
                for (j++; j < e; j++) {
                    if (d[j] == '\\') j++;
                    else if (d[j] == '"') break;
                }
                if (j >= e - 1 || (d[j + 1] != ',' && d[j + 1] != ' ')) goto slow;
                j++;
                type = T_STR;
                if (Q_idx.n == Q_idx.cap) {
                    Py_ssize_t cap = 2 * Q_idx.cap;
                    if (vec_grow(&Q_idx, cap) || vec_grow(&Q_v0, cap) || vec_grow(&Q_vn, cap)) goto done;
                }
                AT(Q_idx, int64_t)[Q_idx.n++] = F_val.n;
                AT(Q_v0, int64_t)[Q_v0.n++] = v0;
                AT(Q_vn, int64_t)[Q_vn.n++] = j - v0;
            } else {
                const char *end;
                if ((type = fast_number(d + j, d + e, &v, &iv, &end))) {
                    j = end - d;
                } else {
                    j = key_stop(d, j, e, n);
                    if (j < e && d[j] != ',' && d[j] != ' ') goto slow; /* = \\ or " in a value */
                    if (j == v0) goto slow;
                    type = parse_value(d + v0, j - v0, &v, &iv);
                    if (!type) goto slow;
                }
                if (type == T_INT && (iv > (1LL << 53) || iv < -(1LL << 53))) {
                    if (B_idx.n == B_idx.cap) {
                        Py_ssize_t cap = 2 * B_idx.cap;
                        if (vec_grow(&B_idx, cap) || vec_grow(&B_val, cap)) goto done;
                    }
                    AT(B_idx, int64_t)[B_idx.n++] = F_val.n;
                    AT(B_val, int64_t)[B_val.n++] = iv;
                }
            }
            AT(F_val, double)[F_val.n++] = v;
            AT(F_type, uint8_t)[F_type.n++] = (uint8_t)type;
            if (j >= e) goto slow; /* no timestamp: the reference parser counts it */
            if (d[j] == ' ') break;
            if (d[j] != ',') goto slow;
            j++;
        }
        j++;
        if (parse_ts(d + j, e - j, &ts, d + n)) goto slow;
        nf = F_val.n - f0;

        /* group: the series' last one, the one before (fast and slow tier), or the table's */
        if (match && nf == cnf) g = cand;
        else if (S->h_rec1.p[hid] >= 0 && group_has_keys(S, S->h_rec1.p[hid], d, nf)) g = S->h_rec1.p[hid];
        else if ((g = group_id(S, d, i0, S->h_meas.p[hid], nf)) < 0) goto done;
        if (S->h_rec0.p[hid] != g) {
            S->h_rec1.p[hid] = S->h_rec0.p[hid];
            S->h_rec0.p[hid] = g;
        }
        if (S->g_stamp.p[g] != S->calls) {
            S->g_stamp.p[g] = S->calls;
            S->g_local.p[g] = S->loc.n;
            if (i64_push(&S->loc, g)) goto done;
        }
        if (nl == lcap) {
            int64_t *more = PyMem_Realloc(L, (size_t)lcap * 2 * 6 * sizeof(int64_t));
            if (!more) {
                PyErr_NoMemory();
                goto done;
            }
            L = more;
            lcap *= 2;
        }
        L[6 * nl + 0] = hid;
        L[6 * nl + 1] = S->g_local.p[g];
        L[6 * nl + 2] = f0;
        L[6 * nl + 3] = ts;
        L[6 * nl + 4] = i0;
        L[6 * nl + 5] = e;
        nl++;
        good = 1;
    slow:
        if (!good) {
            /* drop this line's fields and hand the whole line to the reference parser */
            F_val.n = F_type.n = f0;
            B_idx.n = B_val.n = b0;
            Q_idx.n = Q_v0.n = Q_vn.n = q0;
            if (S_start.n == S_start.cap) {
                Py_ssize_t cap = 2 * S_start.cap;
                if (vec_grow(&S_start, cap) || vec_grow(&S_end, cap)) goto done;
            }
            AT(S_start, int64_t)[S_start.n++] = i0;
            AT(S_end, int64_t)[S_end.n++] = e;
        }
    }
    for (i = 0; i < nvec; i++)
        if (vec_finish(all[i])) goto done;
    { /* group order: where each line goes (a counting sort), then every column put there */
        Py_ssize_t ng = S->loc.n, c;
        int64_t *at, *v;
        if (!(bounds = PyByteArray_FromStringAndSize(NULL, (ng + 1) * 8)) ||
            !(gid = PyByteArray_FromStringAndSize((const char *)S->loc.p, ng * 8)))
            goto done;
        at = (int64_t *)PyByteArray_AS_STRING(bounds);
        memset(at, 0, (size_t)(ng + 1) * 8);
        for (i = 0; i < nl; i++) at[L[6 * i + 1] + 1]++;
        for (i = 0; i < ng; i++) at[i + 1] += at[i];
        v = PyMem_Malloc((size_t)(nl ? nl : 1) * 2 * sizeof(int64_t));
        if (!v) {
            PyErr_NoMemory();
            goto done;
        }
        { /* v[0:nl]: destination of each line; v[nl:2nl]: one column gathered in line order */
            int64_t *next = v + nl, *dst = v;
            memcpy(next, at, (size_t)ng * 8); /* next free slot per group (ng <= nl) */
            for (i = 0; i < nl; i++) dst[i] = next[L[6 * i + 1]]++;
            for (c = 0; c < 6; c++) {
                int64_t *col = v + nl;
                if (c == 1) continue;
                for (i = 0; i < nl; i++) col[i] = L[6 * i + c];
                if (!(cols[c] = grouped(col, dst, nl))) break;
            }
        }
        PyMem_Free(v);
        if (PyErr_Occurred()) goto done;
    }
    /* the wanted columns of the groups that have a plan, gathered: (values, types), column-major */
    if (!(picked = PyList_New(S->loc.n))) goto done;
    for (i = 0; i < S->loc.n; i++) {
        Py_ssize_t g = S->loc.p[i], a = ((int64_t *)PyByteArray_AS_STRING(bounds))[i], r, c;
        Py_ssize_t rows = ((int64_t *)PyByteArray_AS_STRING(bounds))[i + 1] - a, np_ = S->g_nplan.p[g];
        const int64_t *pos, *f0 = (const int64_t *)PyByteArray_AS_STRING(cols[2]) + a;
        const double *fv = (const double *)PyByteArray_AS_STRING(F_val.obj);
        const uint8_t *ft = (const uint8_t *)PyByteArray_AS_STRING(F_type.obj);
        PyObject *vals, *kinds, *pair;
        double *ov;
        uint8_t *ok_;
        if (S->g_plan.p[g] < 0) {
            Py_INCREF(Py_None);
            PyList_SET_ITEM(picked, i, Py_None);
            continue;
        }
        pos = S->plan.p + S->g_plan.p[g];
        if (!(vals = PyByteArray_FromStringAndSize(NULL, np_ * rows * 8))) goto done;
        if (!(kinds = PyByteArray_FromStringAndSize(NULL, np_ * rows))) {
            Py_DECREF(vals);
            goto done;
        }
        ov = (double *)PyByteArray_AS_STRING(vals);
        ok_ = (uint8_t *)PyByteArray_AS_STRING(kinds);
        for (r = 0; r < rows; r++)
            for (c = 0; c < np_; c++) {
                ov[c * rows + r] = fv[f0[r] + pos[c]];
                ok_[c * rows + r] = ft[f0[r] + pos[c]];
            }
        if (!(pair = PyTuple_Pack(2, vals, kinds))) {
            Py_DECREF(vals);
            Py_DECREF(kinds);
            goto done;
        }
        Py_DECREF(vals);
        Py_DECREF(kinds);
        PyList_SET_ITEM(picked, i, pair);
    }
    if (!(newh = bytes_list(&S->hb, S->h_off.p, S->h_len.p, h_start, S->h_off.n))) goto done;
    if (!(newg = PyList_New(S->g_moff.n - g_start))) goto done;
    for (i = g_start; i < S->g_moff.n; i++) {
        PyObject *keys = bytes_list(&S->gb, S->k_off.p + S->g_k0.p[i], S->k_len.p + S->g_k0.p[i], 0, S->g_nf.p[i]);
        if (!keys) goto done;
        PyList_SET_ITEM(newg, i - g_start, keys);
    }
    result = Py_BuildValue("(nNNNNNNNNNNNNNNNNNNN)", real, newh, newg, gid, bounds, cols[0], cols[2], cols[3], cols[4],
                           cols[5], F_val.obj, F_type.obj, B_idx.obj, B_val.obj, Q_idx.obj, Q_v0.obj, Q_vn.obj,
                           S_start.obj, S_end.obj, picked);
    ok = 1; /* the objects now belong to the tuple (or, if it failed, are gone with it) */
done:
    if (!ok) {
        for (i = 0; i < nvec; i++) Py_XDECREF(all[i]->obj);
        for (i = 0; i < 6; i++) Py_XDECREF(cols[i]);
        Py_XDECREF(newh);
        Py_XDECREF(newg);
        Py_XDECREF(gid);
        Py_XDECREF(bounds);
        Py_XDECREF(picked);
    }
    PyMem_Free(L);
    PyBuffer_Release(&view);
    return result;
}

/* columns(group id, positions): the field positions (int64s) to gather for that group's rows,
 * from the next scan on. */
static PyObject *scanner_columns(PyObject *self, PyObject *args) {
    Scanner *S = (Scanner *)self;
    Py_ssize_t g, i, k;
    Py_buffer pos;
    const int64_t *p;
    if (!PyArg_ParseTuple(args, "ny*", &g, &pos)) return NULL;
    p = pos.buf;
    k = pos.len / 8;
    if (g < 0 || g >= S->g_moff.n || pos.len % 8) {
        PyBuffer_Release(&pos);
        PyErr_SetString(PyExc_ValueError, "no such group, or positions not int64");
        return NULL;
    }
    for (i = 0; i < k; i++)
        if (p[i] < 0 || p[i] >= S->g_nf.p[g]) {
            PyBuffer_Release(&pos);
            PyErr_SetString(PyExc_ValueError, "a position beyond the group's fields");
            return NULL;
        }
    S->g_plan.p[g] = S->plan.n;
    S->g_nplan.p[g] = k;
    for (i = 0; i < k; i++)
        if (i64_push(&S->plan, p[i])) {
            S->g_plan.p[g] = -1;
            PyBuffer_Release(&pos);
            return NULL;
        }
    PyBuffer_Release(&pos);
    Py_RETURN_NONE;
}

static PyMethodDef scanner_methods[] = {
    {"columns", scanner_columns, METH_VARARGS,
     "columns(group id, int64 positions): gather these fields of the group's rows in later scans"},
    {"scan", scanner_scan, METH_O,
     "scan(data) -> (lines, new heads, new groups' keys, local group -> group id, group bounds, head, "
     "first field, time, line start, line end, field values, field types, big-int field, big-int value, "
     "string field, string start, string length, other line start, other line end, per local group its "
     "planned columns gathered (values, types) or None) (see analyzer/parse.py)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot scanner_slots[] = {
    {Py_tp_new, scanner_new},
    {Py_tp_dealloc, scanner_dealloc},
    {Py_tp_methods, scanner_methods},
    {Py_tp_doc, "Scanner(): a line-protocol tokenizer that keeps its series heads and field-key groups "
                "from chunk to chunk."},
    {0, NULL},
};

static PyType_Spec scanner_spec = {"gpufleet.analyzer._lpscan.Scanner", sizeof(Scanner), 0, Py_TPFLAGS_DEFAULT,
                                   scanner_slots};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lpscan", "Line protocol tokenizer.", -1, NULL};

PyMODINIT_FUNC PyInit__lpscan(void) {
    PyObject *m = PyModule_Create(&module), *t;
    if (!m) return NULL;
    if (!(t = PyType_FromSpec(&scanner_spec)) || PyModule_AddObject(m, "Scanner", t)) {
        Py_XDECREF(t);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
