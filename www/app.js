// The demo: load a GGUF model (served here, a URL or a local file) into a worker engine, chat
// with streaming tokens, watch speed and context use. Query: ?autoload=1 loads the default model;
// ?debug=1 counts live GPU buffers in the worker; ?context=N and ?nkeep=N preset the settings.
import { createWorkerEngine, gpuSelfCheck, init } from '/js/index.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const DEFAULT_MODEL = '/models/gemma-3-270m-q4_k_m.gguf';

const demo = {
  engine: null,
  state: 'starting',
  messages: [],
  lastStats: null,
  shifts: 0,
  stream: null,
  loadAbort: null,
  progress: null,
};
window.demo = demo;

function setState(s) {
  demo.state = s;
  document.body.dataset.state = s;
  const ready = s === 'ready';
  $('input').disabled = !ready && s !== 'generating';
  $('send').disabled = !ready;
  $('stop').disabled = s !== 'generating';
  $('clear').disabled = !ready;
  $('load').disabled = s === 'loading' || s === 'generating' || s === 'no-webgpu';
  $('cancel-load').hidden = s !== 'loading';
}

const mb = (b) => (b / 1e6).toFixed(1);
const num = (id) => Number($(id).value);
const fmtRate = (r) => (r > 0 ? (r >= 10 ? r.toFixed(0) : r.toFixed(2)) : '–');

function fill(dl, entries) {
  dl.replaceChildren();
  for (const [k, v] of entries) {
    const dt = document.createElement('dt');
    dt.textContent = k;
    const dd = document.createElement('dd');
    dd.textContent = v;
    dl.append(dt, dd);
  }
}

function showProgress(p, t0) {
  demo.progress = p;
  const secs = (performance.now() - t0) / 1000;
  const pct = p.totalBytes ? (100 * p.loadedBytes) / p.totalBytes : 0;
  $('progress-bar').style.width = `${pct.toFixed(1)}%`;
  document.body.dataset.progress = pct.toFixed(1);
  const rate = secs > 0 ? p.loadedBytes / 1e6 / secs : 0;
  const phase = { gpu: 'opening the GPU', header: 'reading the header', weights: 'uploading weights', done: 'weights on the GPU', model: 'preparing kernels', ready: 'ready' }[p.phase] ?? p.phase;
  const from = p.origin === 'cache' ? ' from the browser cache' : '';
  $('progress-text').textContent =
    `${phase}${from} · ${mb(p.loadedBytes)}${p.totalBytes ? ` / ${mb(p.totalBytes)}` : ''} MB · ${rate.toFixed(1)} MB/s` +
    (p.tensorsTotal ? ` · ${p.tensorsLoaded}/${p.tensorsTotal} tensors` : '');
}

function updateContext(nPast, contextSize, shifts) {
  $('ctx-bar').style.width = `${contextSize ? Math.min(100, (100 * nPast) / contextSize) : 0}%`;
  $('ctx-text').textContent = `${nPast} / ${contextSize} tokens`;
  $('shift-count').textContent = String(shifts);
}

function selectedSource() {
  const kind = document.querySelector('input[name=source]:checked').value;
  if (kind === 'url') return $('model-url').value.trim();
  if (kind === 'file') {
    const f = $('model-file').files[0];
    if (!f) throw Object.assign(new Error('choose a .gguf file first'), { code: 'INVALID_ARGUMENT' });
    return f;
  }
  return DEFAULT_MODEL;
}

async function loadModel(options = {}) {
  const t0 = performance.now();
  setState('loading');
  demo.loadAbort = new AbortController();
  try {
    await demo.engine?.dispose();
    demo.engine = null;
    const source = options.source ?? selectedSource();
    const engine = await createWorkerEngine(source, {
      cache: options.cache ?? $('use-cache').checked,
      contextSize: options.contextSize ?? num('context-size'),
      nKeep: options.nKeep ?? num('n-keep'),
      signal: demo.loadAbort.signal,
      debugBuffers: params.has('debug'),
      onProgress: (p) => showProgress(p, t0),
    });
    demo.engine = engine;
    const info = await engine.info();
    demo.info = info;
    demo.loadMs = performance.now() - t0;
    $('progress-bar').style.width = '100%';
    document.body.dataset.progress = '100';
    $('progress-text').textContent =
      `Ready in ${(demo.loadMs / 1000).toFixed(1)} s · ${mb(info.load.bytes)} MB ${info.load.origin === 'cache' ? 'from the browser cache' : `from ${info.load.origin}`}` +
      (info.load.resumes ? ` · resumed ${info.load.resumes}×` : '');
    fill($('model-info'), [
      ['model', `${info.model.name ?? '(unnamed)'} · ${info.model.architecture}`],
      ['shape', `${info.model.nLayer} layers · ${info.model.nEmbd} wide · vocab ${info.model.nVocab}`],
      ['GPU memory', `${mb(info.memory.weightsGpuBytes)} MB in ${info.memory.buffers} buffers`],
      ['chat template', info.model.chatTemplate ?? 'none'],
      ['wasm heap', `${mb(info.load.peakWasmHeapBytes)} MB`],
    ]);
    $('adapter-badge').hidden = false;
    $('adapter-badge').textContent = `${info.adapter.backend} · ${info.adapter.deviceType}${info.adapter.name ? ` · ${info.adapter.name}` : ''}`;
    demo.shifts = 0;
    updateContext(0, info.contextSize, 0);
    newChat();
    setState('ready');
    return info;
  } catch (e) {
    $('progress-bar').style.width = '0%';
    $('progress-text').textContent = `${e.code ?? 'ERROR'}: ${e.message}`;
    demo.lastError = e;
    setState(e.code === 'NO_WEBGPU' ? 'no-webgpu' : 'idle');
    if (e.code === 'NO_WEBGPU') showNoWebGPU(e.message);
    throw e;
  } finally {
    demo.loadAbort = null;
  }
}

