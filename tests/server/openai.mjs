// openai.mjs — the official `openai` Node client against a running `ditto serve`.
// Usage: node tests/server/openai.mjs BASE_URL API_KEY   (BASE_URL ends in /v1)
// Prints "ok - NAME" / "not ok - NAME: why" per case and ends with "N passed, N failed".
import OpenAI from 'openai';

const [baseURL, apiKey] = process.argv.slice(2);
if (!baseURL) {
  console.log('usage: node openai.mjs BASE_URL API_KEY');
  console.log('0 passed, 1 failed');
  process.exit(1);
}
const client = new OpenAI({ baseURL, apiKey: apiKey || 'none', maxRetries: 0, timeout: 60_000 });
let passed = 0;
let failed = 0;

async function test(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok - ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}: ${(e && e.stack) || e}`);
  }
}

function assert(cond, msg) {
  if (!cond) throw new Error(msg);
}

function eq(a, b, what) {
  const sa = JSON.stringify(a);
  const sb = JSON.stringify(b);
  assert(sa === sb, `${what}: ${sa} != ${sb}`);
}

async function chatStream(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  let role = null;
  let chunks = 0;
  for await (const ch of stream) {
    assert(ch.object === 'chat.completion.chunk', `chunk object ${ch.object}`);
    chunks++;
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    const c = ch.choices[0];
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { text, finish, usage, role, chunks };
}

async function completionStream(params) {
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  const tokens = [];
  const offsets = [];
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    text += ch.choices[0].text;
    if (ch.choices[0].logprobs) {
      tokens.push(...ch.choices[0].logprobs.tokens);
      offsets.push(...ch.choices[0].logprobs.text_offset);
    }
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { text, finish, usage, tokens, offsets };
}

let model = 'unknown';
const messages = [{ role: 'user', content: 'Tell me about the beginning of all things.' }];

await test('models.list returns the served model', async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert(ids.length === 1, `models: ${ids}`);
  model = ids[0];
  const one = await client.models.retrieve(model);
  assert(one.id === model, 'models.retrieve');
});

let chatRef = null;
await test('chat.completions.create (non-streaming, greedy)', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  assert(r.object === 'chat.completion', `object ${r.object}`);
  assert(r.id.startsWith('chatcmpl-'), `id ${r.id}`);
  const c = r.choices[0];
  assert(c.message.role === 'assistant', 'role');
  assert(typeof c.message.content === 'string' && c.message.content.length > 0, 'content');
  assert(['stop', 'length'].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
  assert(r.usage.completion_tokens >= 1 && r.usage.completion_tokens <= 24, `usage ${JSON.stringify(r.usage)}`);
  assert(r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, 'total_tokens');
  chatRef = r;
});

await test('chat.completions.create (streaming) equals non-streaming', async () => {
  const s = await chatStream({ model, messages, max_tokens: 24, temperature: 0 });
  assert(s.role === 'assistant', 'first delta carries the role');
  eq(s.text, chatRef.choices[0].message.content, 'text');
  eq(s.finish, chatRef.choices[0].finish_reason, 'finish_reason');
  eq(s.usage, chatRef.usage, 'usage');
});

await test('chat content as an array of text parts', async () => {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me about the beginning of all things.' }] }],
    max_tokens: 24,
    temperature: 0,
  });
  eq(r.choices[0].message.content, chatRef.choices[0].message.content, 'text');
});

let complRef = null;
await test('completions.create (non-streaming, greedy)', async () => {
  const r = await client.completions.create({ model, prompt: 'In the beginning', max_tokens: 20, temperature: 0 });
  assert(r.object === 'text_completion', `object ${r.object}`);
  assert(r.choices[0].text.length > 0, 'text');
  assert(r.usage.prompt_tokens === 3 && r.usage.completion_tokens === 20, `usage ${JSON.stringify(r.usage)}`);
  eq(r.choices[0].finish_reason, 'length', 'finish_reason');
  complRef = r;
});

await test('completions.create (streaming) equals non-streaming', async () => {
  const s = await completionStream({ model, prompt: 'In the beginning', max_tokens: 20, temperature: 0 });
  eq(s.text, complRef.choices[0].text, 'text');
  eq(s.finish, 'length', 'finish_reason');
  eq(s.usage, complRef.usage, 'usage');
});

await test('stop string across token boundaries', async () => {
  const full = complRef.choices[0].text;
  const stop = full.slice(6, 13); // straddles tokens
  const at = full.indexOf(stop);
  const r = await client.completions.create({ model, prompt: 'In the beginning', max_tokens: 20, temperature: 0, stop: [stop] });
  eq(r.choices[0].text, full.slice(0, at), 'text cut at the stop string');
  eq(r.choices[0].finish_reason, 'stop', 'finish_reason');
  const s = await completionStream({ model, prompt: 'In the beginning', max_tokens: 20, temperature: 0, stop });
  eq(s.text, full.slice(0, at), 'streamed text cut at the stop string');
  eq(s.finish, 'stop', 'streamed finish_reason');
});

await test('seeded sampling is reproducible', async () => {
  const p = { model, messages, max_tokens: 16, temperature: 0.9, top_p: 0.95, seed: 1234 };
  const a = await client.chat.completions.create(p);
  const b = await chatStream(p);
  eq(b.text, a.choices[0].message.content, 'same seed, same text');
});

await test('chat logprobs with top_logprobs', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert(lp.length === r.usage.completion_tokens, `${lp.length} logprob entries for ${r.usage.completion_tokens} tokens`);
  eq(lp.map((e) => e.token).join(''), r.choices[0].message.content, 'tokens spell the content');
  for (const e of lp) {
    assert(e.logprob <= 0, `logprob ${e.logprob}`);
    assert(e.top_logprobs.length === 3, 'three alternatives');
    eq(e.top_logprobs[0].token, e.token, 'greedy: the sampled token is the top one');
    assert(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, 'sorted');
  }
});

await test('completions logprobs', async () => {
  const r = await client.completions.create({ model, prompt: 'In the beginning', max_tokens: 5, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert(lp.tokens.length === 5 && lp.token_logprobs.length === 5 && lp.top_logprobs.length === 5, 'lengths');
  eq(lp.tokens.join(''), r.choices[0].text, 'tokens spell the text');
});

await test('completions logprobs end with the text a stop string cut', async () => {
  const full = await client.completions.create({ model, prompt: 'In the beginning', max_tokens: 16, temperature: 0, logprobs: 1 });
  const lf = full.choices[0].logprobs;
  // a stop string from the last character of token j into token j + 1, found nowhere earlier: the text ends
  // inside token j, so token j + 1 (which completed the match) must not come back
  const text = full.choices[0].text;
  const ascii = (s) => /^[\x20-\x7e]+$/.test(s);
  let j = 2;
  let cut = -1;
  let stop = '';
  for (; j < lf.tokens.length - 2; j++) {
    if (lf.tokens[j].length < 2 || !ascii(lf.tokens.slice(0, j + 2).join(''))) continue;
    cut = lf.text_offset[j + 1] - 1;
    stop = text.slice(cut, cut + 3);
    if (text.indexOf(stop) === cut) break;
  }
  assert(j < lf.tokens.length - 2 && lf.tokens.length === 16, `a stop string across tokens j, j + 1 (${JSON.stringify(stop)})`);
  const params = { model, prompt: 'In the beginning', max_tokens: 16, temperature: 0, logprobs: 1, stop };
  const r = await client.completions.create(params);
  const s = await completionStream(params);
  for (const [what, text, tokens, offsets] of [['non-streamed', r.choices[0].text, r.choices[0].logprobs.tokens,
    r.choices[0].logprobs.text_offset], ['streamed', s.text, s.tokens, s.offsets]]) {
    const chars = [...text].length;
    eq(text, full.choices[0].text.slice(0, cut), `${what}: the text up to the stop string`);
    eq(tokens.length, j + 1, `${what}: tokens up to the one the stop string begins in`);
    assert(tokens.join('').startsWith(text), `${what}: the tokens spell the text`);
    assert(tokens.slice(0, -1).join('').length < text.length, `${what}: the last token begins inside the text`);
    assert(offsets.every((o) => o < chars), `${what}: every text_offset inside the text (${offsets} of ${chars})`);
    eq(offsets, lf.text_offset.slice(0, offsets.length), `${what}: the offsets of the uncut run`);
  }
});

await test('concurrent streams return their solo text', async () => {
  const prompts = ['In the beginning', 'The hacker', 'A fortune', 'And God said'];
  const solo = [];
  for (const p of prompts) solo.push((await client.completions.create({ model, prompt: p, max_tokens: 16, temperature: 0 })).choices[0].text);
  const all = await Promise.all(prompts.map((p) => completionStream({ model, prompt: p, max_tokens: 16, temperature: 0 })));
  eq(all.map((x) => x.text), solo, 'texts');
});

await test('400 errors come back as APIError with param', async () => {
  try {
    await client.chat.completions.create({ model, messages, temperature: 'hot' });
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof OpenAI.BadRequestError, `got ${e}`);
    eq(e.status, 400, 'status');
    eq(e.param, 'temperature', 'param');
    eq(e.type, 'invalid_request_error', 'type');
  }
});

await test('context_length_exceeded', async () => {
  try {
    await client.completions.create({ model, prompt: 'In the beginning', max_tokens: 1000000 });
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof OpenAI.BadRequestError, `got ${e}`);
    eq(e.code, 'context_length_exceeded', 'code');
  }
});

await test('wrong API key is a 401 AuthenticationError', async () => {
  const bad = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0 });
  try {
    await bad.models.list();
    throw new Error('no error');
  } catch (e) {
    assert(e instanceof OpenAI.AuthenticationError, `got ${e}`);
    eq(e.status, 401, 'status');
  }
});

await test('aborting a stream mid-way leaves the server healthy', async () => {
  const ac = new AbortController();
  const stream = await client.completions.create(
    { model, prompt: 'In the beginning', max_tokens: 900, temperature: 0, stream: true, ignore_eos: true },
    { signal: ac.signal },
  );
  let n = 0;
  try {
    for await (const ch of stream) {
      if (ch.choices.length && ++n === 3) ac.abort();
    }
  } catch (e) {
    assert(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', `got ${e}`);
  }
  const r = await client.completions.create({ model, prompt: 'In the beginning', max_tokens: 20, temperature: 0 });
  eq(r.choices[0].text, complRef.choices[0].text, 'next request');
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
