/* tokenizer.h — byte-level BPE (GPT-2 / Qwen2 flavour) built from GGUF metadata,
 * special-token parsing, detokenizer, streaming detokenizer, chat-template detection
 * and the `ditto tokenize` command (chat rendering: chat.h).
 *
 * Metadata read by tokenizer_load:
 *   tokenizer.ggml.model       string, must be "gpt2"
 *   tokenizer.ggml.pre         string, must be "qwen2"
 *   tokenizer.ggml.tokens      string array (the vocabulary, byte-level unicode form)
 *   tokenizer.ggml.token_type  int32 array, same length (1 normal, 2 unknown, 3 control,
 *                              4 user-defined, 5 unused, 6 byte)
 *   tokenizer.ggml.merges      string array "left right", rank = index
 *   tokenizer.ggml.{eos,bos,padding}_token_id   optional integers (< n_vocab)
 *   tokenizer.chat_template    optional string (see chat_render)
 *
 * Encoding pipeline (matches HF `tokenizers` for Qwen2/Qwen3 tokenizer.json):
 *   1. if parse_special: split the raw text on special tokens (types 3 and 4), leftmost
 *      first, longest first at a position; they map straight to their id;
 *   2. every other segment: NFC (utf8proc), Qwen2 regex pre-tokenizer (PCRE2, UTF+UCP,
 *      JIT), then byte-level BPE by merge rank (lowest rank first, leftmost on ties).
 *   No BOS/EOS is ever added.
 *   Invalid UTF-8 in the input (stray continuation bytes, overlongs, surrogates, bytes
 *   > 0xF4, truncated sequences) never fails: each invalid byte becomes its own
 *   single-byte token, and the valid stretches on either side are pre-tokenized as
 *   separate texts. Decoding such ids gives the input bytes back exactly.
 *
 * Thread safety: every function taking a `const tokenizer *` may run concurrently
 * from any number of threads. A loaded tokenizer is immutable except for an internal
 * cache of merge results (words of <= 22 bytes that are not a single token), whose
 * slots are guarded by striped mutexes; results never depend on the cache. */
#ifndef DITTO_TOKENIZER_H
#define DITTO_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "gguf.h"

typedef struct tokenizer tokenizer;

enum tok_type {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER = 4,   /* user-defined, e.g. <think>, <tool_call> */
    TOK_TYPE_UNUSED = 5, /* [PADnnn] fillers */
    TOK_TYPE_BYTE = 6,
};

/* Builds the tokenizer from f's metadata. f may be closed afterwards (everything
 * needed is copied). Returns 0 and *out, or -1 with err naming the key and value
 * (unknown model/pre, missing or mistyped arrays, a merge naming an unknown token,
 * a missing byte token, an out-of-range special id). */
int tokenizer_load(tokenizer **out, const gguf_file *f, ditto_err *err);
void tokenizer_free(tokenizer *tok);

/* Encodes text[0..len) (need not be NUL-terminated; NUL bytes are ordinary text).
 * parse_special: recognise control/user-defined token texts (e.g. "<|im_start|>")
 * and emit their ids; false: they are tokenized as plain text.
 * On success returns 0, *ids = malloc'd array (never NULL, free() it), *n_ids = count.
 * Returns -1 with err only on a regex engine failure (not expected in practice). */
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, bool parse_special, int32_t **ids,
                     size_t *n_ids, ditto_err *err);

/* Concatenates the pieces of ids into a malloc'd NUL-terminated buffer (*out, length
 * in *out_len, excluding the terminator). Normal tokens decode through the byte-level
 * map; every other type decodes to its text verbatim. The result is raw bytes: it can
 * be invalid UTF-8 when ids split a character (use detok_stream for text output).
 * Returns -1 with err naming the index and value of an out-of-range id. */
int tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, char **out, size_t *out_len,
                     ditto_err *err);

