// The fixture app: imports the package by name, as an app bundled by Vite would. The model URL
// comes from the query string (?model=URL); ?worker=1 runs the engine in the package's worker.
// The outcome lands in <body data-state data-result> and #result for tests/e2e/vite.test.mjs.
import { Engine, createWorkerEngine } from 'cera-web';

const params = new URLSearchParams(location.search);
const model = params.get('model');
const useWorker = params.get('worker') === '1';
const prompt = params.get('prompt') ?? 'The capital of France is';
const maxTokens = Number(params.get('tokens') ?? 3);

function show(state, result) {
  document.body.dataset.result = JSON.stringify(result);
  document.getElementById('result').textContent = JSON.stringify(result, null, 2);
  document.body.dataset.state = state;
}

async function run() {
  if (!model) throw Object.assign(new Error('no ?model=URL in the query string'), { code: 'INVALID_ARGUMENT' });
  const t0 = performance.now();
  const engine = useWorker ? await createWorkerEngine(model) : await Engine.load(model);
  const loadMs = performance.now() - t0;
  const stream = engine.generate(prompt, { temperature: 0, maxTokens });
  const ids = [];
  let text = '';
  for await (const t of stream) {
    if (t.tokenId !== null) ids.push(t.tokenId);
    text += t.text;
  }
  const stats = await stream.stats;
  await engine.dispose();
  return { worker: useWorker, ids, text, loadMs, stats };
}

run().then(
  (r) => show('done', r),
  (e) => show('error', { error: String(e?.message ?? e), code: e?.code ?? null }),
);
