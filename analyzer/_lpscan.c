/* Line protocol tokenizer for the analyzer: one pass over a chunk of lines, in C.
 *
 * scan(data) walks every line once and keeps what analyzer/parse.py needs to build columns:
 *
 *   - for every line in the plain form InfluxDB reads without surprises (see below): the id of
 *     its head (measurement + tags, deduplicated within the chunk, compared byte for byte), the
 *     id of its group (measurement + field keys in order, likewise), the index of its first
 *     field, its timestamp and where it lies in the chunk;
 *   - for every field: the value as a double (NaN for strings), its exact int64 for integers, a
 *     type code, and where its key and value lie in the chunk;
 *   - the start and end of every other line: parse.py hands those to the reference parser
 *     (gpufleet/lineprotocol.py, InfluxDB 1.x's own rules), which decides and counts.
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

static uint64_t hash_bytes(const char *s, Py_ssize_t n, uint64_t h) {
    uint64_t w;
    while (n >= 8) {
        memcpy(&w, s, 8);
        h = mix(h, w);
        s += 8;
        n -= 8;
    }
    w = 0;
    memcpy(&w, s, (size_t)n);
    return mix(h, w ^ ((uint64_t)n << 56));
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

/* Timestamp: -?digits within InfluxDB's range [-2^63+2, 2^63-2]. */
static int parse_ts(const char *s, Py_ssize_t n, int64_t *out) {
    if (parse_int(s, n, out) || *out < INT64_MIN + 2 || *out > INT64_MAX - 1) return -1;
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

/* Do the fields starting at a and b (na and nb of them) have the same keys in the same order? */
static int same_keys(const char *d, const Vec *k0, const Vec *kn, Py_ssize_t a, Py_ssize_t b, Py_ssize_t na,
                     Py_ssize_t nb) {
    const int64_t *ks = (const int64_t *)k0->p, *kl = (const int64_t *)kn->p;
    Py_ssize_t k;
    if (na != nb) return 0;
    for (k = 0; k < na; k++)
        if (kl[a + k] != kl[b + k] || memcmp(d + ks[a + k], d + ks[b + k], (size_t)kl[b + k])) return 0;
    return 1;
}

static Py_ssize_t count_byte(const char *s, Py_ssize_t n, char c) {
    Py_ssize_t k = 0;
    const char *e = s + n, *q;
    while (s < e && (q = memchr(s, c, (size_t)(e - s)))) {
        k++;
        s = q + 1;
    }
    return k;
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    Py_buffer view;
    const char *d;
    Py_ssize_t n, pos, maxlines, real = 0;
    int64_t(*recent)[2] = NULL; /* per head: the last two groups its lines had */
    Vec L_head, L_group, L_f0, L_t, L_start, L_end, H_start, H_len, G_line, G_nf;
    Vec F_val, F_ival, F_type, F_k0, F_kn, F_v0, F_vn, S_start, S_end;
    Vec *all[] = {&L_head, &L_group, &L_f0, &L_t,  &L_start, &L_end, &H_start, &H_len, &G_line, &G_nf,
                  &F_val,  &F_ival,  &F_type, &F_k0, &F_kn,    &F_v0,  &F_vn,    &S_start, &S_end};
    int bigint = 0; /* an integer beyond +-2^53, where the double is not exact */
    const int nvec = (int)(sizeof(all) / sizeof(all[0]));
    Table heads = {0}, groups = {0};
    PyObject *result = NULL;
    int i, ok = 0;

    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    d = view.buf;
    n = view.len;
    maxlines = count_byte(d, n, '\n') + 1;
    for (i = 0; i < nvec; i++) all[i]->obj = NULL;
    if (vec_init(&L_head, maxlines, 8) || vec_init(&L_group, maxlines, 8) || vec_init(&L_f0, maxlines, 8) ||
        vec_init(&L_t, maxlines, 8) || vec_init(&L_start, maxlines, 8) || vec_init(&L_end, maxlines, 8) ||
        vec_init(&H_start, maxlines, 8) || vec_init(&H_len, maxlines, 8) || vec_init(&F_ival, n / 16, 8) ||
        vec_init(&G_line, maxlines, 8) || vec_init(&G_nf, maxlines, 8) || vec_init(&F_val, n / 16, 8) ||
        vec_init(&F_type, n / 16, 1) || vec_init(&F_k0, n / 16, 8) || vec_init(&F_kn, n / 16, 8) ||
        vec_init(&F_v0, n / 16, 8) || vec_init(&F_vn, n / 16, 8) || vec_init(&S_start, maxlines, 8) ||
        vec_init(&S_end, maxlines, 8))
        goto done;
    if (table_init(&heads, 1024) || table_init(&groups, 64)) goto done;
    recent = PyMem_Malloc((size_t)maxlines * sizeof(*recent));
    if (!recent) {
        PyErr_NoMemory();
        goto done;
    }

    for (pos = 0; pos < n;) {
        const char *nl = memchr(d + pos, '\n', (size_t)(n - pos));
        Py_ssize_t e = nl ? nl - d : n, i0 = pos, j, meas_end = -1, f0 = F_val.n, nf;
        int64_t ts = 0;
        uint64_t h, gh = 0;
        int good = 0;
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
            if (vec_grow(&F_val, cap) || vec_grow(&F_ival, cap) || vec_grow(&F_type, cap) || vec_grow(&F_k0, cap) ||
                vec_grow(&F_kn, cap) ||
                vec_grow(&F_v0, cap) || vec_grow(&F_vn, cap))
                goto done;
        }
        /* head: up to the first space whose previous byte is not a backslash (InfluxDB's rule,
         * even for an escaped backslash); quotes are literal there */
        if (d[i0] == ',') goto slow;
        { /* memchr for the spaces and commas (a head is long, and has few of them) */
            const char *q;
            for (j = i0 + 1; (q = memchr(d + j, ' ', (size_t)(e - j))) && q[-1] == '\\'; j = q - d + 1)
                ;
            j = q ? q - d : e;
            for (q = d + i0; (q = memchr(q + 1, ',', (size_t)(d + j - q - 1))) && q[-1] == '\\';)
                ;
            if (q) meas_end = q - d;
        }
        if (j >= e - 1 || d[j + 1] == ' ' || d[j + 1] == '\t' || d[j + 1] == '\0') goto slow;
        if (meas_end < 0) meas_end = j;
        {
            Py_ssize_t head_end = j;
            /* fields */
            j++;
            for (;;) {
                Py_ssize_t k0 = j, v0;
                double v = NAN;
                int64_t iv = 0;
                int type;
                j = key_stop(d, j, e, n);
                if (j >= e || d[j] != '=' || j == k0) goto slow;
                v0 = ++j;
                if (j < e && d[j] == '"') {
                    for (j++; j < e; j++) {
                        if (d[j] == '\\') j++;
                        else if (d[j] == '"') break;
                    }
                    if (j >= e - 1 || (d[j + 1] != ',' && d[j + 1] != ' ')) goto slow;
                    j++;
                    type = T_STR;
                } else {
                    j = key_stop(d, j, e, n);
                    if (j < e && d[j] != ',' && d[j] != ' ') goto slow; /* = \\ or " in a value */
                    if (j == v0) goto slow;
                    type = parse_value(d + v0, j - v0, &v, &iv);
                    if (!type) goto slow;
                    if (type == T_INT && (iv > (1LL << 53) || iv < -(1LL << 53))) bigint = 1;
                }
                AT(F_val, double)[F_val.n++] = v;
                AT(F_ival, int64_t)[F_ival.n++] = iv;
                AT(F_type, uint8_t)[F_type.n++] = (uint8_t)type;
                AT(F_k0, int64_t)[F_k0.n++] = k0;
                AT(F_kn, int64_t)[F_kn.n++] = v0 - 1 - k0;
                AT(F_v0, int64_t)[F_v0.n++] = v0;
                AT(F_vn, int64_t)[F_vn.n++] = j - v0;
                if (j >= e) goto slow; /* no timestamp: the reference parser counts it */
                if (d[j] == ' ') break;
                if (d[j] != ',') goto slow;
                j++;
            }
            j++;
            if (parse_ts(d + j, e - j, &ts)) goto slow;
            nf = F_val.n - f0;

            /* head id */
            h = hash_bytes(d + i0, head_end - i0, 0x243F6A8885A308D3ULL);
            {
                Py_ssize_t s = (Py_ssize_t)(h & (uint64_t)heads.mask), id = -1;
                Py_ssize_t hl = head_end - i0;
                while (heads.slot[s]) {
                    if (heads.hash[s] == h) {
                        Py_ssize_t c = heads.slot[s] - 1;
                        if (AT(H_len, int64_t)[c] == hl && !memcmp(d + AT(H_start, int64_t)[c], d + i0, (size_t)hl)) {
                            id = c;
                            break;
                        }
                    }
                    s = (s + 1) & heads.mask;
                }
                if (id < 0) {
                    id = H_start.n;
                    AT(H_start, int64_t)[H_start.n++] = i0;
                    AT(H_len, int64_t)[H_len.n++] = hl;
                    heads.slot[s] = id + 1;
                    heads.hash[s] = h;
                    if (++heads.used * 2 > heads.mask && table_grow(&heads)) goto done;
                }
                AT(L_head, int64_t)[L_head.n] = id;
            }
            /* group id: measurement + the field keys in order. A series keeps to one or two
             * field sets (fast and slow tier), so its last two groups are tried first. */
            {
                Py_ssize_t hid = AT(L_head, int64_t)[L_head.n], id = -1, r;
                int fresh = hid == H_start.n - 1 && AT(H_start, int64_t)[hid] == i0;
                for (r = 0; r < 2 && !fresh && id < 0; r++) {
                    Py_ssize_t c = recent[hid][r];
                    if (c >= 0 && same_keys(d, &F_k0, &F_kn, AT(L_f0, int64_t)[AT(G_line, int64_t)[c]], f0,
                                            AT(G_nf, int64_t)[c], nf))
                        id = c;
                }
                if (fresh) recent[hid][0] = recent[hid][1] = -1;
                if (id < 0) {
                    Py_ssize_t s, ml = meas_end - i0;
                    gh = hash_bytes(d + i0, ml, 0x13198A2E03707344ULL ^ (uint64_t)nf);
                    for (j = f0; j < f0 + nf; j++) gh = hash_bytes(d + AT(F_k0, int64_t)[j], AT(F_kn, int64_t)[j], gh);
                    for (s = (Py_ssize_t)(gh & (uint64_t)groups.mask); groups.slot[s]; s = (s + 1) & groups.mask) {
                        Py_ssize_t c = groups.slot[s] - 1, line = AT(G_line, int64_t)[c];
                        Py_ssize_t rs = AT(H_start, int64_t)[AT(L_head, int64_t)[line]];
                        if (groups.hash[s] == gh && rs + ml < n && !memcmp(d + rs, d + i0, (size_t)ml) &&
                            (d[rs + ml] == ',' || d[rs + ml] == ' ') &&
                            same_keys(d, &F_k0, &F_kn, AT(L_f0, int64_t)[line], f0, AT(G_nf, int64_t)[c], nf)) {
                            id = c;
                            break;
                        }
                    }
                    if (id < 0) {
                        id = G_line.n;
                        AT(G_line, int64_t)[G_line.n++] = L_head.n;
                        AT(G_nf, int64_t)[G_nf.n++] = nf;
                        groups.slot[s] = id + 1;
                        groups.hash[s] = gh;
                        if (++groups.used * 2 > groups.mask && table_grow(&groups)) goto done;
                    }
                }
                if (recent[hid][0] != id) {
                    recent[hid][1] = recent[hid][0];
                    recent[hid][0] = id;
                }
                AT(L_group, int64_t)[L_group.n++] = id;
            }
            AT(L_f0, int64_t)[L_f0.n++] = f0;
            AT(L_t, int64_t)[L_t.n++] = ts;
            AT(L_start, int64_t)[L_start.n++] = i0;
            AT(L_end, int64_t)[L_end.n++] = e;
            L_head.n++;
            good = 1;
        }
    slow:
        if (!good) {
            /* drop this line's fields and hand the whole line to the reference parser */
            F_val.n = F_ival.n = F_type.n = F_k0.n = F_kn.n = F_v0.n = F_vn.n = f0;
            AT(S_start, int64_t)[S_start.n++] = i0;
            AT(S_end, int64_t)[S_end.n++] = e;
        }
    }
    for (i = 0; i < nvec; i++)
        if (vec_finish(all[i])) goto done;
    result = Py_BuildValue("(niNNNNNNNNNNNNNNNNNNN)", real, bigint, L_head.obj, L_group.obj, L_f0.obj, L_t.obj,
                           L_start.obj, L_end.obj, H_start.obj, H_len.obj, G_line.obj, G_nf.obj, F_val.obj,
                           F_ival.obj, F_type.obj, F_k0.obj, F_kn.obj, F_v0.obj, F_vn.obj, S_start.obj, S_end.obj);
    ok = 1; /* the bytearrays now belong to the tuple (or, if it failed, are gone with it) */
done:
    if (!ok)
        for (i = 0; i < nvec; i++) Py_XDECREF(all[i]->obj);
    table_free(&heads);
    table_free(&groups);
    PyMem_Free(recent);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O, "scan(data) -> tuple of columns (see analyzer/parse.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lpscan", "Line protocol tokenizer.", -1, methods};

PyMODINIT_FUNC PyInit__lpscan(void) { return PyModule_Create(&module); }
