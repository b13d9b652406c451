// The OpenAI-shaped API over an Engine or WorkerEngine: `chat.completions.create`,
// `completions.create`, `models.list`, and a `fetch` that answers `/v1/chat/completions`,
// `/v1/completions` and `/v1/models` in the page (server-sent events when streaming), so the
// official `openai` client and other OpenAI-compatible SDKs talk to the engine with no server.
//
// Requests are checked field by field: anything this engine cannot honour (n > 1, logprobs,
// ...) is an `INVALID_ARGUMENT`, never silently ignored.
//
// Tools: `tools` / `tool_choice` go to the engine's chat, which renders them with the model's
// template, constrains the call's arguments to the tool's JSON Schema and parses the call back
// (`stats.toolCalls`); here they become OpenAI's `message.tool_calls` / `delta.tool_calls`.

function invalid(message) {
  const e = new Error(message);
  e.name = 'CeraError';
  e.code = 'INVALID_ARGUMENT';
  return e;
}

// Fields accepted and what they become; the `null`s are accepted and have no effect here.
const COMMON = {
  model: null, // one model per engine: any name is taken to mean it
  stream: null,
  stream_options: null,
  max_tokens: 'maxTokens',
  max_completion_tokens: 'maxTokens',
  temperature: 'temperature',
  top_p: 'topP',
  top_k: 'topK',
  min_p: 'minP',
  seed: 'seed',
  stop: 'stop',
  frequency_penalty: 'frequencyPenalty',
  presence_penalty: 'presencePenalty',
  repeat_penalty: 'repeatPenalty',
  user: null,
  n: null,
  logprobs: null,
  metadata: null,
  store: null,
};
const CHAT_FIELDS = { ...COMMON, messages: null, response_format: 'responseFormat', tools: 'tools', tool_choice: 'toolChoice', parallel_tool_calls: null };
const COMPLETION_FIELDS = { ...COMMON, prompt: null, echo: null, suffix: null };

let counter = 0;
const newId = (prefix) => `${prefix}-${Date.now().toString(36)}${(counter++).toString(36)}`;
const nowS = () => Math.floor(Date.now() / 1000);

/** OpenAI request fields -> `generate`/`chat` options (throws INVALID_ARGUMENT on the rest). */
function toOptions(body, allowed, what) {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw invalid(`${what}: the request must be an object`);
  const opts = { temperature: 1, topP: 1, topK: 0, minP: 0 }; // OpenAI's defaults: plain sampling at T = 1
  for (const [k, v] of Object.entries(body)) {
    if (!(k in allowed)) throw invalid(`${what}: '${k}' is not supported by this engine`);
    if (v === undefined || v === null) continue;
    if (k === 'n' && v !== 1) throw invalid(`${what}: n = ${v}: only one choice per request`);
    if (k === 'logprobs' && v !== false) throw invalid(`${what}: logprobs are not supported`);
    if (k === 'echo' && v !== false) throw invalid(`${what}: echo is not supported`);
    if (k === 'suffix') throw invalid(`${what}: suffix (fill in the middle) is not supported`);
    if (k === 'tools' && !Array.isArray(v)) throw invalid(`${what}: tools must be an array`);
    if (k === 'stream_options' && (typeof v !== 'object' || Object.keys(v).some((o) => o !== 'include_usage'))) throw invalid(`${what}: stream_options takes only include_usage`);
    const name = allowed[k];
    if (!name) continue;
    if (k === 'stop') opts.stop = typeof v === 'string' ? [v] : v;
    else opts[name] = v;
  }
  if (opts.temperature === 0) opts.topK = 1;
  return opts;
}