/* Decoded bytes of one token (not NUL-terminated), or NULL if id is out of range. */
const char *tokenizer_piece(const tokenizer *tok, int32_t id, size_t *len);
/* Longest piece in bytes. */
size_t tokenizer_max_piece_len(const tokenizer *tok);

int32_t tokenizer_n_vocab(const tokenizer *tok);
int32_t tokenizer_eos(const tokenizer *tok); /* -1 when the GGUF has none */
int32_t tokenizer_bos(const tokenizer *tok); /* -1 when none; never added by encode */
int32_t tokenizer_pad(const tokenizer *tok); /* -1 when none */
/* enum tok_type of id, or 0 if out of range. */
int tokenizer_token_type(const tokenizer *tok, int32_t id);
/* Control or user-defined token (the ones parse_special recognises). */
bool tokenizer_is_special(const tokenizer *tok, int32_t id);
/* End of generation: the EOS id, <|im_end|> or <|endoftext|>. */
bool tokenizer_is_eog(const tokenizer *tok, int32_t id);
/* Id of the token whose decoded bytes are exactly s[0..len) (special tokens by their
 * text), or -1. */
int32_t tokenizer_find(const tokenizer *tok, const char *s, size_t len);
/* Id of the single-byte token for byte b (always exists after a successful load). */
int32_t tokenizer_byte_token(const tokenizer *tok, uint8_t b);

/* ---- streaming detokenizer ------------------------------------------------
 * Turns ids into text one at a time and only ever emits whole, valid UTF-8
 * characters: a trailing incomplete sequence is held back until the next token
 * completes it. Bytes that can no longer become valid (stray continuation bytes,
 * a lead byte followed by a non-continuation, 0xC0/0xC1/0xF5..0xFF, overlong or
 * surrogate forms) are replaced by U+FFFD, one per maximal invalid subpart, as soon
 * as they are known bad. flush emits a held-back incomplete tail as one U+FFFD.
 * For ids whose decode is valid UTF-8, the concatenated outputs equal
 * tokenizer_decode exactly. push and flush never allocate. */
typedef struct detok_stream {
    const tokenizer *tok;
    uint8_t pend[4];  /* held-back bytes of an incomplete character */
    size_t n_pend;
    char *buf;        /* output storage, owned */
    size_t cap;
} detok_stream;

void detok_stream_init(detok_stream *ds, const tokenizer *tok);
void detok_stream_free(detok_stream *ds);
/* Feeds id (must be in [0, n_vocab): DT_ASSERT). Returns text ready to emit (maybe
 * empty) with its length in *len; valid until the next call on ds. */
const char *detok_stream_push(detok_stream *ds, int32_t id, size_t *len);
/* Emits whatever is held back (as U+FFFD) and resets the stream for reuse. */
const char *detok_stream_flush(detok_stream *ds, size_t *len);

/* ---- chat template kind (rendering: chat.h) ---------------------------------
 * tokenizer_load classifies tokenizer.chat_template:
 *   CHAT_QWEN3   contains "<|im_start|>" and ("enable_thinking" or "<think>")
 *   CHAT_CHATML  contains "<|im_start|>"
 *   otherwise, or absent: CHAT_CHATML with a warning (tokenizer_chat_warning). */
enum chat_kind { CHAT_CHATML = 0, CHAT_QWEN3 = 1 };

enum chat_kind tokenizer_chat_kind(const tokenizer *tok);
/* NULL when the GGUF's template was recognised; else a one-line message to log. */
const char *tokenizer_chat_warning(const tokenizer *tok);

/* `ditto tokenize -m FILE [--pieces] [--no-special] [TEXT | -]`: argv[0] is the
 * subcommand name. Prints the ids space-separated on one line, or with --pieces one
 * "id<TAB>piece" line per token (piece escaped: \n \r \t \\ and \xNN for control
 * bytes and bytes of incomplete/invalid UTF-8). TEXT "-" or absent: read stdin.
 * Returns the process exit status (0 ok, 1 error, 2 usage). */
int tokenizer_cmd(int argc, char **argv);

#endif
