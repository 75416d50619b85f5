/* gguf.h — validated, read-only view of a memory-mapped GGUF v3 file.
 *
 * File layout (little-endian):
 *   u32 magic "GGUF" | u32 version (3) | u64 n_tensors | u64 n_kv
 *   n_kv   x { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
 *   padding to general.alignment (default 32)
 *   data section: tensor bytes at data_start + offset
 * string = u64 length + bytes (no terminator); array = u32 elem_type + u64 n + elems.
 *
 * gguf_open validates everything before any allocation sized by the file; every
 * rejection names the file, the field and the value. */
#ifndef DITTO_GGUF_H
#define DITTO_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"

enum gguf_vtype {
    GGUF_VT_UINT8 = 0,
    GGUF_VT_INT8 = 1,
    GGUF_VT_UINT16 = 2,
    GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4,
    GGUF_VT_INT32 = 5,
    GGUF_VT_FLOAT32 = 6,
    GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8,
    GGUF_VT_ARRAY = 9,
    GGUF_VT_UINT64 = 10,
    GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12,
    GGUF_VT_COUNT
};

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 256       /* tensor name length limit, bytes */
#define GGUF_MAX_ALIGNMENT 65536

/* A metadata value. Scalars are decoded; strings point into the mapping (not
 * NUL-terminated: use len); arrays keep their raw bytes, string arrays get an
 * offsets table so element i is O(1). */
typedef struct gguf_kv {
    char *key;          /* owned, NUL-terminated */
    uint32_t type;      /* enum gguf_vtype */
    union {
        uint64_t u;     /* any unsigned integer type, bool */
        int64_t i;      /* any signed integer type */
        double f;       /* FLOAT32 / FLOAT64 */
    } v;
    const char *str;    /* STRING */
    uint64_t str_len;
    uint32_t arr_type;  /* ARRAY: element type */
    uint64_t arr_n;     /* ARRAY: element count */
    const uint8_t *arr_data;  /* ARRAY of scalars: packed elements */
    uint64_t *arr_str_off;    /* ARRAY of STRING: owned, offsets into the mapping of each u64 length */
} gguf_kv;

typedef struct gguf_tensor {
    char *name;         /* owned, NUL-terminated */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] = row length (innermost); unused dims are 1 */
    uint32_t type;      /* ggml type id (see quant.h) */
    uint64_t offset;    /* relative to the data section */
    uint64_t nbytes;
    const void *data;   /* into the mapping */
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    const uint8_t *map;
    uint64_t size;
    bool owns_map;      /* mapped by gguf_open (unmapped by gguf_close) */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_start;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
} gguf_file;

/* Maps and validates path. Returns 0 and *out, or -1 with err naming file/field/value. */
int gguf_open(gguf_file **out, const char *path, ditto_err *err);
/* Same over a caller-owned buffer (not copied; must outlive the gguf_file). */
int gguf_open_buffer(gguf_file **out, const void *buf, uint64_t size, const char *name, ditto_err *err);
void gguf_close(gguf_file *f);
/* Maps every page of the file now (weights are then read without page faults). */
void gguf_populate(const gguf_file *f);

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: return 0, or -1 with err naming the key if absent or of an
 * incompatible type / out of range. Integer getters accept any integer type. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, ditto_err *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, ditto_err *err);
/* String value as a fresh NUL-terminated copy (caller frees). */
int gguf_get_str(const gguf_file *f, const char *key, char **out, ditto_err *err);
/* Element i of a string array (pointer into the mapping, length in *len). */
const char *gguf_arr_str(const gguf_file *f, const gguf_kv *kv, uint64_t i, uint64_t *len);

const char *gguf_vtype_name(uint32_t t);

#endif
