// End-to-end: the demo page and the JS API in headless Chromium (WebGPU on SwiftShader) with the
// real model (Gemma 3 270M Q4_K_M) served by scripts/serve.mjs. Needs `scripts/build` first.
// One browser (one profile, so one Cache API store) and one server for every test; the tests run
// in order and the later ones rely on the cache the first one fills. SwiftShader is slow (a
// decode step is ~2.5 s here): every generation is a handful of tokens, and timings are printed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { launchChromium, root, startServer } from '../../scripts/browser.mjs';
import { splitGguf } from './gguf-split.mjs';

const port = Number(process.env.CERA_E2E_PORT || 18791);
const outDir = `${root}/test-output`;
const MODEL = '/models/gemma-3-270m-q4_k_m.gguf';
// On disk: the folder the server maps /models/ to (scripts/fetch-model fills it; CERA_MODELS_DIR
// moves it, as there).
const MODELS_DIR = process.env.CERA_MODELS_DIR ? resolve(process.env.CERA_MODELS_DIR) : `${root}/models`;
const MODEL_FILE = `${MODELS_DIR}/${MODEL.slice('/models/'.length)}`;
const MODEL_BYTES = 253113024;
const oracle = JSON.parse(readFileSync(`${root}/tests/fixtures/oracle/gemma3-270m.greedy.json`, 'utf8')).prompts.capital_raw;
// llama.cpp's greedy continuation up to its first near-tie (margin < 0.5 at step 3).
const FIRST_NEAR_TIE = oracle.margin.findIndex((m) => m < 0.5);
const EXPECTED = oracle.ids.slice(0, FIRST_NEAR_TIE);

let server;
let browser;
let workerIds = null;
const log = (...a) => console.log('[e2e]', ...a);

before(async () => {
  mkdirSync(outDir, { recursive: true });
  server = await startServer(port);
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  server?.stop();
});

async function newPage(path) {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  // With the URL: "Failed to load resource" alone does not say which.
  page.on('console', (m) => m.type() === 'error' && errors.push(`${m.text()} (${m.location().url})`));
  await page.goto(`${server.url}${path}`);
  return { page, errors };
}

const waitState = (page, state, timeout = 120_000) =>
  page.waitForFunction((s) => document.body.dataset.state === s, state, { timeout });

test('demo: loads the real model in the worker, progress reaches 100%, greedy matches llama.cpp', { timeout: 300_000 }, async () => {
  assert.ok(FIRST_NEAR_TIE >= 3, 'fixture: first near-tie');
  await server.resetBytes();
  const { page } = await newPage('/?autoload=1&debug=1');
  const t0 = Date.now();
  await waitState(page, 'ready');
  const loadMs = Date.now() - t0;
  const progress = await page.evaluate(() => ({ p: window.demo.progress, bar: document.body.dataset.progress, info: window.demo.info }));
  assert.equal(progress.bar, '100');
  assert.equal(progress.info.load.bytes, MODEL_BYTES);
  assert.equal(progress.info.load.origin, 'network');
  assert.equal(progress.info.load.cached, true, 'the first load fills the cache');
  const served = (await server.bytes()).modelBytesServed;
  assert.ok(served >= MODEL_BYTES, `served ${served}`);
  // Greedy raw completion, token ids from the worker engine.
  const r = await page.evaluate(async (prompt) => {
    const s = window.demo.engine.generate(prompt, { temperature: 0, maxTokens: 4 });
    const ids = [];
    let text = '';
    for await (const t of s) {
      if (t.tokenId !== null) ids.push(t.tokenId);
      text += t.text;
    }
    return { ids, text, stats: await s.stats };
  }, oracle.prompt);
  log(`cold load (network) ${loadMs} ms; peak wasm heap ${(progress.info.load.peakWasmHeapBytes / 1048576).toFixed(1)} MiB;`,
    `first token ${r.stats.firstTokenMs.toFixed(0)} ms; prefill ${r.stats.prefillTokS.toFixed(2)} tok/s; decode ${r.stats.decodeTokS.toFixed(2)} tok/s;`,
    `text ${JSON.stringify(r.text)}`);
  assert.deepEqual(r.ids.slice(0, EXPECTED.length), EXPECTED);
  assert.deepEqual(r.stats.promptTokens, oracle.prompt_tokens.length);
  // The model streams to the GPU chunk by chunk: the wasm heap never holds the 253 MB file.
  assert.ok(progress.info.load.peakWasmHeapBytes <= 64 << 20, `peak wasm heap ${progress.info.load.peakWasmHeapBytes}`);
  workerIds = r.ids;
  await page.close();
});

