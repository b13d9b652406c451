// End-to-end: the demo page served by scripts/serve.mjs runs the kv_shift self-check on
// headless Chromium's WebGPU (SwiftShader) and reports a pass. Needs `scripts/build` first.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync } from 'node:fs';
import { chromium } from 'playwright-core';

const root = new URL('../..', import.meta.url).pathname;
const port = Number(process.env.CERA_E2E_PORT || 18791);
const outDir = `${root}/test-output`;
let server;
let browser;

// Browser flags come from wasm-pack.toml ([browser] chrome-args), the one place for them.
function chromeArgs() {
  const toml = readFileSync(`${root}/wasm-pack.toml`, 'utf8');
  const block = toml.slice(toml.indexOf('chrome-args'));
  return [...block.slice(0, block.indexOf(']')).matchAll(/"([^"]+)"/g)].map((m) => m[1]).filter((a) => !a.startsWith('--headless'));
}

before(async () => {
  mkdirSync(outDir, { recursive: true });
  server = spawn(process.execPath, [`${root}/scripts/serve.mjs`, '--port', String(port)], { stdio: 'ignore' });
  for (let i = 0; i < 50; i++) {
    try {
      if ((await fetch(`http://127.0.0.1:${port}/`)).ok) break;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: chromeArgs(),
  });
});

after(async () => {
  await browser?.close();
  server?.kill();
});

test('demo page passes the GPU self-check', { timeout: 180_000 }, async () => {
  const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`http://127.0.0.1:${port}/`);
  await page.waitForFunction(() => document.body.dataset.result, null, { timeout: 170_000 });
  const result = await page.evaluate(() => document.body.dataset.result);
  const status = await page.textContent('#status');
  await page.screenshot({ path: `${outDir}/demo-selfcheck.png`, fullPage: true });
  assert.deepEqual(errors, []);
  assert.equal(result, 'pass', status);
  const rows = await page.$$eval('#cases tbody tr', (trs) => trs.map((t) => t.textContent));
  assert.equal(rows.length, 2);
  const limits = await page.textContent('#limits');
  assert.match(limits, /maxStorageBufferBindingSize/);
});

test('a page without WebGPU shows the NO_WEBGPU message', { timeout: 60_000 }, async () => {
  const page = await browser.newPage();
  await page.addInitScript(() => {
    delete Navigator.prototype.gpu;
  });
  await page.goto(`http://127.0.0.1:${port}/`);
  await page.waitForFunction(() => document.body.dataset.result, null, { timeout: 50_000 });
  assert.equal(await page.evaluate(() => document.body.dataset.result), 'no-webgpu');
  assert.equal(await page.isVisible('#nowebgpu'), true);
  assert.match(await page.textContent('#status'), /NO_WEBGPU/);
});
