// The OpenAI-shaped API (js/openai.js) driven by the official `openai` npm client through
// `engine.fetch`, streaming and not, over a scripted engine (no GPU: this checks the protocol;
// the real model behind the same API is checked in the browser by structured.test.mjs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { addOpenaiApi } from '../../js/openai.js';

/** An engine that answers every prompt with `pieces`, recording the options it was given. */
function scriptedEngine(pieces, finishReason = 'stop', extraStats = {}) {
  const calls = [];
  const stream = (input, options) => {
    calls.push({ input, options });
    let i = 0;
    let stopped = false;
    const stats = { promptTokens: 7, generatedTokens: pieces.length, finishReason, ...extraStats };
    return {
      stats: Promise.resolve(stats),
      stop() {
        stopped = true;
      },
      async next() {
        if (stopped || i >= pieces.length) return { done: true, value: undefined };
        return { done: false, value: { text: pieces[i++], tokenId: i } };
      },
      async return() {
        stopped = true;
        return { done: true, value: undefined };
      },
      [Symbol.asyncIterator]() {
        return this;
      },
      async text() {
        let s = '';
        for await (const t of this) s += t.text;
        return s;
      },
    };
  };
  const engine = {
    calls,
    chat: (m, o) => stream(m, o),
    generate: (p, o) => stream(p, o),
    info: async () => ({ model: { name: 'scripted', architecture: 'gemma3' } }),
  };
  addOpenaiApi(engine, engine.chat);
  return engine;
}

const client = (engine) => new OpenAI({ apiKey: 'unused', baseURL: 'http://cera.local/v1', fetch: engine.fetch, dangerouslyAllowBrowser: true, maxRetries: 0 });

test('openai client: chat completion, not streamed', async () => {
  const engine = scriptedEngine(['{"a"', ': 1}']);
  const r = await client(engine).chat.completions.create({
    model: 'x',
    messages: [{ role: 'developer', content: 'Be terse.' }, { role: 'user', content: [{ type: 'text', text: 'Hi' }] }],
    max_tokens: 16,
    temperature: 0,
    seed: 3,
    stop: '\n\n',
    response_format: { type: 'json_schema', json_schema: { name: 'a', schema: { type: 'object' } } },
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, '{"a": 1}');
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.deepEqual(r.usage, { prompt_tokens: 7, completion_tokens: 2, total_tokens: 9 });
  const { input, options } = engine.calls[0];
  assert.deepEqual(input, [{ role: 'system', content: 'Be terse.' }, { role: 'user', content: 'Hi' }]);
  assert.equal(options.maxTokens, 16);
  assert.equal(options.temperature, 0);
  assert.equal(options.seed, 3);
  assert.deepEqual(options.stop, ['\n\n']);
  assert.deepEqual(options.responseFormat, { type: 'json_schema', json_schema: { name: 'a', schema: { type: 'object' } } });
});

test('openai client: streamed chunks, usage in the last one', async () => {
  const engine = scriptedEngine(['Hel', 'lo', '!'], 'length');
  const stream = await client(engine).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), 'Hello!');
  assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk'));
  const fin = chunks.find((c) => c.choices[0]?.finish_reason);
  assert.equal(fin.choices[0].finish_reason, 'length');
  assert.deepEqual(chunks.at(-1).usage, { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 });
});

test('openai client: completions and models', async () => {
  const engine = scriptedEngine([' Paris', '.']);
  const c = client(engine);
  const r = await c.completions.create({ model: 'x', prompt: 'The capital of France is', max_tokens: 4 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, ' Paris.');
  assert.equal(engine.calls[0].input, 'The capital of France is');
  const s = await c.completions.create({ model: 'x', prompt: 'Hi', stream: true });
  let text = '';
  for await (const chunk of s) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, ' Paris.');
  const models = await c.models.list();
  assert.equal(models.data[0].id, 'scripted');
});