test('demo: chat streams, a screenshot mid-chat, Stop ends it within a bound, the next turn reuses the KV cache', { timeout: 300_000 }, async () => {
  const { page, errors } = await newPage('/?autoload=1');
  await waitState(page, 'ready');
  await page.fill('#input', 'Write a short poem about the sea.');
  await page.click('#send');
  // Wait for streamed text in the assistant bubble, then take the screenshot.
  await page.waitForFunction(() => (document.querySelector('.msg.assistant.streaming')?.textContent ?? '').length > 0, null, { timeout: 120_000 });
  await page.screenshot({ path: `${outDir}/demo-mid-chat.png`, fullPage: true });
  const t0 = Date.now();
  await page.click('#stop');
  await waitState(page, 'ready', 60_000);
  const stopMs = Date.now() - t0;
  const s1 = await page.evaluate(() => window.demo.lastStats);
  log(`stop took ${stopMs} ms; finish ${s1.finishReason} after ${s1.generatedTokens} tokens`);
  assert.equal(s1.finishReason, 'aborted');
  assert.ok(stopMs < 15_000, `stop took ${stopMs} ms`);
  // Second turn: the first turn's tokens stay in the KV cache.
  const r = await page.evaluate(() => window.demo.send('Thanks!', { maxTokens: 2 }));
  log(`second turn: ${r.stats.promptTokens} prompt tokens, ${r.stats.reusedTokens} reused, ${r.stats.prefilledTokens} prefilled`);
  assert.ok(r.stats.reusedTokens >= s1.promptTokens, JSON.stringify(r.stats));
  assert.equal(r.stats.prefilledTokens, r.stats.promptTokens - r.stats.reusedTokens);
  assert.equal(await page.locator('.msg.user').count(), 2);
  assert.deepEqual(errors, []);
  await page.close();
});

test('demo: a second load with the cache enabled transfers no model bytes', { timeout: 180_000 }, async () => {
  await server.resetBytes();
  const { page } = await newPage('/?autoload=1');
  const t0 = Date.now();
  await waitState(page, 'ready');
  const loadMs = Date.now() - t0;
  const info = await page.evaluate(() => window.demo.info);
  const r = await page.evaluate(() => window.demo.send('The capital of France is', { raw: true, temperature: 0, maxTokens: 1 }));
  const served = await server.bytes();
  log(`cached load ${loadMs} ms (engine ${info.load.loadMs.toFixed(0)} ms), first token after ${r.stats.firstTokenMs.toFixed(0)} ms; model bytes served ${served.modelBytesServed}`);
  assert.equal(info.load.origin, 'cache');
  assert.equal(served.modelBytesServed, 0);
  assert.equal(served.requests, 0);
  await page.close();
});

test('demo: a small context shifts at least twice and the page counts the shifts', { timeout: 300_000 }, async () => {
  const { page } = await newPage('/?autoload=1&context=8&nkeep=1');
  await waitState(page, 'ready');
  const r = await page.evaluate(() => window.demo.send('The capital of France is', { raw: true, temperature: 0, maxTokens: 8 }));
  const shown = Number(await page.textContent('#shift-count'));
  log(`context 8: ${r.stats.contextShifts} shifts, text ${JSON.stringify(r.text)}`);
  assert.ok(r.stats.contextShifts >= 2, JSON.stringify(r.stats));
  assert.equal(shown, r.stats.totalContextShifts);
  assert.equal(r.stats.generatedTokens, 8);
  assert.ok(r.text.trim().length > 0);
  assert.ok(r.stats.nPast <= 8);
  await page.close();
});

test('demo: the local file picker loads the model (a File through the worker)', { timeout: 180_000 }, async () => {
  await server.resetBytes();
  const { page, errors } = await newPage('/');
  await waitState(page, 'idle');
  await page.check('input[name=source][value=file]');
  await page.setInputFiles('#model-file', MODEL_FILE);
  await page.uncheck('#use-cache');
  const t0 = Date.now();
  await page.click('#load');
  await waitState(page, 'ready');
  const info = await page.evaluate(() => window.demo.info);
  log(`file load ${Date.now() - t0} ms`);
  assert.equal(info.load.origin, 'file');
  assert.equal(info.load.bytes, MODEL_BYTES);
  assert.equal((await server.bytes()).modelBytesServed, 0);
  const r = await page.evaluate(() => window.demo.send('The capital of France is', { raw: true, temperature: 0, maxTokens: 1 }));
  assert.equal(r.text, ' the');
  assert.deepEqual(errors, []);
  await page.close();
});

