/* The safetensors container; see safetensors.h. */
#include "model/safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant.h"
#include "os/io.h"
#include "util/util.h"

static const struct {
    const char *name;
    unsigned size;
} dtypes[] = {[NL_ST_F32] = {"F32", 4}, [NL_ST_F16] = {"F16", 2}, [NL_ST_BF16] = {"BF16", 2}};

/* dtypes of the format nightlora does not read, named in the refusal */
static const char *const other_dtypes[] = {"F64",     "I64",     "U64",     "I32",  "U32",     "I16",
                                           "U16",     "I8",      "U8",      "BOOL", "F8_E5M2", "F8_E4M3",
                                           "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",   NULL};

const char *nl_st_dtype_name(nl_st_dtype t) { return (unsigned)t <= NL_ST_BF16 ? dtypes[t].name : "?"; }

void nl_st_close(nl_safetensors *st) {
    if (!st) return;
    free(st->label);
    free(st->buf);
    nl_json_free(st->header);
    free(st->t);
    free(st);
}

static int by_begin(const void *a, const void *b) {
    const nl_st_tensor *x = *(const nl_st_tensor *const *)a, *y = *(const nl_st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* A non-negative integer of the header (shape entries, offsets); -1 and the error otherwise. */
static int header_uint(const nl_safetensors *st, const nl_json *v, const char *name, const char *what, uint64_t *out) {
    int64_t x;
    if (!nl_json_is_number(v) || nl_json_int64(v, &x) != 0 || x < 0)
        return nl_err("%s: offset %zu: tensor '%s': %s is not a non-negative integer", st->label, 8 + v->offset, name,
                      what);
    *out = (uint64_t)x;
    return 0;
}

/* Validate one header member (a tensor) into *t. data_len: bytes after the header. */
static int parse_tensor(nl_safetensors *st, const nl_json_member *mb, uint64_t data_start, uint64_t data_len,
                        nl_st_tensor *t) {
    const char *name = mb->key;
    const nl_json *v = &mb->value;
    size_t at = 8 + v->offset;
    if (mb->key_len == 0 || strlen(name) != mb->key_len)
        return nl_err("%s: offset %zu: a tensor name is empty or holds a NUL byte", st->label, 8 + mb->key_offset);
    if (!nl_json_is_object(v))
        return nl_err(
            "%s: offset %zu: tensor '%s' is described by a %s, expected an object {dtype, shape, data_offsets}",
            st->label, at, name, nl_json_type_name(v->type));
    for (size_t i = 0; i < v->u.obj.n; i++) {
        const char *k = v->u.obj.members[i].key;
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return nl_err("%s: offset %zu: tensor '%s' has an unknown field '%s' (expected dtype, shape, data_offsets)",
                          st->label, 8 + v->u.obj.members[i].key_offset, name, k);
    }
    const nl_json *dt = nl_json_get(v, "dtype"), *sh = nl_json_get(v, "shape"), *off = nl_json_get(v, "data_offsets");
    if (!dt || !sh || !off)
        return nl_err("%s: offset %zu: tensor '%s' has no %s", st->label, at, name,
                      !dt   ? "dtype"
                      : !sh ? "shape"
                            : "data_offsets");
    if (!nl_json_is_string(dt))
        return nl_err("%s: offset %zu: tensor '%s': dtype is a %s, expected a string", st->label, 8 + dt->offset, name,
                      nl_json_type_name(dt->type));
    int found = -1;
    for (int k = 0; k <= NL_ST_BF16; k++)
        if (!strcmp(dt->u.str.s, dtypes[k].name)) found = k;
    if (found < 0) {
        for (const char *const *o = other_dtypes; *o; o++)
            if (!strcmp(dt->u.str.s, *o))
                return nl_err("%s: offset %zu: tensor '%s' has dtype %s: nightlora reads F32, F16 or BF16 tensors",
                              st->label, 8 + dt->offset, name, *o);
        return nl_err("%s: offset %zu: tensor '%s' has an unknown dtype '%s'", st->label, 8 + dt->offset, name,
                      dt->u.str.s);
    }
    t->name = name;
    t->dtype = (nl_st_dtype)found;
    if (!nl_json_is_array(sh) || sh->u.arr.n > NL_ST_MAX_DIMS)
        return nl_err("%s: offset %zu: tensor '%s': shape is not an array of at most %d integers", st->label,
                      8 + sh->offset, name, NL_ST_MAX_DIMS);
    t->n_dims = (int)sh->u.arr.n;
    uint64_t n_elems = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t x;
        if (header_uint(st, &sh->u.arr.items[d], name, "a shape entry", &x)) return -1;
        if (x > INT64_MAX || nl_mul_ok(n_elems, x, &n_elems) || n_elems > INT64_MAX)
            return nl_err("%s: offset %zu: tensor '%s': the shape's element count overflows", st->label, 8 + sh->offset,
                          name);
        t->shape[d] = (int64_t)x;
    }
    t->n_elems = (int64_t)n_elems;
    uint64_t b, e, need = 0;
    if (!nl_json_is_array(off) || off->u.arr.n != 2)
        return nl_err("%s: offset %zu: tensor '%s': data_offsets is not an array [begin, end]", st->label,
                      8 + off->offset, name);
    if (header_uint(st, &off->u.arr.items[0], name, "data_offsets[0]", &b) ||
        header_uint(st, &off->u.arr.items[1], name, "data_offsets[1]", &e))
        return -1;
    if (b > e || e > data_len)
        return nl_err("%s: offset %zu: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") do not lie in the %" PRIu64
                      " data bytes after the header (file offset %" PRIu64 ", size %zu)",
                      st->label, 8 + off->offset, name, b, e, data_len, data_start, st->len);
    if (nl_mul_ok(n_elems, dtypes[found].size, &need) || need != e - b) {
        char shape[160];
        size_t sl = 0;
        shape[0] = 0;
        for (int d = 0; d < t->n_dims && sl < sizeof shape; d++)
            sl += (size_t)snprintf(shape + sl, sizeof shape - sl, "%s%" PRId64, d ? ", " : "", t->shape[d]);
        return nl_err("%s: offset %zu: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64
                      " bytes, its %s shape [%s] needs %" PRIu64,
                      st->label, 8 + off->offset, name, b, e, e - b, dtypes[found].name, shape, need);
    }
    t->offset = data_start + b;
    t->nbytes = e - b;
    t->data = st->buf + t->offset;
    return 0;
}

