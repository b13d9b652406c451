// A small static server for the demo: `/` is www/, `/pkg/` the built package, `/models/` the
// fetched models. Right MIME types (application/wasm), HTTP Range requests (resumable model
// downloads), no caching headers games. Usage: node scripts/serve.mjs [--port 8080] [--www DIR]
// [--exit-with-stdin]
// (--www: serve DIR at `/` instead of www/, e.g. a bundler app's dist/; --exit-with-stdin: end when
// the process that started it does).
import { createServer } from 'node:http';
import { createReadStream, statSync } from 'node:fs';
import { extname, join, normalize, resolve } from 'node:path';

const root = resolve(new URL('..', import.meta.url).pathname);
const args = process.argv.slice(2);
const portArg = args.indexOf('--port');
const port = Number(portArg >= 0 ? args[portArg + 1] : process.env.PORT || 8080);
const wwwArg = args.indexOf('--www');
const www = wwwArg >= 0 ? resolve(args[wwwArg + 1]) : join(root, 'www');
const mounts = [
  ['/pkg/', join(root, 'pkg')],
  // The models folder scripts/fetch-model fills (CERA_MODELS_DIR, as there).
  ['/models/', process.env.CERA_MODELS_DIR ? resolve(process.env.CERA_MODELS_DIR) : join(root, 'models')],
  ['/js/', join(root, 'js')],
  ['/fixtures/', join(root, 'tests', 'fixtures')],
  // Dev dependencies for browser tests that import a package (the openai client), unbundled.
  ['/node_modules/', join(root, 'node_modules')],
  ['/', www],
];
const types = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.gguf': 'application/octet-stream',
  '.ts': 'text/plain; charset=utf-8',
};

export let bytesServed = 0;
// Model bytes only (/models/ and /__flaky/): what the cache tests count.
let modelBytesServed = 0;
let requests = 0;

function resolvePath(urlPath) {
  for (const [prefix, dir] of mounts) {
    if (urlPath.startsWith(prefix)) {
      const rel = normalize(decodeURIComponent(urlPath.slice(prefix.length))).replace(/^(\.\.[/\\])+/, '');
      const full = join(dir, rel || 'index.html');
      if (!full.startsWith(dir)) return null;
      return full;
    }
  }
  return null;
}

const cors = {
  // Tests run on another localhost origin (the wasm test runner's page) and fetch models here.
  'access-control-allow-origin': '*',
  'access-control-allow-headers': 'range',
  'access-control-expose-headers': 'content-length, content-range, accept-ranges',
  'cross-origin-resource-policy': 'cross-origin',
};

const server = createServer((req, res) => {
  const url = new URL(req.url, 'http://localhost');
  // Test hooks: /__bytes reports (and ?reset=1 zeroes) the model bytes served; /__flaky/X serves
  // /models/X but drops the connection after ?drop=N bytes (a resumable-download test).
  if (url.pathname === '/__bytes') {
    const body = JSON.stringify({ bytesServed, modelBytesServed, requests });
    if (url.searchParams.get('reset')) modelBytesServed = requests = 0;
    res.writeHead(200, { ...cors, 'content-type': 'application/json', 'cache-control': 'no-store' });
    res.end(body);
    return;
  }
  let dropAfter = Infinity;
  const flaky = url.pathname.startsWith('/__flaky/');
  if (flaky) {
    if (!req.headers.range) dropAfter = Number(url.searchParams.get('drop') || 1 << 20);
    url.pathname = '/models/' + url.pathname.slice('/__flaky/'.length);
  }
  const isModel = url.pathname.startsWith('/models/');
  if (isModel) requests++;
  if (req.method === 'OPTIONS') {
    res.writeHead(204, cors);
    res.end();
    return;
  }
  let file = resolvePath(url.pathname);
  let st;
  try {
    st = file && statSync(file);
    if (st && st.isDirectory()) {
      file = join(file, 'index.html');
      st = statSync(file);
    }
  } catch {
    st = null;
  }
  if (!st) {
    res.writeHead(404, { ...cors, 'content-type': 'text/plain' });
    res.end(`not found: ${url.pathname}\n`);
    return;
  }
  const headers = {
    ...cors,
    'content-type': types[extname(file)] || 'application/octet-stream',
    'accept-ranges': 'bytes',
    'cache-control': 'no-cache',
    'cross-origin-opener-policy': 'same-origin',
    'cross-origin-embedder-policy': 'require-corp',
  };
  let start = 0;
  let end = st.size - 1;
  let status = 200;
  const range = req.headers.range && /^bytes=(\d*)-(\d*)$/.exec(req.headers.range);
  if (range) {
    if (range[1] === '') {
      start = Math.max(0, st.size - Number(range[2]));
    } else {
      start = Number(range[1]);
      if (range[2] !== '') end = Math.min(end, Number(range[2]));
    }
    if (start > end || start >= st.size) {
      res.writeHead(416, { ...cors, 'content-range': `bytes */${st.size}` });
      res.end();
      return;
    }
    status = 206;
    headers['content-range'] = `bytes ${start}-${end}/${st.size}`;
  }
  headers['content-length'] = String(end - start + 1);
  res.writeHead(status, headers);
  if (req.method === 'HEAD') {
    res.end();
    return;
  }
  const stream = createReadStream(file, { start, end });
  let sent = 0;
  stream.on('data', (chunk) => {
    bytesServed += chunk.length;
    if (isModel) modelBytesServed += chunk.length;
    sent += chunk.length;
    if (sent >= dropAfter) {
      stream.destroy();
      res.destroy();
    }
  });
  stream.pipe(res);
});

// Started by another process (scripts/browser.mjs): end with it. Its end closes our stdin, even
// when it is killed outright, so a crashed run never leaves this server behind.
if (args.includes('--exit-with-stdin')) {
  process.stdin.on('end', () => process.exit(0));
  process.stdin.on('error', () => process.exit(0));
  process.stdin.resume();
}
server.on('error', (e) => {
  console.error(`cannot serve on 127.0.0.1:${port}: ${e.code === 'EADDRINUSE' ? 'the port is in use' : e.message}`);
  process.exit(1);
});
server.listen(port, '127.0.0.1', () => {
  console.log(`cera-web demo: http://localhost:${port}/`);
});