test('demo: Cancel aborts a load in the worker with ABORTED', { timeout: 120_000 }, async () => {
  const { page } = await newPage('/');
  await waitState(page, 'idle');
  await page.uncheck('#use-cache');
  await page.click('#load');
  await page.waitForFunction(() => Number(document.body.dataset.progress) > 10, null, { timeout: 60_000 });
  const t0 = Date.now();
  await page.click('#cancel-load');
  await waitState(page, 'idle', 30_000);
  log(`cancel took ${Date.now() - t0} ms`);
  assert.match(await page.textContent('#progress-text'), /^ABORTED/);
  assert.equal(await page.evaluate(() => window.demo.engine), null);
  await page.close();
});

test('js API on the main thread: same greedy ids as the worker, CONTEXT_FULL, dispose frees every buffer, abort leaves none', { timeout: 300_000 }, async () => {
  const { page } = await newPage('/headless.html');
  const r = await page.evaluate(async ({ model, prompt }) => {
    const m = await import('/js/index.js');
    const counter = m.countGpuBuffers();
    const out = {};
    const engine = await m.Engine.load(model, { cache: true, contextSize: 64 });
    out.liveLoaded = counter.live;
    const s = engine.generate(prompt, { temperature: 0, maxTokens: 4 });
    out.ids = [];
    for await (const t of s) if (t.tokenId !== null) out.ids.push(t.tokenId);
    out.tokenize = engine.tokenize(prompt);
    out.detok = engine.detokenize(out.tokenize);
    engine.dispose();
    out.liveDisposed = counter.live;
    try {
      engine.info();
    } catch (e) {
      out.afterDispose = e.code;
    }
    // contextShift: false -> CONTEXT_FULL
    const small = await m.Engine.load(model, { cache: true, contextSize: 8, contextShift: false });
    try {
      await small.generate(prompt, { temperature: 0, maxTokens: 8 }).text();
    } catch (e) {
      out.full = e.code;
    }
    small.dispose();
    // Abort a load half-way (from the network, no cache).
    const ctl = new AbortController();
    const t0 = performance.now();
    try {
      const onProgress = (p) => {
        if (p.loadedBytes > 60e6 && !ctl.signal.aborted) {
          out.liveAtAbort = counter.live;
          ctl.abort();
        }
      };
      await m.Engine.load(model, { signal: ctl.signal, onProgress });
    } catch (e) {
      out.aborted = e.code;
    }
    out.abortMs = performance.now() - t0;
    out.liveAborted = counter.live;
    return out;
  }, { model: MODEL, prompt: oracle.prompt });
  log(`main thread: ${r.liveLoaded} buffers while loaded; abort after ${r.abortMs.toFixed(0)} ms with ${r.liveAtAbort} buffers live`);
  assert.deepEqual(r.tokenize, oracle.prompt_tokens);
  assert.equal(r.detok, oracle.prompt);
  assert.ok(workerIds, 'the worker test ran first');
  assert.deepEqual(r.ids, workerIds);
  assert.ok(r.liveLoaded > 100);
  assert.equal(r.liveDisposed, 0);
  assert.equal(r.afterDispose, 'INVALID_ARGUMENT');
  assert.equal(r.full, 'CONTEXT_FULL');
  assert.equal(r.aborted, 'ABORTED');
  // Buffers were live when the abort came (60 MB in), and none after it.
  assert.ok(r.liveAtAbort > 0, `live at abort: ${r.liveAtAbort}`);
  assert.equal(r.liveAborted, 0);
  await page.close();
});

test('js API: a dropped download resumes with a Range request', { timeout: 180_000 }, async () => {
  const { page } = await newPage('/headless.html');
  const r = await page.evaluate(async () => {
    const m = await import('/js/index.js');
    const engine = await m.Engine.load('/__flaky/gemma-3-270m-q4_k_m.gguf?drop=40000000', { expectedSize: 253113024 });
    const info = engine.info();
    const text = await engine.generate('The capital of France is', { temperature: 0, maxTokens: 1 }).text();
    engine.dispose();
    return { load: info.load, text };
  });
  log(`flaky download: ${r.load.resumes} resume(s), ${r.load.bytes} bytes, text ${JSON.stringify(r.text)}`);
  assert.ok(r.load.resumes >= 1);
  assert.equal(r.load.bytes, MODEL_BYTES);
  assert.equal(r.text, ' the');
  await page.close();
});

