// Structured output and the OpenAI-shaped API in headless Chromium (WebGPU on SwiftShader) with
// the real Gemma 3 270M in the worker engine: the official `openai` client talks to it through
// `engine.fetch` (a JSON schema at temperature 1, then a streamed json_object answer), it takes a
// Lark grammar, and a tool call makes the round trip (call parsed, result sent back as a tool
// message, final answer). Outputs are validated here with Ajv, not by the code under test.
// SwiftShader runs a decode step in ~2.5 s: generations are short and timed. Needs `scripts/build`.
// One engine for the file, loaded once: each load on SwiftShader fetches the model and compiles
// every pipeline anew on its device. It is the worker engine (the page's UI never blocks on the
// GPU), which is `Engine` behind postMessage with the same `fetch` and options: the main-thread
// `Engine` runs the real model in demo.test.mjs, and its OpenAI layer is the same js/openai.js.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import { launchChromium, startServer } from '../../scripts/browser.mjs';

const port = Number(process.env.CERA_STRUCTURED_PORT || 18794);
const MODEL = '/models/gemma-3-270m-q4_k_m.gguf';
const log = (...a) => console.log('[structured]', ...a);

// The schema of the native test (tests/structured.rs, `person_schema`: six seeds there): a nested
// object, an enum, an array and required fields, with the free parts bounded (a 4-character name,
// one tag, a one-digit zip) so the sampled answer is a few decode steps of a few seconds each here;
// the keys and punctuation are forced and cost no step. A longer string or number would only add
// steps of the same kind (with maxLength 10, two tags and a 5-digit zip this test took 88-137 s).
const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 4 },
    role: { enum: ['admin', 'user', 'guest'] },
    tags: { type: 'array', items: { enum: ['new', 'vip'] }, maxItems: 1 },
    address: { type: 'object', properties: { zip: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['zip'], additionalProperties: false },
  },
  required: ['name', 'role', 'tags', 'address'],
  additionalProperties: false,
};

let server;
let browser;
let page;

before(async () => {
  server = await startServer(port);
  browser = await launchChromium();
  page = await browser.newPage();
  page.on('pageerror', (e) => log('page error', String(e)));
  await page.goto(`${server.url}/headless.html`);
  const t0 = Date.now();
  const ok = await page.evaluate(async (model) => {
    const m = await import('/js/index.js');
    const { default: OpenAI } = await import('/node_modules/openai/index.mjs');
    window.engine = await m.createWorkerEngine(model, { contextSize: 256 });
    window.client = new OpenAI({ apiKey: 'unused', baseURL: `${location.origin}/v1`, fetch: window.engine.fetch, dangerouslyAllowBrowser: true, maxRetries: 0 });
    window.cera = m;
    return true;
  }, MODEL);
  assert.ok(ok);
  log(`model loaded in ${Date.now() - t0} ms`);
});

after(async () => {
  await page?.evaluate(() => window.engine?.dispose()).catch(() => {});
  await browser?.close();
  server?.stop();
});

test('openai client through engine.fetch: a JSON schema at temperature 1 parses and validates', { timeout: 600_000 }, async () => {
  const t0 = Date.now();
  const r = await page.evaluate(
    (schema) =>
      window.client.chat.completions.create({
        model: 'gemma',
        messages: [{ role: 'user', content: 'Describe a user of a web shop as JSON.' }],
        // llguidance's own keyword: compact JSON, so the answer fits in a few dozen tokens.
        response_format: { type: 'json_schema', json_schema: { name: 'user', schema: { ...schema, 'x-guidance': { whitespace_flexible: false } } } },
        temperature: 1,
        seed: 7,
        max_tokens: 64,
      }),
    SCHEMA,
  );
  log(`schema: ${r.usage.completion_tokens} tokens in ${Date.now() - t0} ms: ${r.choices[0].message.content}`);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const value = JSON.parse(r.choices[0].message.content);
  const validate = new Ajv().compile(SCHEMA);
  assert.ok(validate(value), JSON.stringify(validate.errors));
});

