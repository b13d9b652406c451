import { defineConfig } from 'vite';

// No settings a user would need: the package's .wasm (wasm-bindgen's
// `new URL('cera_web_bg.wasm', import.meta.url)`) and its worker
// (`new Worker(new URL('./worker.js', import.meta.url))`) are assets Vite finds on its own.
export default defineConfig({});