/* Parse st->buf[0..len); fills the rest of st. */
static int parse(nl_safetensors *st) {
    if (st->len < 8)
        return nl_err("%s: offset 0: the file is %zu bytes, too short for the 8-byte header length", st->label,
                      st->len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (uint8_t)st->buf[i];
    if (n > st->len - 8)
        return nl_err("%s: offset 0: the header length %" PRIu64
                      " runs past the end of the file (size %zu): truncated or not a "
                      "safetensors file",
                      st->label, n, st->len);
    if (n > NL_ST_MAX_HEADER)
        return nl_err("%s: offset 0: the header length %" PRIu64 " is more than the %" PRIu64
                      " bytes a header may hold",
                      st->label, n, NL_ST_MAX_HEADER);
    nl_json_error je;
    st->header = nl_json_parse(st->buf + 8, (size_t)n, &je);
    if (!st->header)
        return nl_err("%s: offset %zu: the header is not valid JSON: %s", st->label, 8 + je.offset, je.msg);
    if (!nl_json_is_object(st->header))
        return nl_err("%s: offset 8: the header is a %s, expected an object", st->label,
                      nl_json_type_name(st->header->type));
    const uint64_t data_start = 8 + n, data_len = st->len - data_start;
    size_t members = st->header->u.obj.n;
    st->t = nl_calloc(members ? members : 1, sizeof *st->t);
    nl_st_tensor **order = nl_calloc(members ? members : 1, sizeof *order);
    if (!st->t || !order) {
        free(order);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < members && !rc; i++) {
        const nl_json_member *mb = &st->header->u.obj.members[i];
        if (!strcmp(mb->key, "__metadata__")) {
            const nl_json *md = &mb->value;
            if (!nl_json_is_object(md)) {
                rc = nl_err("%s: offset %zu: __metadata__ is a %s, expected an object of strings", st->label,
                            8 + md->offset, nl_json_type_name(md->type));
                break;
            }
            for (size_t k = 0; k < md->u.obj.n && !rc; k++)
                if (!nl_json_is_string(&md->u.obj.members[k].value))
                    rc = nl_err("%s: offset %zu: __metadata__ '%s' is a %s, expected a string", st->label,
                                8 + md->u.obj.members[k].value.offset, md->u.obj.members[k].key,
                                nl_json_type_name(md->u.obj.members[k].value.type));
            st->metadata = md;
            continue;
        }
        rc = parse_tensor(st, mb, data_start, data_len, &st->t[st->n]);
        if (!rc) {
            order[st->n] = &st->t[st->n];
            st->n++;
        }
    }
    /* the tensors tile the data section: sorted by begin, each starts where the one before ends */
    if (!rc) {
        qsort(order, (size_t)st->n, sizeof *order, by_begin);
        uint64_t pos = data_start;
        for (int i = 0; i < st->n && !rc; i++) {
            if (order[i]->offset < pos)
                rc = nl_err("%s: tensor '%s' data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' (file offsets)",
                            st->label, order[i]->name, order[i]->offset, order[i]->offset + order[i]->nbytes,
                            order[i - 1]->name);
            else if (order[i]->offset > pos)
                rc = nl_err("%s: offset %" PRIu64 ": bytes [%" PRIu64 ", %" PRIu64 ") belong to no tensor", st->label,
                            pos, pos, order[i]->offset);
            pos = order[i]->offset + order[i]->nbytes;
        }
        if (!rc && pos != st->len)
            rc = nl_err("%s: offset %" PRIu64 ": the %" PRIu64 " bytes after the last tensor belong to no tensor",
                        st->label, pos, (uint64_t)st->len - pos);
    }
    free(order);
    return rc;
}

static nl_safetensors *open_owned(char *buf, size_t len, const char *label) {
    nl_safetensors *st = nl_calloc(1, sizeof *st);
    if (!st) {
        free(buf);
        return NULL;
    }
    st->buf = buf;
    st->len = len;
    st->label = nl_strdup(label);
    if (!st->label || parse(st)) {
        nl_st_close(st);
        return NULL;
    }
    return st;
}

nl_safetensors *nl_st_open(const char *path) {
    size_t len;
    char *buf = nl_read_file(path, &len);
    return buf ? open_owned(buf, len, path) : NULL;
}

nl_safetensors *nl_st_open_buffer(const void *buf, size_t len, const char *label) {
    char *copy = nl_malloc(len ? len : 1);
    if (!copy) return NULL;
    if (len) memcpy(copy, buf, len);
    return open_owned(copy, len, label);
}

const nl_st_tensor *nl_st_find(const nl_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->t[i].name, name)) return &st->t[i];
    return NULL;
}

