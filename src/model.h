/* model.h — hyperparameters and weight views of a `qwen3moe` or `qwen3` GGUF.
 * Every number comes from the file's metadata; shapes are checked against it. */
#ifndef DITTO_MODEL_H
#define DITTO_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "gguf.h"

enum model_arch { MODEL_ARCH_QWEN3MOE = 0, MODEL_ARCH_QWEN3 = 1 };

typedef struct model_hparams {
    enum model_arch arch;
    int n_layer;
    int n_embd;        /* hidden size */
    int n_head;        /* query heads */
    int n_head_kv;     /* key/value heads (n_head % n_head_kv == 0) */
    int head_dim;      /* key_length == value_length */
    int n_expert;      /* 0 for dense qwen3 */
    int n_expert_used;
    int n_ff_exp;      /* expert FFN size */
    int n_ff;          /* dense FFN size (qwen3) */
    int n_vocab;
    int n_ctx_train;
    float rope_base;
    float rms_eps;
    bool tied_output;  /* output head reuses token_embd */
} model_hparams;

/* A weight matrix view: `rows` rows of `cols` weights (cols = GGUF ne[0]);
 * for expert tensors `n_mat` matrices of rows x cols, matrix e at data + e*mat_bytes. */
typedef struct model_weight {
    const void *data;
    uint32_t type;
    int cols, rows, n_mat;
    size_t row_bytes, mat_bytes;
} model_weight;

typedef struct model_layer {
    float *attn_norm;  /* [n_embd] owned */
    float *q_norm;     /* [head_dim] */
    float *k_norm;     /* [head_dim] */
    float *ffn_norm;   /* [n_embd] */
    model_weight wq;   /* [n_head*head_dim rows x n_embd] */
    model_weight wk;   /* [n_head_kv*head_dim x n_embd] */
    model_weight wv;   /* [n_head_kv*head_dim x n_embd] */
    model_weight wo;   /* [n_embd x n_head*head_dim] */
    model_weight gate_inp;  /* router [n_expert x n_embd] */
    model_weight gate_exps; /* n_expert x [n_ff_exp x n_embd] */
    model_weight up_exps;   /* n_expert x [n_ff_exp x n_embd] */
    model_weight down_exps; /* n_expert x [n_embd x n_ff_exp] */
    model_weight ffn_gate;  /* dense: [n_ff x n_embd] */
    model_weight ffn_up;    /* dense: [n_ff x n_embd] */
    model_weight ffn_down;  /* dense: [n_embd x n_ff] */
} model_layer;

typedef struct model {
    gguf_file *gguf;
    char *name;
    model_hparams hp;
    model_weight tok_embd;  /* [n_vocab x n_embd]; data: an owned anonymous copy where the file is mapped */
    model_weight output;    /* [n_vocab x n_embd] (tok_embd's file view when tied) */
    float *output_norm;     /* [n_embd] */
    model_layer *layers;
    uint64_t n_params;
    void *embd_copy;        /* tok_embd.data when it is a copy, else NULL */
    void *prepared;         /* backend-prepared weights (e.g. repacked), shared by its engines */
    void (*prepared_free)(void *);
    int32_t eog[8];         /* end-of-generation token ids (EOS, EOT, <|im_end|>, <|endoftext|>) */
    int n_eog;
} model;

/* Opens and validates path. Errors name the file, key or tensor. */
int model_load(model **out, const char *path, ditto_err *err);
void model_free(model *m);

/* Bytes of weights read to decode one token (attention, router, the used
 * experts at the average expert size, output head; not the embedding row). */
uint64_t model_bytes_per_token(const model *m);
/* Dequantizes row `id` of the token embedding into x[n_embd]. */
void model_embed(const model *m, int32_t id, float *x);

#endif