/** OpenAI message content (a string or text parts) -> the engine's `{role, content}`. */
function toMessages(messages) {
  if (!Array.isArray(messages) || !messages.length) throw invalid('chat.completions: messages must be a non-empty array');
  return messages.map((m, i) => {
    if (!m || typeof m.role !== 'string') throw invalid(`chat.completions: messages[${i}] needs a role`);
    let content = m.content ?? '';
    if (Array.isArray(content)) {
      content = content
        .map((p, j) => {
          if (p?.type !== 'text') throw invalid(`chat.completions: messages[${i}].content[${j}]: only text parts are supported`);
          return p.text;
        })
        .join('');
    }
    if (typeof content !== 'string') throw invalid(`chat.completions: messages[${i}].content must be a string or text parts`);
    const role = m.role === 'developer' ? 'system' : m.role;
    const out = { role, content };
    if (m.tool_calls != null) {
      if (!Array.isArray(m.tool_calls)) throw invalid(`chat.completions: messages[${i}].tool_calls must be an array`);
      out.tool_calls = m.tool_calls;
    }
    if (m.tool_call_id != null) out.tool_call_id = String(m.tool_call_id);
    if (m.name != null) out.name = String(m.name);
    return out;
  });
}

const finishReason = (r) => (r === 'length' || r === 'tool_calls' ? r : 'stop');

/** The engine's parsed calls -> OpenAI's `tool_calls` (arguments as a JSON string). */
const toolCallsOf = (calls) =>
  calls.map((c) => ({ id: newId('call'), type: 'function', function: { name: c.name, arguments: JSON.stringify(c.arguments ?? {}) } }));

// What opens a call, per syntax: Qwen's <tool_call>, the fenced block, Llama 3.1's
// <|python_tag|>, LFM2's list marker (markers that are control tokens are streamed as their
// text). With tool_choice 'auto' a call may follow text: the text streams as content up to the
// marker, and from the marker on the answer is calls.
const CALL_MARKERS = ['<tool_call>', '```tool_call', '<|python_tag|>', '<|tool_call_start|>'];
// Calls without a marker, only as the whole answer: Llama's bare JSON, LFM2's bare list.
const BARE_OPENERS = ['{', '['];

/**
 * Text that is not a call yet: `send` may go out as content, `keep` is held (it may be the start
 * of a marker, or whitespace that the content loses when a call follows), `call` is the text
 * from the first marker on (null when there is none).
 */
function splitText(text) {
  const at = Math.min(...CALL_MARKERS.map((m) => text.indexOf(m)).filter((i) => i >= 0));
  if (Number.isFinite(at)) return { send: text.slice(0, at).trimEnd(), keep: '', call: text.slice(at) };
  let cut = text.length;
  for (let i = Math.max(0, text.length - Math.max(...CALL_MARKERS.map((m) => m.length)) + 1); i < text.length; i++) {
    if (CALL_MARKERS.some((m) => m.startsWith(text.slice(i)))) {
      cut = i;
      break;
    }
  }
  while (cut > 0 && /\s/.test(text[cut - 1])) cut--;
  return { send: text.slice(0, cut), keep: text.slice(cut), call: null };
}

// A JSON call's head, `{"name": "f", "arguments": ` (Llama's key is "parameters"), anywhere after
// the opener; the engine's grammar writes the name first.
const CALL_HEAD = /\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*/y;

/**
 * Streams the calls of a held answer as OpenAI does: a call's first delta carries its index, id,
 * type and name (arguments ''), then each piece of its arguments object goes out as the model
 * writes it (`{index, function: {arguments}}`). Works on the JSON syntaxes (Qwen, the fenced
 * block, Llama); a call it cannot follow (LFM2's Python-style list, arguments written as a
 * string) is sent whole at the end from the engine's parse, as are calls it never saw open.
 */
class CallStream {
  constructor() {
    this.text = '';
    this.pos = 0; // where scanning resumes in `text`
    this.count = 0; // calls opened so far
    this.args = null; // in a call's arguments: {depth, str, esc}
    this.lost = false; // stopped following (text it cannot read as a JSON call)
    this.unsent = null; // the index of an opened call whose arguments did not go out
  }

