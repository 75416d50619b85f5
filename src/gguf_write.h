/* gguf_write.h — streaming GGUF v3 writer.
 *
 * Use in three phases:
 *   1. declare: gguf_write_set_* / gguf_write_copy_kv (metadata, in insertion
 *      order; setting an existing key replaces its value in place) and
 *      gguf_write_add_tensor (tensor infos, in data order);
 *   2. gguf_write_begin / gguf_write_begin_stream: writes the whole header and
 *      the padding up to the data section;
 *   3. gguf_write_data for each tensor in declaration order (one call with the
 *      whole tensor or several chunks), then gguf_write_finish.
 * Only one tensor's worth of data (or one chunk) ever needs to be in memory.
 *
 * Tensor data offsets are multiples of the alignment (general.alignment if the
 * caller set it as a uint32, else 32) and every gap is zero-filled; the file
 * ends with the last tensor padded to the alignment, as ggml writes it.
 *
 * Declarations are trusted program input: invalid ones (empty key, name longer
 * than GGUF_MAX_NAME-1, bad dims, row length not a multiple of the block size,
 * duplicate tensor, data overrun) are DT_ASSERT failures. I/O failures return
 * -1 with err naming the file. */
#ifndef DITTO_GGUF_WRITE_H
#define DITTO_GGUF_WRITE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "gguf.h"

typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_write_new(void);
/* Frees everything; closes the file if gguf_write_begin opened it and
 * gguf_write_finish was not reached (the partial file is left on disk). */
void gguf_write_free(gguf_writer *w);

/* Metadata setters (before begin). key: NUL-terminated, 1..65535 bytes. */
void gguf_write_set_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_write_set_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_write_set_f32(gguf_writer *w, const char *key, float v);
void gguf_write_set_bool(gguf_writer *w, const char *key, bool v);
void gguf_write_set_str(gguf_writer *w, const char *key, const char *s);
/* String of explicit length (may contain any bytes). */
void gguf_write_set_strn(gguf_writer *w, const char *key, const char *s, uint64_t len);
void gguf_write_set_arr_str(gguf_writer *w, const char *key, const char *const *s, uint64_t n);
void gguf_write_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
void gguf_write_set_arr_u32(gguf_writer *w, const char *key, const uint32_t *v, uint64_t n);
void gguf_write_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n);

/* Copies every metadata entry of src whose key starts with prefix ("" or NULL:
 * all) as raw bytes (string arrays are one memcpy: O(bytes), no per-element
 * work). src may be closed afterwards. Returns the number of keys copied. */
uint64_t gguf_write_copy_kv(gguf_writer *w, const gguf_file *src, const char *prefix);
/* Copies one entry (kv must belong to src). */
void gguf_write_copy_one(gguf_writer *w, const gguf_file *src, const gguf_kv *kv);

/* Declares a tensor (before begin). ne[0] is the row length; n_dims 1..4.
 * Returns its byte size. */
uint64_t gguf_write_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims, const uint64_t *ne,
                               uint32_t type);

/* Number of declared tensors / byte size of tensor i (declaration order). */
uint64_t gguf_write_n_tensors(const gguf_writer *w);
uint64_t gguf_write_tensor_nbytes(const gguf_writer *w, uint64_t i);
const char *gguf_write_tensor_name(const gguf_writer *w, uint64_t i);
/* Size of the complete file as declared so far. */
uint64_t gguf_write_total_size(const gguf_writer *w);

/* Creates/truncates path and writes the header. */
int gguf_write_begin(gguf_writer *w, const char *path, ditto_err *err);
/* Same into a caller-owned stream (e.g. open_memstream); name is for messages.
 * The stream is not closed by the writer. */
int gguf_write_begin_stream(gguf_writer *w, FILE *fp, const char *name, ditto_err *err);

/* Appends n bytes to the current tensor (n must not exceed what is left of it);
 * when a tensor is complete the padding is written and the next one begins. */
int gguf_write_data(gguf_writer *w, const void *data, size_t n, ditto_err *err);
/* Index of the tensor the next gguf_write_data goes to (== n_tensors when done). */
uint64_t gguf_write_current(const gguf_writer *w);
/* Bytes written so far (header included). */
uint64_t gguf_write_bytes_written(const gguf_writer *w);

/* Checks every tensor was written, flushes and (for begin) closes the file. */
int gguf_write_finish(gguf_writer *w, ditto_err *err);

#endif
