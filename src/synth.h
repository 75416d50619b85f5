/* synth.h — random-weight GGUF models of any qwen3moe / qwen3 geometry.
 *
 * The file is a valid GGUF v3 with the metadata keys and tensor names the
 * llama.cpp converter writes for Qwen3-MoE (general.architecture = qwen3moe)
 * or dense Qwen3 (n_experts == 0: qwen3, ffn_gate/ffn_up/ffn_down). Quantized
 * weights are random blocks whose block scales make the dequantized weights
 * have mean ~0 and std ~1/sqrt(row length); norm weights are 1; the router is
 * small uniform noise. Output is a pure function of the params (same seed, same
 * bytes). Data are generated and written per chunk, never a whole tensor. */
#ifndef DITTO_SYNTH_H
#define DITTO_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"

enum synth_type {
    SYNTH_Q4_K_M = 0, /* Q4_K; Q6_K for attn_v, token_embd, output */
    SYNTH_Q4_0 = 1,   /* Q4_0; Q6_K for output */
    SYNTH_Q8_0 = 2,   /* Q8_0 everywhere */
    SYNTH_Q5_K_M = 3, /* Q5_K; Q6_K for attn_v, token_embd, output */
};

typedef struct synth_params {
    uint32_t n_layers;
    uint32_t hidden;         /* embedding_length */
    uint32_t n_heads;
    uint32_t n_kv_heads;     /* must divide n_heads */
    uint32_t head_dim;       /* key_length = value_length */
    uint32_t n_experts;      /* 0: dense qwen3 */
    uint32_t n_experts_used; /* 1..n_experts (ignored when dense) */
    uint32_t expert_ffn;     /* expert_feed_forward_length */
    uint32_t dense_ffn;      /* feed_forward_length (the FFN width of a dense model) */
    uint32_t vocab;
    uint32_t ctx;            /* context_length */
    bool tie_output;         /* true: no output.weight (token_embd is reused) */
    enum synth_type type;
    uint64_t seed;
    /* GGUF whose tokenizer.* keys are copied; its token count must equal vocab.
     * NULL: no tokenizer keys are written. */
    const char *tokenizer_from;
    bool quiet;              /* no progress / summary on stderr */
} synth_params;

/* Fills *p with a named preset ("30b-a3b" or "tiny"), seed 0, type Q4_K_M,
 * no tokenizer. Returns 0, or -1 for an unknown name. */
int synth_params_preset(synth_params *p, const char *name);

/* Checks the geometry. Returns 0 or -1 with err naming the field. */
int synth_validate(const synth_params *p, ditto_err *err);

/* The ggml type synth uses for a tensor whose rows have row_len elements and
 * whose preferred type is want: want if row_len is a multiple of its block,
 * else Q8_0, else F32. */
uint32_t synth_fit_type(uint32_t want, uint64_t row_len);

/* Writes the model to path. Returns 0, or -1 with err (invalid params,
 * tokenizer problems, I/O); on failure a partial file is removed. */
int synth_write(const synth_params *p, const char *path, ditto_err *err);

/* `ditto synth` command line; argv[0] is the subcommand name ("synth").
 * Returns the process exit status (0 ok, 1 failure, 2 usage). */
int synth_cmd(int argc, char **argv);

#endif