  /** Add generated text; returns the `delta.tool_calls` entries it completes. */
  push(piece) {
    this.text += piece;
    const out = [];
    while (!this.lost) {
      if (!this.args) {
        const start = this.text.indexOf('{', this.pos);
        if (start < 0) break;
        CALL_HEAD.lastIndex = start;
        const m = CALL_HEAD.exec(this.text);
        // Not a head (yet): wait for more text. A call never recognized goes out whole at the end.
        if (!m) break;
        if (this.text.length === CALL_HEAD.lastIndex) {
          // The value has not begun: the head may still grow (more spaces), wait.
          break;
        }
        // Only what the engine will parse as a call: after a call marker, or bare JSON with Llama's
        // own "parameters" (free text may begin with a brace, but never with Llama's call).
        const lead = this.text.trimStart();
        const marked = ['<tool_call>', '```tool_call', '<|python_tag|>'].some((o) => lead.startsWith(o));
        if (!marked && !/"parameters"\s*:\s*$/.test(m[0])) {
          this.lost = true;
          break;
        }
        out.push({ index: this.count, id: newId('call'), type: 'function', function: { name: JSON.parse(m[1]), arguments: '' } });
        this.count++;
        this.pos = CALL_HEAD.lastIndex;
        if (this.text[this.pos] !== '{') {
          // Arguments as a JSON string, or not an object: the end-of-answer parse sends them.
          this.lost = true;
          this.unsent = this.count - 1;
          break;
        }
        this.args = { depth: 0, str: false, esc: false };
      }
      const a = this.args;
      let i = this.pos;
      for (; i < this.text.length; i++) {
        const c = this.text[i];
        if (a.str) {
          if (a.esc) a.esc = false;
          else if (c === '\\') a.esc = true;
          else if (c === '"') a.str = false;
        } else if (c === '"') a.str = true;
        else if (c === '{' || c === '[') a.depth++;
        else if ((c === '}' || c === ']') && --a.depth === 0) {
          i++;
          this.args = null;
          break;
        }
      }
      if (i > this.pos) out.push({ index: this.count - 1, function: { arguments: this.text.slice(this.pos, i) } });
      this.pos = i;
      if (this.args) break;
    }
    return out;
  }
}
const usageOf = (s) => ({ prompt_tokens: s.promptTokens, completion_tokens: s.generatedTokens, total_tokens: s.promptTokens + s.generatedTokens });

async function modelName(engine) {
  try {
    const info = await engine.info();
    return info?.model?.name || info?.model?.architecture || 'cera-web';
  } catch {
    return 'cera-web';
  }
}

/** The OpenAI-shaped API of `engine` (an Engine or WorkerEngine). */
export function openaiApi(engine) {
  async function run(kind, body) {
    const fields = kind === 'chat' ? CHAT_FIELDS : COMPLETION_FIELDS;
    const what = kind === 'chat' ? 'chat.completions' : 'completions';
    const opts = toOptions(body, fields, what);
    const model = body.model || (await modelName(engine));
    let stream;
    if (kind === 'chat') {
      stream = engine.chat(toMessages(body.messages), opts);
    } else {
      if (typeof body.prompt !== 'string') throw invalid('completions: prompt must be a string');
      stream = engine.generate(body.prompt, opts);
    }
    return { stream, model, id: newId(kind === 'chat' ? 'chatcmpl' : 'cmpl'), created: nowS() };
  }

  async function chatCreate(body) {
    const { stream, model, id, created } = await run('chat', body);
    if (body.stream) {
      const tools = Array.isArray(body.tools) && body.tools.length > 0 && body.tool_choice !== 'none';
      return chunks('chat', stream, { model, id, created, includeUsage: !!body.stream_options?.include_usage, tools });
    }
    const text = await stream.text();
    const s = await stream.stats;
    const message = { role: 'assistant', content: text, refusal: null };
    if (s.toolCalls?.length) {
      message.content = s.content || null;
      message.tool_calls = toolCallsOf(s.toolCalls);
    }
    return {
      id,
      object: 'chat.completion',
      created,
      model,
      choices: [{ index: 0, message, logprobs: null, finish_reason: finishReason(s.finishReason) }],
      usage: usageOf(s),
    };
  }

  async function completionCreate(body) {
    const { stream, model, id, created } = await run('completion', body);
    if (body.stream) return chunks('completion', stream, { model, id, created, includeUsage: !!body.stream_options?.include_usage });
    const text = await stream.text();
    const s = await stream.stats;
    return {
      id,
      object: 'text_completion',
      created,
      model,
      choices: [{ index: 0, text, logprobs: null, finish_reason: finishReason(s.finishReason) }],
      usage: usageOf(s),
    };
  }

  async function modelsList() {
    const id = await modelName(engine);
    return { object: 'list', data: [{ id, object: 'model', created: 0, owned_by: 'cera-web' }] };
  }

  const api = {
    chat: { completions: { create: chatCreate } },
    completions: { create: completionCreate },
    models: { list: modelsList },
    fetch: (input, init) => openaiFetch(api, input, init),
  };
  return api;
}