function newChat() {
  demo.messages = [];
  $('messages').replaceChildren();
  demo.engine?.reset();
}

function bubble(role, text) {
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  div.textContent = text;
  $('messages').append(div);
  $('messages').scrollTop = $('messages').scrollHeight;
  return div;
}

async function send(text, overrides = {}) {
  if (!demo.engine || demo.state !== 'ready') return null;
  const raw = document.querySelector('input[name=mode]:checked').value === 'raw' || overrides.raw;
  setState('generating');
  const opts = {
    temperature: overrides.temperature ?? num('temperature'),
    topK: num('top-k'),
    topP: num('top-p'),
    maxTokens: overrides.maxTokens ?? num('max-tokens'),
  };
  let out;
  if (raw) {
    out = bubble('assistant', text);
  } else {
    bubble('user', text);
    demo.messages.push({ role: 'user', content: text });
    out = bubble('assistant', '');
  }
  out.classList.add('streaming');
  const stream = raw ? demo.engine.generate(text, opts) : demo.engine.chat(demo.messages, opts);
  demo.stream = stream;
  const before = await demo.engine.nPast();
  let reply = '';
  let n = 0;
  let tFirst = 0;
  try {
    for await (const t of stream) {
      reply += t.text;
      n++;
      if (n === 1) tFirst = performance.now();
      else $('decode-rate').textContent = fmtRate((n - 1) / ((performance.now() - tFirst) / 1000));
      out.textContent = raw ? text + reply : reply;
      updateContext(Math.min(before + n, demo.info.contextSize), demo.info.contextSize, demo.shifts);
      $('messages').scrollTop = $('messages').scrollHeight;
    }
    const s = await stream.stats;
    demo.lastStats = s;
    demo.shifts = s.totalContextShifts;
    $('prefill-rate').textContent = fmtRate(s.prefillTokS);
    $('decode-rate').textContent = fmtRate(s.decodeTokS);
    updateContext(s.nPast, s.contextSize, s.totalContextShifts);
    if (!raw) demo.messages.push({ role: 'assistant', content: reply });
    const meta = document.createElement('span');
    meta.className = 'meta';
    meta.textContent = `${s.generatedTokens} tokens · ${s.finishReason}${s.reusedTokens ? ` · ${s.reusedTokens} prompt tokens reused` : ''}${s.contextShifts ? ` · ${s.contextShifts} context shifts` : ''}`;
    out.append(meta);
    return { text: reply, stats: s };
  } catch (e) {
    out.classList.add('error');
    out.textContent = `${e.code ?? 'ERROR'}: ${e.message}`;
    demo.lastError = e;
    return { error: { code: e.code, message: e.message } };
  } finally {
    out.classList.remove('streaming');
    demo.stream = null;
    setState(demo.engine ? 'ready' : 'idle');
  }
}

function stop() {
  demo.stream?.stop();
}

function showNoWebGPU(msg) {
  $('nowebgpu').hidden = false;
  $('nowebgpu-msg').textContent = msg;
  $('model-card').classList.add('disabled');
  setState('no-webgpu');
}

async function selfCheck() {
  const status = $('status');
  $('rerun').disabled = true;
  status.className = 'status small';
  status.textContent = 'Running the kv_shift kernel on your GPU…';
  try {
    await init();
    const t0 = performance.now();
    const report = await gpuSelfCheck();
    const ms = performance.now() - t0;
    const l = report.limits;
    fill($('limits'), Object.entries(l).map(([k, v]) => [k, String(v)]));
    const tbody = $('cases').querySelector('tbody');
    tbody.replaceChildren();
    for (const c of report.cases) {
      const tr = document.createElement('tr');
      tr.innerHTML = `<td></td><td>${c.maxAbsError.toExponential(2)}</td><td class="${c.passed ? 'pass' : 'fail'}">${c.passed ? 'pass' : 'FAIL'}</td>`;
      tr.firstChild.textContent = c.name;
      tbody.append(tr);
    }
    status.className = report.passed ? 'status small ok' : 'status small bad';
    status.textContent = report.passed ? `Passed in ${ms.toFixed(0)} ms.` : 'FAILED: see the table.';
    document.body.dataset.selfcheck = report.passed ? 'pass' : 'fail';
  } catch (e) {
    status.className = 'status small bad';
    status.textContent = `${e.code ?? 'ERROR'}: ${e.message}`;
    document.body.dataset.selfcheck = e.code === 'NO_WEBGPU' ? 'no-webgpu' : 'error';
  } finally {
    $('rerun').disabled = false;
  }
}

Object.assign(demo, { loadModel, send, stop, newChat, selfCheck });

$('load').onclick = () => loadModel().catch(() => {});
$('cancel-load').onclick = () => demo.loadAbort?.abort();
$('stop').onclick = stop;
$('clear').onclick = () => {
  newChat();
  updateContext(0, demo.info?.contextSize ?? 0, demo.shifts);
};
$('rerun').onclick = selfCheck;
$('composer').onsubmit = (e) => {
  e.preventDefault();
  const text = $('input').value.trim();
  if (!text) return;
  $('input').value = '';
  send(text);
};
$('input').onkeydown = (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    $('composer').requestSubmit();
  }
};
if (params.has('context')) $('context-size').value = params.get('context');
if (params.has('nkeep')) $('n-keep').value = params.get('nkeep');

if (!navigator.gpu) {
  showNoWebGPU('This browser does not expose navigator.gpu (error code NO_WEBGPU).');
  document.body.dataset.result = 'no-webgpu';
} else {
  setState('idle');
  if (params.has('autoload')) loadModel().catch(() => {});
}
