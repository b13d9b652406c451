// End-to-end: cera-web imported by a bundler app. tests/vite-app is a minimal Vite app that depends
// on this package the way a user's app would (`"cera-web": "file:../.."`, i.e. `npm install ../..`)
// and does `import { Engine, createWorkerEngine } from 'cera-web'`. This test installs its deps if
// missing, runs `vite build` (Vite's JS API, the app's own vite.config.js plus a plugin that records
// which package files the bundles read), serves the built dist/ on one origin and the model on
// another, and checks in headless Chromium that the bundled app (main thread and worker) continues
// "The capital of France is" greedily exactly like llama.cpp. Needs `scripts/build` first.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { relative } from 'node:path';
import { pathToFileURL } from 'node:url';
import { launchChromium, root, startServer } from '../../scripts/browser.mjs';

const app = `${root}/tests/vite-app`;
const port = Number(process.env.CERA_VITE_E2E_PORT || 18792);
const MODEL = '/models/gemma-3-270m-q4_k_m.gguf';
const oracle = JSON.parse(readFileSync(`${root}/tests/fixtures/oracle/gemma3-270m.greedy.json`, 'utf8')).prompts.capital_raw;
// llama.cpp's first 3 greedy tokens (margins 0.62, 1.66, 2.45: no near-tie).
const EXPECTED = oracle.ids.slice(0, 3);
const log = (...a) => console.log('[vite-e2e]', ...a);

let modelServer;
let appServer;
let browser;
const packageFilesRead = new Set();

before(async () => {
  assert.ok(existsSync(`${root}/pkg/cera_web_bg.wasm`), 'pkg/ is missing: run `bash scripts/build` first');
  let t0 = Date.now();
  if (!existsSync(`${app}/node_modules/vite/package.json`) || !existsSync(`${app}/node_modules/cera-web/package.json`)) {
    execFileSync('npm', ['install', '--no-audit', '--no-fund'], { cwd: app, stdio: 'inherit' });
    log(`npm install in tests/vite-app: ${Date.now() - t0} ms`);
  }
  // `vite build`, with a plugin that lists every file of the package the bundles load (app and worker).
  t0 = Date.now();
  const { build } = await import(pathToFileURL(`${app}/node_modules/vite/dist/node/index.js`).href);
  const record = () => ({
    name: 'record-cera-web-files',
    load(id) {
      const file = id.split('?')[0];
      if (file.startsWith(`${root}/`) && !file.startsWith(`${app}/`)) packageFilesRead.add(relative(root, file));
      return null;
    },
  });
  rmSync(`${app}/dist`, { recursive: true, force: true });
  await build({ root: app, logLevel: 'warn', plugins: [record()], worker: { plugins: () => [record()] } });
  log(`vite build: ${Date.now() - t0} ms; package files bundled: ${[...packageFilesRead].sort().join(', ')}`);
  modelServer = await startServer(port);
  appServer = await startServer(port + 1, { www: `${app}/dist` });
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  modelServer?.stop();
  appServer?.stop();
});

test('vite build: the app bundles the package from its published files, the .wasm and the worker become assets', () => {
  const packed = JSON.parse(execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: root, encoding: 'utf8' }))[0].files.map((f) => f.path);
  for (const f of ['js/index.js', 'js/worker-client.js', 'js/worker.js', 'pkg/cera_web.js']) assert.ok(packageFilesRead.has(f), `${f} not bundled`);
  for (const f of packageFilesRead) assert.ok(packed.includes(f), `the bundle reads ${f}, which \`npm pack\` leaves out`);
  assert.ok(packed.includes('pkg/cera_web_bg.wasm'));
  const assets = readdirSync(`${app}/dist/assets`);
  const wasm = assets.filter((f) => f.endsWith('.wasm'));
  assert.equal(wasm.length, 1, `assets: ${assets}`);
  assert.deepEqual(readFileSync(`${app}/dist/assets/${wasm[0]}`), readFileSync(`${root}/pkg/cera_web_bg.wasm`));
  assert.ok(assets.some((f) => /^worker-.*\.js$/.test(f)), `no worker chunk in ${assets}`);
});

for (const worker of [false, true]) {
  const where = worker ? 'in the worker (createWorkerEngine)' : 'on the main thread (Engine)';
  test(`vite app ${where}: loads the model from ?model=URL, 3 greedy tokens match llama.cpp`, { timeout: 300_000 }, async () => {
    const page = await browser.newPage();
    const errors = [];
    const requests = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
    page.on('request', (r) => requests.push(r.url()));
    const model = `${modelServer.url}${MODEL}`;
    const t0 = Date.now();
    await page.goto(`${appServer.url}/?model=${encodeURIComponent(model)}${worker ? '&worker=1' : ''}`);
    await page.waitForFunction(() => document.body.dataset.state !== 'loading', null, { timeout: 280_000 });
    const wallMs = Date.now() - t0;
    const state = await page.evaluate(() => document.body.dataset.state);
    const r = JSON.parse(await page.evaluate(() => document.body.dataset.result));
    assert.equal(state, 'done', JSON.stringify(r));
    log(`${worker ? 'worker' : 'main thread'}: page to result ${wallMs} ms; load ${r.loadMs.toFixed(0)} ms;`,
      `first token ${r.stats.firstTokenMs.toFixed(0)} ms; decode ${r.stats.decodeTokS.toFixed(2)} tok/s; ids ${JSON.stringify(r.ids)} text ${JSON.stringify(r.text)}`);
    assert.deepEqual(r.ids, EXPECTED);
    assert.deepEqual(r.ids, [506, 5279, 529]);
    assert.equal(r.worker, worker);
    assert.equal(r.stats.promptTokens, oracle.prompt_tokens.length);
    // The .wasm came from the bundle's assets (not from the package's own pkg/ or js/ paths).
    const wasmRequests = requests.filter((u) => u.endsWith('.wasm'));
    assert.ok(wasmRequests.length >= 1 && wasmRequests.every((u) => u.startsWith(`${appServer.url}/assets/`)), JSON.stringify(wasmRequests));
    assert.ok(!requests.some((u) => /\/(pkg|js)\//.test(new URL(u).pathname)), JSON.stringify(requests));
    assert.deepEqual(errors, []);
    await page.close();
  });
}