test('openai client: unsupported fields are INVALID_ARGUMENT errors (HTTP 400)', async () => {
  const engine = scriptedEngine(['x']);
  const c = client(engine);
  for (const extra of [{ n: 2 }, { logprobs: true }, { no_such_field: 1 }, { tools: { f: 1 } }]) {
    await assert.rejects(
      c.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], ...extra }),
      (e) => e.status === 400 && e.code === 'INVALID_ARGUMENT' && /not supported|only one|must be an array/.test(e.message),
      JSON.stringify(extra),
    );
  }
  assert.equal(engine.calls.length, 0, 'nothing ran');
  await assert.rejects(engine.chat.completions.create({ messages: [] }), (e) => e.code === 'INVALID_ARGUMENT');
  const r = await engine.fetch('http://cera.local/v1/nothing', { method: 'POST', body: '{}' });
  assert.equal(r.status, 404);
});

const weatherTool = { type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } };
const callText = ['<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>'];
const callStats = { toolCalls: [{ name: 'get_weather', arguments: { city: 'Paris' } }], content: '' };

test('openai client: tool calls, not streamed, and the round trip messages', async () => {
  const engine = scriptedEngine(callText, 'tool_calls', callStats);
  const c = client(engine);
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const r = await c.chat.completions.create({ model: 'x', messages, tools: [weatherTool], tool_choice: 'required' });
  const msg = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(msg.content, null);
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].type, 'function');
  assert.equal(msg.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris' });
  assert.deepEqual(engine.calls[0].options.tools, [weatherTool]);
  assert.equal(engine.calls[0].options.toolChoice, 'required');
  // The call and its result go back as messages; the engine gets them in its own shape.
  await c.chat.completions.create({
    model: 'x',
    messages: [...messages, msg, { role: 'tool', tool_call_id: msg.tool_calls[0].id, content: '{"temp": 21}' }],
    tools: [weatherTool],
  });
  const sent = engine.calls[1].input;
  assert.deepEqual(sent[1], { role: 'assistant', content: '', tool_calls: msg.tool_calls });
  assert.deepEqual(sent[2], { role: 'tool', content: '{"temp": 21}', tool_call_id: msg.tool_calls[0].id });
});

test('openai client: tool calls streamed as delta.tool_calls; plain text with tools still streams', async () => {
  const engine = scriptedEngine(callText, 'tool_calls', callStats);
  const stream = await client(engine).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool], stream: true });
  const chunks = [];
  for await (const ch of stream) chunks.push(ch);
  assert.equal(chunks.map((ch) => ch.choices[0]?.delta?.content ?? '').join(''), '', 'the call is not streamed as text');
  const calls = chunks.flatMap((ch) => ch.choices[0]?.delta?.tool_calls ?? []);
  assert.ok(calls.every((c) => c.index === 0));
  assert.equal(calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(calls.map((c) => c.function.arguments).join('')), { city: 'Paris' });
  assert.equal(chunks.find((ch) => ch.choices[0]?.finish_reason).choices[0].finish_reason, 'tool_calls');
  // The openai helper that accumulates a stream agrees.
  const engine2 = scriptedEngine(callText, 'tool_calls', callStats);
  const runner = client(engine2).chat.completions.stream({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool] });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.tool_calls[0].function.name, 'get_weather');

  const text = scriptedEngine(['Sun', 'ny.'], 'stop', { toolCalls: [], content: 'Sunny.' });
  const s2 = await client(text).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool], stream: true });
  const pieces = [];
  for await (const ch of s2) if (ch.choices[0]?.delta?.content) pieces.push(ch.choices[0].delta.content);
  assert.deepEqual(pieces, ['Sun', 'ny.'], 'text that cannot open a call is not held back');
});

