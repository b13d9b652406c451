// Types of the cera-web package (js/index.js, js/worker-client.js).

/** Stable error codes: `err.code` of every error the engine throws. */
export type ErrorCode =
  | 'NO_WEBGPU'
  | 'ADAPTER_TOO_SMALL'
  | 'DEVICE_LOST'
  | 'BAD_GGUF'
  | 'UNSUPPORTED_ARCH'
  | 'UNSUPPORTED_QUANT'
  | 'NETWORK'
  | 'ABORTED'
  | 'CONTEXT_FULL'
  | 'INVALID_ARGUMENT'
  | 'INTERNAL';

/** What the engine throws: a plain `Error` with a stable `code`. */
export interface CeraError extends Error {
  code: ErrorCode;
}

export type ModelSource = string | URL | Blob | File | ReadableStream<Uint8Array> | ArrayBuffer | Uint8Array;

export interface LoadProgress {
  /** `gpu` (opening the device), `header`, `weights`, `done` (all bytes on the GPU), `model`, `ready`. */
  phase: 'gpu' | 'header' | 'weights' | 'done' | 'model' | 'ready';
  loadedBytes: number;
  /** `null` when the server sent no Content-Length (or for a split file before its last part). */
  totalBytes: number | null;
  tensorsLoaded: number;
  tensorsTotal: number;
  /** 1-based part of a split GGUF (`*-00001-of-0000N.gguf`). */
  part?: number;
  parts?: number;
  origin?: 'network' | 'cache' | 'file' | 'stream' | 'memory';
}

export interface LoadOptions {
  onProgress?: (p: LoadProgress) => void;
  /** Aborting rejects with `ABORTED` and leaves nothing on the GPU. */
  signal?: AbortSignal;
  /** Keep the file in the Cache API (`true`: the cache "cera-web-models", or a cache name). */
  cache?: boolean | string;
  /** Context size in tokens (default 2048, at most the model's training context). */
  contextSize?: number;
  /** Tokens kept at the start when the context shifts (default 0). */
  nKeep?: number;
  /** Tokens dropped per shift (default: half of what is not kept). */
  nDiscard?: number;
  /** Shift the context automatically when it fills (default true); false: `CONTEXT_FULL`. */
  contextShift?: boolean;
  /**
   * Shift by evaluating the kept tokens again (exact, costs a prefill of them) instead of
   * re-rotating their K cells and keeping recurrent state (default false).
   */
  exactContextShift?: boolean;
  /** Prefill batch size (default 64). */
  batchSize?: number;
  expectedSize?: number;
  /** Hex SHA-256 of the whole file, checked while streaming. */
  expectedSha256?: string;
  /** Where the .wasm is, when not beside the package's pkg/cera_web.js. */
  wasm?: string | URL | Response | WebAssembly.Module;
}

export interface SamplingOptions {
  /** Default 0.8; 0 is greedy. */
  temperature?: number;
  topK?: number;
  topP?: number;
  minP?: number;
  repeatPenalty?: number;
  frequencyPenalty?: number;
  presencePenalty?: number;
  penaltyLastN?: number;
  seed?: number;
}

export interface GenerateOptions extends SamplingOptions {
  /** Default 256. */
  maxTokens?: number;
  /** Stop strings (not included in the output). */
  stop?: string[];
  /** Stops the generation at the next token (`finishReason: 'aborted'`). */
  signal?: AbortSignal;
  /** Raw prompts: add BOS (default true). */
  addSpecial?: boolean;
  /** Raw prompts: parse special tokens like `<start_of_turn>` (default true). */
  parseSpecial?: boolean;
}

export interface Token {
  text: string;
  /** `null` for text flushed at the end (held back by a stop string or a partial character). */
  tokenId: number | null;
}

export interface GenerationStats {
  promptTokens: number;
  /** Prompt tokens already in the KV cache from the previous call. */
  reusedTokens: number;
  prefilledTokens: number;
  generatedTokens: number;
  prefillTokS: number;
  decodeTokS: number;
  firstTokenMs: number;
  totalMs: number;
  finishReason: 'stop' | 'length' | 'aborted';
  contextShifts: number;
  totalContextShifts: number;
  nPast: number;
  contextSize: number;
}

/** A running generation: `for await (const {text} of stream)`; `await stream.stats`. */
export interface TokenStream extends AsyncIterableIterator<Token> {
  readonly stats: Promise<GenerationStats>;
  stop(): void;
  /** The whole text (consumes the stream). */
  text(): Promise<string>;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | string;
  content: string;
}

