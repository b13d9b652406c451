// Headless Chromium with WebGPU (flags from wasm-pack.toml [browser] chrome-args) and the local
// server (scripts/serve.mjs), for scripts/generate.mjs, scripts/bench-browser.mjs and the e2e
// tests. playwright-core drives Debian's /usr/bin/chromium; no browser is ever downloaded.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const root = new URL('..', import.meta.url).pathname.replace(/\/$/, '');

/** The Chromium flags, from wasm-pack.toml (the one place for them). */
export function chromeArgs({ headless = true } = {}) {
  const toml = readFileSync(`${root}/wasm-pack.toml`, 'utf8');
  const block = toml.slice(toml.indexOf('chrome-args'));
  const args = [...block.slice(0, block.indexOf(']')).matchAll(/"([^"]+)"/g)].map((m) => m[1]);
  // playwright adds its own --headless; keep the rest.
  return args.filter((a) => !a.startsWith('--headless') || !headless);
}

/**
 * Start scripts/serve.mjs on `port` (`www`: a folder to serve at `/` instead of www/); resolves
 * to `{url, bytes(), resetBytes(), stop()}`.
 */
export async function startServer(port, { www } = {}) {
  const args = [`${root}/scripts/serve.mjs`, '--port', String(port), ...(www ? ['--www', www] : [])];
  const proc = spawn(process.execPath, args, { stdio: 'ignore' });
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 100; i++) {
    try {
      if ((await fetch(`${url}/__bytes`)).ok) break;
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  const stats = async (reset) => (await fetch(`${url}/__bytes${reset ? '?reset=1' : ''}`)).json();
  return {
    url,
    bytes: () => stats(false),
    resetBytes: () => stats(true),
    stop: () => proc.kill(),
  };
}

/** Launch headless Chromium with WebGPU (a fresh profile each time). */
export async function launchChromium() {
  const { chromium } = await import('playwright-core');
  const userDataDir = mkdtempSync(join(tmpdir(), 'cera-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: chromeArgs(),
    headless: true,
    viewport: { width: 1280, height: 900 },
  });
  // The profile holds the Cache API copy of the model: remove it with the browser.
  const close = context.close.bind(context);
  context.close = async () => {
    await close();
    rmSync(userDataDir, { recursive: true, force: true });
  };
  return context;
}