/** The `delta.tool_calls` entries of a stream, in order. */
async function toolDeltas(engine, body = {}) {
  const stream = await client(engine).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool], stream: true, ...body });
  const out = [];
  for await (const ch of stream) {
    assert.equal(ch.choices[0]?.delta?.content ?? '', '', 'no call text as content');
    out.push(...(ch.choices[0]?.delta?.tool_calls ?? []));
  }
  return out;
}

test('openai client: a call\'s arguments stream as they are written, the first delta naming the call', async () => {
  // Two calls in Qwen's syntax, cut at awkward places (inside the head, a key, a string holding
  // a brace and an escaped quote, between the calls).
  const pieces = ['<tool', '_call>\n{"name": "get', '_weather", "argu', 'ments": {"ci', 'ty": "Pa{r\\"is"', ', "days": [1, ', '2]}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": ', '{"city": "Oslo"}', '}\n</tool_call>'];
  const toolCalls = [
    { name: 'get_weather', arguments: { city: 'Pa{r"is', days: [1, 2] } },
    { name: 'get_weather', arguments: { city: 'Oslo' } },
  ];
  const deltas = await toolDeltas(scriptedEngine(pieces, 'tool_calls', { toolCalls, content: '' }));
  for (const [i, want] of toolCalls.entries()) {
    const mine = deltas.filter((d) => d.index === i);
    assert.equal(mine[0].type, 'function');
    assert.match(mine[0].id, /^call-/);
    assert.equal(mine[0].function.name, 'get_weather');
    assert.equal(mine[0].function.arguments, '');
    assert.ok(mine.slice(1).every((d) => d.id === undefined && d.function.name === undefined), JSON.stringify(mine));
    assert.deepEqual(JSON.parse(mine.map((d) => d.function.arguments).join('')), want.arguments);
  }
  // The first call's arguments came in four pieces, as generated (not one delta at the end).
  assert.equal(deltas.filter((d) => d.index === 0).length, 5, JSON.stringify(deltas));
  assert.notEqual(deltas[0].id, deltas.find((d) => d.index === 1).id);
  // The openai helper that accumulates a stream puts them back together.
  const runner = client(scriptedEngine(pieces, 'tool_calls', { toolCalls, content: '' })).chat.completions.stream({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool] });
  const final = await runner.finalChatCompletion();
  assert.deepEqual(
    final.choices[0].message.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
    toolCalls.map((c) => [c.name, c.arguments]),
  );

  // Llama's bare JSON ("parameters") streams the same way.
  const llama = await toolDeltas(scriptedEngine(['{"name": "get_weather", "parameters": {"city"', ': "Rome"}}'], 'tool_calls', { toolCalls: [{ name: 'get_weather', arguments: { city: 'Rome' } }], content: '' }));
  assert.deepEqual(llama.map((d) => d.function.arguments), ['', '{"city"', ': "Rome"}']);

  // A call the streamer cannot follow (LFM2's Python-style list; arguments written as a string)
  // still arrives whole at the end, each once.
  const lfm = await toolDeltas(scriptedEngine(['[get_weather(city=', '"Rome")]'], 'tool_calls', { toolCalls: [{ name: 'get_weather', arguments: { city: 'Rome' } }], content: '' }));
  assert.equal(lfm.length, 1);
  assert.deepEqual([lfm[0].index, lfm[0].function.name, JSON.parse(lfm[0].function.arguments)], [0, 'get_weather', { city: 'Rome' }]);
  const str = await toolDeltas(scriptedEngine(['<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}\n</tool_call>'], 'tool_calls', { toolCalls: [{ name: 'get_weather', arguments: { city: 'Rome' } }], content: '' }));
  assert.equal(str.length, 2, JSON.stringify(str));
  assert.equal(str[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(str[1].function.arguments), { city: 'Rome' });
  assert.equal(str[1].index, 0);

  // Free text that merely begins with a brace is text: no call delta, the whole text as content.
  const brace = ['{"name": "x", "arguments": ', '{"a": 1}} is JSON.'];
  const s3 = await client(scriptedEngine(brace, 'stop', { toolCalls: [], content: brace.join('') })).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool], stream: true });
  let content = '';
  for await (const ch of s3) {
    assert.equal(ch.choices[0]?.delta?.tool_calls, undefined);
    content += ch.choices[0]?.delta?.content ?? '';
  }
  assert.equal(content, brace.join(''));
});