export interface TokenizeOptions {
  addSpecial?: boolean;
  parseSpecial?: boolean;
}

export interface GpuLimitsInfo {
  maxStorageBufferBindingSize: number;
  maxBufferSize: number;
  maxComputeWorkgroupsPerDimension: number;
  maxComputeInvocationsPerWorkgroup: number;
  maxComputeWorkgroupStorageSize: number;
  maxStorageBuffersPerShaderStage: number;
}

export interface EngineInfo {
  model: {
    name: string | null;
    architecture: string;
    nLayer: number;
    nEmbd: number;
    nHead: number;
    nHeadKv: number;
    nFf: number;
    nVocab: number;
    nCtxTrain: number;
    fileBytes: number;
    fileBytesPerType: Record<string, number>;
    bosId: number | null;
    eosId: number | null;
    eogIds: number[];
    chatTemplate: string | null;
  };
  adapter: { name: string; backend: string; deviceType: string; driver: string };
  limits: GpuLimitsInfo;
  adapterLimits: GpuLimitsInfo;
  memory: {
    weightsGpuBytes: number;
    buffers: number;
    splitTensors: number;
    maxBinding: number;
    gpuBytesPerType: Record<string, number>;
  };
  load: {
    source: string;
    origin: 'network' | 'cache' | 'file' | 'stream' | 'memory';
    parts: number;
    bytes: number;
    resumes: number;
    cached: boolean;
    loadMs: number;
    peakWasmHeapBytes: number;
    sha256: string | null;
  };
  contextSize: number;
  nKeep: number;
  contextShift: boolean;
  nPast: number;
  contextShifts: number;
}

/** Fetch and compile the .wasm once (Engine.load calls it). */
export function init(wasm?: string | URL | Response | WebAssembly.Module): Promise<unknown>;

export class Engine {
  private constructor();
  static load(source: ModelSource, options?: LoadOptions): Promise<Engine>;
  generate(prompt: string, options?: GenerateOptions): TokenStream;
  chat(messages: ChatMessage[], options?: GenerateOptions): TokenStream;
  tokenize(text: string, options?: TokenizeOptions): number[];
  detokenize(ids: ArrayLike<number>): string;
  shiftContext(nKeep: number, nDiscard: number): void;
  reset(): void;
  info(): EngineInfo;
  readonly nPast: number;
  readonly disposed: boolean;
  /** Destroys every GPU buffer; later calls throw. */
  dispose(): void;
}

export interface WorkerLoadOptions extends LoadOptions {
  /** A worker running cera-web's js/worker.js (default: a new one). */
  worker?: Worker;
  /** Count live GPU buffers in the worker (debug; see `liveBuffers()`). */
  debugBuffers?: boolean;
}

/** The Engine API with the engine in a Web Worker: methods return promises. */
export class WorkerEngine {
  private constructor();
  static load(source: ModelSource, options?: WorkerLoadOptions): Promise<WorkerEngine>;
  generate(prompt: string, options?: GenerateOptions): TokenStream;
  chat(messages: ChatMessage[], options?: GenerateOptions): TokenStream;
  tokenize(text: string, options?: TokenizeOptions): Promise<number[]>;
  detokenize(ids: ArrayLike<number>): Promise<string>;
  shiftContext(nKeep: number, nDiscard: number): Promise<void>;
  reset(): Promise<void>;
  info(): Promise<EngineInfo>;
  nPast(): Promise<number>;
  liveBuffers(): Promise<number | null>;
  readonly disposed: boolean;
  /** Frees the GPU and ends the worker. */
  dispose(): Promise<void>;
}

export function createWorkerEngine(source: ModelSource, options?: WorkerLoadOptions): Promise<WorkerEngine>;

/** A token stream over a callback-style generation (used by both engines). */
export function tokenStream(
  start: (onToken: (text: string, tokenId: number | null) => boolean) => Promise<GenerationStats>,
  signal?: AbortSignal,
): TokenStream;

export function engineError(code: ErrorCode, message: string): CeraError;

/** Debug: count live GPU buffers on this thread (call before loading). */
export function countGpuBuffers(): { readonly live: number } | null;

/** The kv_shift self-check of the GPU. */
export function gpuSelfCheck(): Promise<{
  adapter: unknown;
  backend: string;
  limits: Record<string, number>;
  cases: { name: string; maxAbsError: number; passed: boolean }[];
  passed: boolean;
}>;