test('openai client: streamed json_object chunks, usage last; the mask time is reported', { timeout: 600_000 }, async () => {
  const t0 = Date.now();
  const r = await page.evaluate(async () => {
    const stream = await window.client.chat.completions.create({
      model: 'gemma',
      messages: [{ role: 'user', content: 'Give a JSON object with a key "ok" set to true.' }],
      response_format: { type: 'json_object' },
      temperature: 0,
      // A few seconds a token on SwiftShader: 6 are enough for several content chunks, the usage
      // and a finish (greedy, this prompt's answer runs past 12 tokens, so it ends at 'length'
      // either way).
      max_tokens: 6,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    // The engine's own stats of a short constrained generation, for the mask time in the browser.
    const s = window.engine.generate('{"ok":', { grammar: { regex: ' ?(true|false)\\}' }, temperature: 0, maxTokens: 4 });
    const text = await s.text();
    return { chunks, text, stats: await s.stats };
  });
  const text = r.chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  log(`json_object: ${r.chunks.length} chunks in ${Date.now() - t0} ms: ${text}; regex: ${JSON.stringify(r.text)}, mask ${r.stats.maskMsPerToken.toFixed(2)} ms/token, decode ${r.stats.decodeTokS.toFixed(2)} tok/s`);
  assert.ok(r.chunks.every((c) => c.object === 'chat.completion.chunk'));
  const last = r.chunks.at(-1);
  assert.equal(last.usage.completion_tokens > 0, true);
  const fin = r.chunks.find((c) => c.choices[0]?.finish_reason);
  if (fin.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(text);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
  } else {
    assert.equal(fin.choices[0].finish_reason, 'length');
  }
  assert.match(r.text, /^ ?(true|false)\}$/);
  // Measured with performance.now(), which browsers may coarsen to 0.1 ms: reported, not gated.
  assert.ok(r.stats.maskMsPerToken >= 0);
});

test('worker engine: a Lark grammar, and a bad grammar is INVALID_ARGUMENT', { timeout: 600_000 }, async () => {
  const t0 = Date.now();
  const r = await page.evaluate(async () => {
    const w = window.engine;
    const lark = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]{1,3}/\n';
    const text = await w.chat([{ role: 'user', content: 'What is 6 times 7?' }], { grammar: { lark }, temperature: 0, maxTokens: 10 }).text();
    let error = null;
    try {
      await w.chat([{ role: 'user', content: 'Hi' }], { grammar: { gbnf: 'root ::= x\nx ::= <[42]>\n' } }).text();
    } catch (e) {
      error = { code: e.code, message: e.message };
    }
    return { text, error };
  });
  log(`worker lark in ${Date.now() - t0} ms: ${JSON.stringify(r)}`);
  assert.match(r.text, /^The answer is [0-9]{1,3}\.$/);
  assert.equal(r.error?.code, 'INVALID_ARGUMENT');
  assert.match(r.error.message, /line 2/);
});

test('openai client: a tool call round trip on the real model', { timeout: 600_000 }, async () => {
  const t0 = Date.now();
  const tool = {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      // An enum keeps the call short: every token is a decode step of a few seconds here.
      parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Oslo'] } }, required: ['city'], additionalProperties: false },
    },
  };
  const r = await page.evaluate(async (tool) => {
    const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];
    const first = await window.client.chat.completions.create({
      model: 'gemma',
      messages,
      tools: [tool],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      temperature: 0,
      max_tokens: 32,
    });
    const t1 = Date.now();
    const call = first.choices[0].message;
    const second = await window.client.chat.completions.create({
      model: 'gemma',
      messages: [...messages, call, { role: 'tool', tool_call_id: call.tool_calls?.[0]?.id ?? 'none', content: '{"sky": "sunny", "celsius": 21}' }],
      tools: [tool],
      // The final answer in words: no further call. Its first tokens show it is text; each one
      // more is a decode step of a few seconds.
      tool_choice: 'none',
      temperature: 0,
      max_tokens: 2,
    });
    // Bad tool requests fail before anything runs, with a reason.
    const errors = [];
    for (const extra of [
      { tool_choice: { type: 'function', function: { name: 'nope' } } },
      { response_format: { type: 'json_object' } },
      { tools: [{ type: 'function', function: { name: 'bad name' } }] },
      { tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'no-such-type' } } } } }], tool_choice: 'required' },
    ]) {
      try {
        await window.client.chat.completions.create({ model: 'gemma', messages, tools: [tool], max_tokens: 2, ...extra });
        errors.push(null);
      } catch (e) {
        errors.push({ status: e.status, code: e.code, message: e.message });
      }
    }
    return { first, second, secondMs: Date.now() - t1, errors };
  }, tool);
  log(`bad tool requests: ${JSON.stringify(r.errors.map((e) => e?.message))}`);
  for (const [i, e] of r.errors.entries()) {
    assert.ok(e && e.status === 400 && e.code === 'INVALID_ARGUMENT', `bad request ${i}: ${JSON.stringify(e)}`);
  }
  assert.match(r.errors[0].message, /nope/);
  assert.match(r.errors[1].message, /cannot be combined with tools/);
  assert.match(r.errors[2].message, /name/);
  assert.match(r.errors[3].message, /invalid/i);
  const call = r.first.choices[0].message;
  log(`tool call in ${Date.now() - t0 - r.secondMs} ms (${r.first.usage.completion_tokens} tokens): ${JSON.stringify(call.tool_calls)}; answer in ${r.secondMs} ms: ${JSON.stringify(r.second.choices[0].message.content)}`);
  assert.equal(r.first.choices[0].finish_reason, 'tool_calls');
  assert.equal(call.tool_calls.length, 1);
  assert.equal(call.tool_calls[0].function.name, 'get_weather');
  const args = JSON.parse(call.tool_calls[0].function.arguments);
  const validate = new Ajv().compile(tool.function.parameters);
  assert.ok(validate(args), JSON.stringify(validate.errors));
  // The result went back through the template: a longer prompt, and an answer in text.
  assert.ok(r.second.usage.prompt_tokens > r.first.usage.prompt_tokens);
  assert.ok(['stop', 'length'].includes(r.second.choices[0].finish_reason));
  const m = r.second.choices[0].message;
  assert.ok(typeof m.content === 'string' && m.content.length > 0 && !m.tool_calls, JSON.stringify(m));
});