test('openai client: text, then calls (tool_choice auto): the text streams as content, then the calls', async () => {
  // Qwen's syntax after a sentence, the marker cut in two.
  const pieces = ['Let me ', 'look that up.\n<tool', '_call>\n{"name": "get_weather", "arguments": {"city": ', '"Paris"}}\n</tool_call>'];
  const stats = { toolCalls: [{ name: 'get_weather', arguments: { city: 'Paris' } }], content: 'Let me look that up.' };
  const stream = await client(scriptedEngine(pieces, 'tool_calls', stats)).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool], stream: true });
  const kinds = [];
  let content = '';
  const calls = [];
  let finish = null;
  for await (const ch of stream) {
    const d = ch.choices[0]?.delta ?? {};
    if (d.content) {
      kinds.push('content');
      content += d.content;
    }
    if (d.tool_calls) {
      kinds.push('call');
      calls.push(...d.tool_calls);
    }
    finish = ch.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(content, 'Let me look that up.', 'the text once, without the call');
  assert.equal(kinds[0], 'content', 'the text streams as it is written, before the end');
  assert.equal(kinds.lastIndexOf('content'), kinds.indexOf('call') - 1, `content deltas, then call deltas: ${kinds}`);
  assert.equal(calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(calls.map((c) => c.function.arguments).join('')), { city: 'Paris' });
  assert.equal(finish, 'tool_calls');
  // The openai helper that accumulates a stream, and the answer not streamed.
  const runner = client(scriptedEngine(pieces, 'tool_calls', stats)).chat.completions.stream({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool] });
  const final = await runner.finalChatCompletion();
  assert.equal(final.choices[0].message.content, 'Let me look that up.');
  assert.equal(final.choices[0].message.tool_calls.length, 1);
  const whole = await client(scriptedEngine(pieces, 'tool_calls', stats)).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool] });
  assert.equal(whole.choices[0].message.content, 'Let me look that up.');
  assert.equal(whole.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(JSON.parse(whole.choices[0].message.tool_calls[0].function.arguments), { city: 'Paris' });

  // LFM2: its markers are control tokens, streamed as their text; the list arrives whole.
  const lfm = ['Checking.', '<|tool_call_start|>', '[get_weather(city="Rome")]', '<|tool_call_end|>'];
  const s2 = await client(scriptedEngine(lfm, 'tool_calls', { toolCalls: [{ name: 'get_weather', arguments: { city: 'Rome' } }], content: 'Checking.' })).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool], stream: true });
  let text2 = '';
  const calls2 = [];
  for await (const ch of s2) {
    text2 += ch.choices[0]?.delta?.content ?? '';
    calls2.push(...(ch.choices[0]?.delta?.tool_calls ?? []));
  }
  assert.equal(text2, 'Checking.');
  assert.deepEqual(calls2.map((c) => [c.index, c.function.name, JSON.parse(c.function.arguments)]), [[0, 'get_weather', { city: 'Rome' }]]);

  // Text that only looks like the start of a marker is held until it is not one, then sent.
  const s3 = await client(scriptedEngine(['See the <tool', 's> page.'], 'stop', { toolCalls: [], content: 'See the <tools> page.' })).chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Hi' }], tools: [weatherTool], stream: true });
  const parts = [];
  for await (const ch of s3) {
    assert.equal(ch.choices[0]?.delta?.tool_calls, undefined);
    if (ch.choices[0]?.delta?.content) parts.push(ch.choices[0].delta.content);
  }
  assert.deepEqual(parts, ['See the', ' <tools> page.']);
});
