/* chat.c — ChatML / Qwen3 prompt rendering (see chat.h). */
#include "chat.h"

#include <string.h>

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->p, c);
        if (!p) {
            fprintf(stderr, "ditto: out of memory (%zu bytes)\n", c);
            abort();
        }
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static const char *nz(const char *s) { return s ? s : ""; }

static bool is_role(const chat_msg *m, const char *r) { return m->role && strcmp(m->role, r) == 0; }

static bool starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static bool ends_with(const char *s, const char *p) {
    size_t n = strlen(s), k = strlen(p);
    return n >= k && memcmp(s + n - k, p, k) == 0;
}

/* Last occurrence of needle in s[0..n), or NULL. */
static const char *last_of(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (const char *p = s; (p = memmem(p, (size_t)(s + n - p), needle, k)) != NULL; p++) hit = p;
    return hit;
}

/* A view s[0..n) with '\n' trimmed from the front and/or back. */
static void trim_nl(const char **s, size_t *n, bool front, bool back) {
    while (front && *n && **s == '\n') (*s)++, (*n)--;
    while (back && *n && (*s)[*n - 1] == '\n') (*n)--;
}

static void qwen3_assistant(sbuf *b, const chat_msg *m, bool with_think_block, bool is_last) {
    const char *c = nz(m->content);
    size_t cn = strlen(c);
    const char *r = "";
    size_t rn = 0;
    if (m->reasoning_content) {
        r = m->reasoning_content;
        rn = strlen(r);
    } else {
        const char *first_end = strstr(c, "</think>");
        if (first_end) {
            const char *last_end = last_of(c, cn, "</think>");
            /* reasoning: before the first </think>, rstrip '\n', after the last <think>, lstrip '\n' */
            r = c;
            rn = (size_t)(first_end - c);
            trim_nl(&r, &rn, false, true);
            const char *open = last_of(r, rn, "<think>");
            if (open) {
                rn -= (size_t)(open + 7 - r);
                r = open + 7;
            }
            trim_nl(&r, &rn, true, false);
            c = last_end + 8;
            cn = strlen(c);
            trim_nl(&c, &cn, true, false);
        }
    }
    sb_str(b, "<|im_start|>assistant\n");
    if (with_think_block && (is_last || rn > 0)) {
        sb_str(b, "<think>\n");
        trim_nl(&r, &rn, true, true);
        sb_add(b, r, rn);
        sb_str(b, "\n</think>\n\n");
        trim_nl(&c, &cn, true, false);
    }
    sb_add(b, c, cn);
    sb_str(b, "<|im_end|>\n");
}

static void render_qwen3(sbuf *b, const chat_msg *msgs, size_t n) {
    /* last_query_index: the last user message that is not a wrapped tool response */
    size_t lqi = n ? n - 1 : 0;
    for (size_t k = n; k-- > 0;) {
        const char *c = nz(msgs[k].content);
        if (is_role(&msgs[k], "user") && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            lqi = k;
            break;
        }
    }
    if (n && is_role(&msgs[0], "system")) {
        sb_str(b, "<|im_start|>system\n");
        sb_str(b, nz(msgs[0].content));
        sb_str(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        const chat_msg *m = &msgs[i];
        if (is_role(m, "user") || (is_role(m, "system") && i > 0)) {
            sb_str(b, "<|im_start|>");
            sb_str(b, m->role);
            sb_str(b, "\n");
            sb_str(b, nz(m->content));
            sb_str(b, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            qwen3_assistant(b, m, n > 0 && i > lqi, i + 1 == n);
        } else if (is_role(m, "tool")) {
            if (i == 0 || !is_role(&msgs[i - 1], "tool")) sb_str(b, "<|im_start|>user");
            sb_str(b, "\n<tool_response>\n");
            sb_str(b, nz(m->content));
            sb_str(b, "\n</tool_response>");
            if (i + 1 == n || !is_role(&msgs[i + 1], "tool")) sb_str(b, "<|im_end|>\n");
        }
    }
}

char *chat_render_kind(enum chat_kind kind, const chat_msg *msgs, size_t n, bool add_generation_prompt,
                       bool enable_thinking) {
    sbuf b = {0};
    sb_add(&b, "", 0);
    if (kind == CHAT_QWEN3) {
        render_qwen3(&b, msgs, n);
    } else {
        for (size_t i = 0; i < n; i++) {
            sb_str(&b, "<|im_start|>");
            sb_str(&b, nz(msgs[i].role));
            sb_str(&b, "\n");
            sb_str(&b, nz(msgs[i].content));
            sb_str(&b, "<|im_end|>\n");
        }
    }
    if (add_generation_prompt) {
        sb_str(&b, "<|im_start|>assistant\n");
        if (kind == CHAT_QWEN3 && !enable_thinking) sb_str(&b, "<think>\n\n</think>\n\n");
    }
    return b.p;
}

char *chat_render(const tokenizer *tok, const chat_msg *msgs, size_t n, bool add_generation_prompt,
                  bool enable_thinking) {
    return chat_render_kind(tokenizer_chat_kind(tok), msgs, n, add_generation_prompt, enable_thinking);
}