const char *nl_st_meta(const nl_safetensors *st, const char *key) {
    const nl_json *v = nl_json_get(st->metadata, key);
    return nl_json_is_string(v) ? v->u.str.s : NULL;
}

void nl_st_to_f32(const nl_st_tensor *t, float *out) {
    const uint8_t *p = t->data;
    for (int64_t i = 0; i < t->n_elems; i++) {
        if (t->dtype == NL_ST_F32) {
            memcpy(&out[i], p + 4 * i, 4);
        } else {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            out[i] = t->dtype == NL_ST_F16 ? nl_f16_to_f32(h) : nl_bf16_to_f32(h);
        }
    }
}

/* ---- writer ---------------------------------------------------------------------------------- */

/* A JSON string literal of s onto f. 0 or -1 (out of memory). */
int nl_st_json_str(FILE *f, const char *s) {
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = nl_json_escape(&buf, &n, &cap, s, strlen(s));
    if (!rc && fwrite(buf, 1, n, f) != n) rc = -1;
    free(buf);
    return rc;
}

typedef struct {
    const nl_st_out *t;
    int n;
    const char *header;
    size_t header_len;
} write_job;

static uint64_t out_bytes(const nl_st_out *t) {
    uint64_t ne = 1;
    for (int d = 0; d < t->n_dims; d++) ne *= (uint64_t)t->shape[d];
    return ne * dtypes[t->dtype].size;
}

static int write_body(void *user, nl_io_out *o) {
    const write_job *j = user;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)j->header_len >> (8 * i));
    if (nl_io_out_write(o, len8, 8) || nl_io_out_write(o, j->header, j->header_len)) return -1;
    for (int i = 0; i < j->n; i++)
        if (nl_io_out_write(o, j->t[i].data, (size_t)out_bytes(&j->t[i]))) return -1;
    return 0;
}

int nl_st_write_io(const nl_io *io, const char *path, const nl_st_out *t, int n, const char *const *meta) {
    for (int i = 0; i < n; i++)
        if (t[i].n_dims < 0 || t[i].n_dims > NL_ST_MAX_DIMS || (unsigned)t[i].dtype > NL_ST_BF16)
            return nl_err("%s: tensor '%s': %d dimensions or dtype %d cannot be written", path, t[i].name, t[i].n_dims,
                          (int)t[i].dtype);
    char *hdr = NULL;
    size_t hlen = 0;
    FILE *f = open_memstream(&hdr, &hlen);
    if (!f) return nl_err("%s: out of memory building the header", path);
    int rc = 0;
    fputc('{', f);
    if (meta && meta[0]) {
        fputs("\"__metadata__\":{", f);
        for (int k = 0; meta[k] && meta[k + 1]; k += 2) {
            if (k) fputc(',', f);
            rc |= nl_st_json_str(f, meta[k]);
            fputc(':', f);
            rc |= nl_st_json_str(f, meta[k + 1]);
        }
        fputc('}', f);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        if (i || (meta && meta[0])) fputc(',', f);
        rc |= nl_st_json_str(f, t[i].name);
        fprintf(f, ":{\"dtype\":\"%s\",\"shape\":[", dtypes[t[i].dtype].name);
        for (int d = 0; d < t[i].n_dims; d++) fprintf(f, "%s%" PRId64, d ? "," : "", t[i].shape[d]);
        uint64_t end = off + out_bytes(&t[i]);
        fprintf(f, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off, end);
        off = end;
    }
    fputc('}', f);
    /* pad with spaces so the data section starts 8-aligned */
    long pos = ftell(f);
    while (pos >= 0 && (8 + pos) % 8) {
        fputc(' ', f);
        pos++;
    }
    if (ferror(f) || pos < 0) rc = -1;
    if (fclose(f) || rc) {
        free(hdr);
        return nl_err("%s: out of memory building the header", path);
    }
    write_job j = {t, n, hdr, hlen};
    rc = nl_io_write_atomic(io, path, NULL, write_body, &j);
    free(hdr);
    return rc ? -1 : 0;
}

int nl_st_write(const char *path, const nl_st_out *t, int n, const char *const *meta) {
    return nl_st_write_io(NULL, path, t, n, meta);
}