/** Stream chunks in OpenAI's shapes (an async iterable; `controller`-less, like the SDK's). */
function chunks(kind, stream, { model, id, created, includeUsage, tools = false }) {
  const chat = kind === 'chat';
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const base = () => ({ id, object, created, model });
  const choice = (text, finish) =>
    chat ? { index: 0, delta: text === null ? {} : { content: text }, logprobs: null, finish_reason: finish } : { index: 0, text: text ?? '', logprobs: null, finish_reason: finish };
  async function* gen() {
    if (chat) yield { ...base(), choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] };
    // With tools the answer is text, then calls (or calls alone). `mode`: 'start' while the
    // opening may still be a call, 'text' once it is text (marker-free text streams as content,
    // see splitText), 'call' from a marker on and 'bare' for a call without one (both go to the
    // call streamer, which sends a call's pieces as they are written).
    let mode = tools ? 'start' : 'plain';
    let held = '';
    let sent = '';
    const calls = tools ? new CallStream() : null;
    const callChunk = (entries) => ({ ...base(), choices: [{ index: 0, delta: { tool_calls: entries }, logprobs: null, finish_reason: null }] });
    const textChunk = (text) => {
      sent += text;
      return { ...base(), choices: [choice(text, null)] };
    };
    try {
      for await (const t of stream) {
        if (!t.text) continue;
        if (mode === 'plain') {
          yield textChunk(t.text);
          continue;
        }
        if (mode === 'call' || mode === 'bare') {
          if (mode === 'bare') held += t.text;
          for (const entry of calls.push(t.text)) yield callChunk([entry]);
          continue;
        }
        held += t.text;
        if (mode === 'start') {
          const lead = held.trimStart();
          if (lead === '' || CALL_MARKERS.some((m) => m.startsWith(lead))) continue;
          if (BARE_OPENERS.some((o) => lead.startsWith(o))) {
            mode = 'bare';
            for (const entry of calls.push(held)) yield callChunk([entry]);
            continue;
          }
          mode = 'text';
        }
        const { send, keep, call } = splitText(held);
        if (send) yield textChunk(send);
        held = keep;
        if (call !== null) {
          mode = 'call';
          for (const entry of calls.push(call)) yield callChunk([entry]);
        }
      }
    } finally {
      stream.stop();
    }
    const s = await stream.stats;
    // The content the stream has not sent yet: the engine's parse is the reference (held text
    // of a plain answer, the text of a call that did not parse, ...).
    const content = typeof s.content === 'string' ? s.content : sent + held;
    if (content.startsWith(sent) && content.length > sent.length) yield textChunk(content.slice(sent.length));
    if (s.toolCalls?.length) {
      // What the streamer did not send: the arguments of a call it opened but could not follow,
      // and every call after it, whole.
      if (calls.unsent !== null && s.toolCalls[calls.unsent]) {
        yield callChunk([{ index: calls.unsent, function: { arguments: JSON.stringify(s.toolCalls[calls.unsent].arguments ?? {}) } }]);
      }
      const rest = toolCallsOf(s.toolCalls.slice(calls.count)).map((c, k) => ({ index: calls.count + k, ...c }));
      if (rest.length) yield callChunk(rest);
    }
    yield { ...base(), choices: [choice(null, finishReason(s.finishReason))], ...(includeUsage ? {} : { usage: usageOf(s) }) };
    if (includeUsage) yield { ...base(), choices: [], usage: usageOf(s) };
  }
  const it = gen();
  it.stop = () => stream.stop();
  return it;
}

