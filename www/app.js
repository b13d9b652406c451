// Demo page: runs the wasm engine's GPU self-check and shows adapter, limits and results.
import init, { gpuSelfCheck } from '/pkg/cera_web.js';

const $ = (id) => document.getElementById(id);

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

const mib = (b) => (b >= 1 << 20 ? `${(b / (1 << 20)).toFixed(0)} MiB` : b >= 1 << 10 ? `${(b / 1024).toFixed(0)} KiB` : `${b} B`);

async function adapterInfo() {
  const adapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
  const info = adapter?.info || {};
  return [
    ['vendor', info.vendor || '—'],
    ['architecture', info.architecture || '—'],
    ['device', info.device || '—'],
    ['description', info.description || '—'],
    ['shader-f16', adapter?.features.has('shader-f16') ? 'yes' : 'no'],
    ['subgroups', adapter?.features.has('subgroups') ? 'yes' : 'no'],
  ];
}

async function run() {
  const status = $('status');
  $('rerun').disabled = true;
  status.className = 'status';
  status.textContent = 'Running the kv_shift kernel on your GPU…';
  try {
    const t0 = performance.now();
    const report = await gpuSelfCheck();
    const ms = performance.now() - t0;
    fill($('adapter'), await adapterInfo());
    const l = report.limits;
    fill($('limits'), [
      ['maxStorageBufferBindingSize', mib(l.maxStorageBufferBindingSize)],
      ['maxBufferSize', mib(l.maxBufferSize)],
      ['maxComputeWorkgroupsPerDimension', l.maxComputeWorkgroupsPerDimension],
      ['maxComputeInvocationsPerWorkgroup', l.maxComputeInvocationsPerWorkgroup],
      ['maxComputeWorkgroupStorageSize', mib(l.maxComputeWorkgroupStorageSize)],
      ['maxStorageBuffersPerShaderStage', l.maxStorageBuffersPerShaderStage],
    ]);
    const tbody = $('cases').querySelector('tbody');
    tbody.replaceChildren();
    for (const c of report.cases) {
      const tr = document.createElement('tr');
      tr.innerHTML = `<td></td><td>${c.maxAbsError.toExponential(2)}</td><td class="${c.passed ? 'pass' : 'fail'}">${c.passed ? 'pass' : 'FAIL'}</td>`;
      tr.firstChild.textContent = c.name;
      tbody.append(tr);
    }
    status.className = report.passed ? 'status ok' : 'status bad';
    status.textContent = report.passed
      ? `All checks passed in ${ms.toFixed(0)} ms: this GPU runs cera-web's kernels correctly.`
      : 'A check failed: this GPU computes the context shift wrongly. Please report your adapter.';
    document.body.dataset.result = report.passed ? 'pass' : 'fail';
  } catch (e) {
    status.className = 'status bad';
    status.textContent = `${e.code || 'ERROR'}: ${e.message}`;
    document.body.dataset.result = 'error';
    if (e.code === 'NO_WEBGPU') showNoWebGpu(e.message);
  } finally {
    $('rerun').disabled = false;
  }
}

function showNoWebGpu(msg) {
  $('nowebgpu').hidden = false;
  $('nowebgpu-msg').textContent = msg;
}

$('rerun').addEventListener('click', run);
await init();
if (!('gpu' in navigator)) {
  showNoWebGpu('This browser does not expose navigator.gpu.');
  $('status').className = 'status bad';
  $('status').textContent = 'NO_WEBGPU: WebGPU is not available in this browser.';
  document.body.dataset.result = 'no-webgpu';
} else {
  run();
}
