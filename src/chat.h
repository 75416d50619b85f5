/* chat.h — chat prompt rendering for the templates tokenizer_load recognises.
 *
 * CHAT_QWEN3 renders exactly what the Qwen3 Jinja template (tokenizer.chat_template
 * of the Qwen3 GGUFs) renders when no tools are given:
 *   - a first "system" message: <|im_start|>system\n{content}<|im_end|>\n
 *   - "user", and "system" when not first: <|im_start|>{role}\n{content}<|im_end|>\n
 *   - "assistant": reasoning = reasoning_content when non-NULL; otherwise, when content
 *     holds "</think>", reasoning = the text before the first "</think>" with trailing
 *     '\n' removed, then after the last "<think>" in it, leading '\n' removed; and
 *     content = the text after the last "</think>", leading '\n' removed.
 *     An assistant turn after the last real user query (a user message whose content
 *     is not "<tool_response>...</tool_response>") that is the final message or has
 *     non-empty reasoning renders
 *       <|im_start|>assistant\n<think>\n{reasoning, '\n' stripped both ends}\n</think>\n\n
 *       {content, leading '\n' removed}<|im_end|>\n
 *     every other assistant turn renders <|im_start|>assistant\n{content}<|im_end|>\n
 *     (so the thinking of turns before the last user query is dropped).
 *   - "tool": consecutive tool messages share one user turn:
 *       <|im_start|>user\n<tool_response>\n{c1}\n</tool_response>\n<tool_response>\n{c2}
 *       \n</tool_response><|im_end|>\n
 *   - any other role renders nothing (as the template does: validate roles upstream).
 *   add_generation_prompt: <|im_start|>assistant\n, then <think>\n\n</think>\n\n when
 *   enable_thinking is false.
 *   Not supported: `tools` and assistant `tool_calls` (never rendered).
 * CHAT_CHATML: <|im_start|>{role}\n{content}<|im_end|>\n for every message;
 *   add_generation_prompt: <|im_start|>assistant\n (enable_thinking is ignored).
 * A NULL role or content renders as "". */
#ifndef DITTO_CHAT_H
#define DITTO_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "tokenizer.h"

typedef struct chat_msg {
    const char *role;
    const char *content;
    const char *reasoning_content; /* optional (NULL: absent); assistant turns only */
} chat_msg;

/* Renders msgs with tok's template kind; returns a malloc'd NUL-terminated prompt
 * (free()). Encode it with parse_special = true. */
char *chat_render(const tokenizer *tok, const chat_msg *msgs, size_t n, bool add_generation_prompt,
                  bool enable_thinking);

/* Same with an explicit kind. */
char *chat_render_kind(enum chat_kind kind, const chat_msg *msgs, size_t n, bool add_generation_prompt,
                       bool enable_thinking);

#endif