const json = (status, value) => new Response(JSON.stringify(value), { status, headers: { 'content-type': 'application/json' } });

function errorResponse(e) {
  const code = e?.code || 'INTERNAL';
  const status = code === 'INVALID_ARGUMENT' || code === 'CONTEXT_FULL' ? 400 : 500;
  return json(status, { error: { message: String(e?.message ?? e), type: status === 400 ? 'invalid_request_error' : 'server_error', param: null, code } });
}

/** A `fetch` answering the OpenAI REST paths with `api`. */
async function openaiFetch(api, input, init = {}) {
  const req = input instanceof Request ? input : null;
  const url = new URL(req ? req.url : String(input), 'http://cera.local/');
  const method = (init.method || req?.method || 'GET').toUpperCase();
  const path = url.pathname.replace(/\/+$/, '');
  try {
    if (path.endsWith('/models')) {
      if (method !== 'GET') return json(405, { error: { message: `${method} ${path}: use GET`, type: 'invalid_request_error' } });
      return json(200, await api.models.list());
    }
    const chat = path.endsWith('/chat/completions');
    if (!chat && !path.endsWith('/completions')) return json(404, { error: { message: `no route for ${path}`, type: 'invalid_request_error', code: 'NOT_FOUND' } });
    if (method !== 'POST') return json(405, { error: { message: `${method} ${path}: use POST`, type: 'invalid_request_error' } });
    let text = init.body ?? (req ? await req.text() : '');
    if (typeof text !== 'string') text = await new Response(text).text();
    let body;
    try {
      body = JSON.parse(text);
    } catch (e) {
      throw invalid(`the request body is not JSON: ${e.message}`);
    }
    const result = chat ? await api.chat.completions.create(body) : await api.completions.create(body);
    if (!body.stream) return json(200, result);
    const enc = new TextEncoder();
    const sse = new ReadableStream({
      async pull(controller) {
        try {
          const { value, done } = await result.next();
          if (done) {
            controller.enqueue(enc.encode('data: [DONE]\n\n'));
            controller.close();
          } else {
            controller.enqueue(enc.encode(`data: ${JSON.stringify(value)}\n\n`));
          }
        } catch (e) {
          controller.enqueue(enc.encode(`data: ${JSON.stringify({ error: { message: String(e?.message ?? e), code: e?.code || 'INTERNAL' } })}\n\n`));
          controller.close();
        }
      },
      cancel() {
        result.return?.();
      },
    });
    init.signal?.addEventListener('abort', () => result.stop(), { once: true });
    return new Response(sse, { status: 200, headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' } });
  } catch (e) {
    return errorResponse(e);
  }
}

/**
 * Give `engine` the OpenAI-shaped API: `chat.completions.create`, `completions.create`,
 * `models.list` and `fetch` (for `new OpenAI({fetch: engine.fetch, ...})`). `engine.chat` stays
 * callable as before.
 */
export function addOpenaiApi(engine, chatMethod) {
  const api = openaiApi(engine);
  engine.chat = Object.assign((messages, options) => chatMethod.call(engine, messages, options), { completions: api.chat.completions });
  engine.completions = api.completions;
  engine.models = api.models;
  engine.fetch = api.fetch;
}
