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

// What this process started (local servers, browser profiles), undone on every way out: a normal
// end, process.exit, an uncaught error or rejection (node emits 'exit' for each) and the signals
// that would otherwise end node without it. A server also exits when its stdin closes, i.e. when
// this process dies even by SIGKILL, so no run leaves an orphan for the next one to talk to.
const started = new Set();
function cleanup() {
  for (const undo of started) {
    try {
      undo();
    } catch {}
  }
  started.clear();
}
process.on('exit', cleanup);
for (const [sig, n] of [['SIGINT', 2], ['SIGTERM', 15], ['SIGHUP', 1]]) {
  process.on(sig, () => {
    cleanup();
    process.exit(128 + n);
  });
}

/**
 * Start scripts/serve.mjs on `port` (`www`: a folder to serve at `/` instead of www/); resolves
 * to `{url, pid, bytes(), resetBytes(), stop()}` once it listens. A port already in use (say, by
 * another run's server) is an error, never a server of unknown origin.
 */
export async function startServer(port, { www } = {}) {
  const args = [`${root}/scripts/serve.mjs`, '--port', String(port), '--exit-with-stdin', ...(www ? ['--www', www] : [])];
  const proc = spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  const stop = () => {
    started.delete(stop);
    proc.kill();
  };
  started.add(stop);
  let errors = '';
  proc.stderr.on('data', (d) => (errors += d));
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the local server on port ${port} did not start within 10 s`)), 10_000);
    proc.stdout.on('data', (d) => {
      if (String(d).includes('cera-web demo:')) {
        clearTimeout(timer);
        resolve();
      }
    });
    proc.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the local server could not start on port ${port} (exit ${code}): ${errors.trim().split('\n').slice(-1)[0] || 'no message'}`));
    });
  }).catch((e) => {
    stop();
    throw e;
  });
  proc.stdout.resume();
  const url = `http://127.0.0.1:${port}`;
  const stats = async (reset) => (await fetch(`${url}/__bytes${reset ? '?reset=1' : ''}`)).json();
  return {
    url,
    pid: proc.pid,
    bytes: () => stats(false),
    resetBytes: () => stats(true),
    stop,
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
  // The profile holds the Cache API copy of the model: remove it with the browser, or when this
  // process ends without closing it (playwright ends the browser itself).
  const removeProfile = () => {
    started.delete(removeProfile);
    rmSync(userDataDir, { recursive: true, force: true });
  };
  started.add(removeProfile);
  const close = context.close.bind(context);
  context.close = async () => {
    await close();
    removeProfile();
  };
  return context;
}