test('js API: a split GGUF (*-00001-of-00003.gguf) loads from the first part\'s URL', { timeout: 180_000 }, async () => {
  const dir = `${MODELS_DIR}/split-e2e`;
  mkdirSync(dir, { recursive: true });
  const t0 = Date.now();
  splitGguf(MODEL_FILE, 3, (i) => `${dir}/gemma-${String(i).padStart(5, '0')}-of-00003.gguf`);
  log(`split into 3 parts in ${Date.now() - t0} ms`);
  try {
    const { page } = await newPage('/headless.html');
    const r = await page.evaluate(async () => {
      const m = await import('/js/index.js');
      const parts = new Set();
      const engine = await m.Engine.load('/models/split-e2e/gemma-00001-of-00003.gguf', { onProgress: (p) => parts.add(p.part) });
      const info = engine.info();
      const s = engine.generate('The capital of France is', { temperature: 0, maxTokens: 3 });
      const ids = [];
      for await (const t of s) if (t.tokenId !== null) ids.push(t.tokenId);
      engine.dispose();
      return { load: info.load, ids, parts: [...parts].filter(Boolean) };
    });
    log(`split load: ${r.load.parts} parts, ${r.load.bytes} bytes, ids ${r.ids}`);
    assert.equal(r.load.parts, 3);
    assert.deepEqual(r.parts, [1, 2, 3]);
    assert.deepEqual(r.ids, EXPECTED);
    await page.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('js API: ReadableStream and ArrayBuffer sources, SHA-256 checked while streaming, BAD_GGUF', { timeout: 180_000 }, async () => {
  const { page } = await newPage('/headless.html');
  const r = await page.evaluate(async ({ model, sha }) => {
    const m = await import('/js/index.js');
    const out = {};
    let t0 = performance.now();
    const e1 = await m.Engine.load((await fetch(model)).body, { expectedSha256: sha });
    out.stream = { ...e1.info().load, ms: performance.now() - t0 };
    e1.dispose();
    const bytes = await (await fetch(model)).arrayBuffer();
    t0 = performance.now();
    try {
      await m.Engine.load(bytes, { expectedSha256: '00'.repeat(32) });
    } catch (e) {
      out.wrongSha = e.code;
    }
    out.wrongShaMs = performance.now() - t0;
    try {
      await m.Engine.load(new Uint8Array(4096).fill(7));
    } catch (e) {
      out.garbage = e.code;
    }
    try {
      await m.Engine.load('/models/does-not-exist.gguf');
    } catch (e) {
      out.missing = e.code;
    }
    return out;
  }, { model: MODEL, sha: JSON.parse(readFileSync(`${root}/tests/fixtures/oracle/gemma3-270m.greedy.json`, 'utf8')).model_sha256 });
  log(`ReadableStream load with SHA-256 ${r.stream.ms.toFixed(0)} ms; ArrayBuffer load with a wrong hash rejected after ${r.wrongShaMs.toFixed(0)} ms`);
  assert.equal(r.stream.origin, 'stream');
  assert.equal(r.stream.bytes, MODEL_BYTES);
  assert.equal(r.wrongSha, 'BAD_GGUF');
  assert.equal(r.garbage, 'BAD_GGUF');
  assert.equal(r.missing, 'NETWORK');
  await page.close();
});

test('a page without WebGPU shows the NO_WEBGPU message and the API throws NO_WEBGPU', { timeout: 60_000 }, async () => {
  const page = await browser.newPage();
  await page.addInitScript(() => {
    delete Navigator.prototype.gpu;
  });
  await page.goto(`${server.url}/`);
  await waitState(page, 'no-webgpu', 30_000);
  assert.equal(await page.isVisible('#nowebgpu'), true);
  assert.match(await page.textContent('#nowebgpu-msg'), /NO_WEBGPU/);
  const code = await page.evaluate(async () => {
    const m = await import('/js/index.js');
    try {
      await m.Engine.load('/models/none.gguf');
    } catch (e) {
      return e.code;
    }
  });
  assert.equal(code, 'NO_WEBGPU');
  await page.close();
});

test('demo: the GPU self-check panel passes', { timeout: 180_000 }, async () => {
  const { page, errors } = await newPage('/');
  await page.click('#selfcheck-card summary');
  await page.click('#rerun');
  await page.waitForFunction(() => document.body.dataset.selfcheck, null, { timeout: 170_000 });
  assert.equal(await page.evaluate(() => document.body.dataset.selfcheck), 'pass', await page.textContent('#status'));
  assert.equal(await page.locator('#cases tbody tr').count(), 2);
  assert.deepEqual(errors, []);
  await page.close();
});
