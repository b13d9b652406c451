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

/** A JSON Schema (draft 2020-12 subset that llguidance supports). */
export type JsonSchema = Record<string, unknown> | boolean;

/**
 * Structured output in OpenAI's shapes: any JSON object, or JSON valid against a schema
 * (`schema`, or OpenAI's `json_schema: {name, schema, strict}`).
 */
export type ResponseFormat =
  | { type: 'text' }
  | { type: 'json_object' }
  | { type: 'json_schema'; schema: JsonSchema }
  | { type: 'json_schema'; json_schema: { name?: string; schema: JsonSchema; strict?: boolean; description?: string } };

/**
 * A grammar the output must match, exactly one of: a Lark grammar in llguidance's dialect
 * (`start` rule), a llama.cpp GBNF grammar (`root` rule; an error names the line of anything
 * that has no Lark equivalent), or a regular expression (Rust `regex` syntax) for the whole output.
 */
export type Grammar = { lark: string } | { gbnf: string } | { regex: string };

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
  /**
   * Constrain the output to JSON (every token is masked on the GPU to what the schema allows;
   * generation ends when the value is complete, or with `finishReason: 'length'`).
   */
  responseFormat?: ResponseFormat;
  /** Constrain the output to a grammar or regex (not together with `responseFormat`). */
  grammar?: Grammar;
  /**
   * Chat only: tools the model may call, rendered by its chat template. While a call is
   * generated its arguments are held to the tool's JSON Schema; the calls come back parsed in
   * `stats.toolCalls` (`finishReason: 'tool_calls'`) and the text before them in
   * `stats.content`. The streamed text shows the calls in the model's syntax, markers that are
   * control tokens (LFM2's `<|tool_call_start|>`) included. Not together with `responseFormat` /
   * `grammar` unless `toolChoice` is `'none'`.
   */
  tools?: ToolDefinition[];
  /**
   * `'auto'` (default: text, optionally followed by calls), `'required'` (calls only), `'none'`,
   * or one named function.
   */
  toolChoice?: ToolChoice;
}

/** OpenAI's function tool. */
export interface ToolDefinition {
  type?: 'function';
  function: { name: string; description?: string; parameters?: JsonSchema; strict?: boolean };
}

export type ToolChoice = 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } };

/** A call parsed from the model's answer. */
export interface ParsedToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

/** OpenAI's call as it appears in an assistant message. */
export interface ToolCallMessagePart {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/**
 * A streamed piece of a call, as OpenAI sends them: the first delta of call `index` carries its
 * `id`, `type` and `function.name` (arguments `''`); the following ones carry only the next piece
 * of `function.arguments` as the model writes it. Concatenated, the pieces are the arguments' JSON.
 */
export interface ToolCallDelta {
  index: number;
  id?: string;
  type?: 'function';
  function: { name?: string; arguments: string };
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
  finishReason: 'stop' | 'length' | 'aborted' | 'tool_calls';
  contextShifts: number;
  totalContextShifts: number;
  nPast: number;
  contextSize: number;
  /** CPU time of the constraint's token mask, ms per token (0 without a constraint). */
  maskMsPerToken: number;
  /**
   * GPU work per decoded token (the tokens after the first): compute dispatches, compute passes
   * and queue submissions the engine recorded for them (0 when at most one token was generated).
   */
  dispatchesPerToken: number;
  passesPerToken: number;
  submitsPerToken: number;
  /** With `tools`: the calls in the answer (empty when it is plain text). */
  toolCalls?: ParsedToolCall[];
  /** With `tools`: the answer's text before its calls (all of it when there are none). */
  content?: string;
}

/** A running generation: `for await (const {text} of stream)`; `await stream.stats`. */
export interface TokenStream extends AsyncIterableIterator<Token> {
  readonly stats: Promise<GenerationStats>;
  stop(): void;
  /** The whole text (consumes the stream). */
  text(): Promise<string>;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool' | string;
  /** May be null for an assistant message that only calls tools. */
  content: string | null;
  /** An assistant's calls (OpenAI's shape; `arguments` a JSON string or an object). */
  tool_calls?: ToolCallMessagePart[];
  /** A tool message: the call it answers. */
  tool_call_id?: string;
  name?: string;
}

export interface TokenizeOptions {
  addSpecial?: boolean;
  parseSpecial?: boolean;
}

/**
 * `detokenize` options, those of llama.cpp's `llama_detokenize`. All false by default: the text
 * is the pieces as generation streams them, put together.
 */
export interface DetokenizeOptions {
  /** Drop a leading BOS and a trailing EOS where the vocabulary adds them. */
  removeSpecial?: boolean;
  /** Render control tokens (`<|im_end|>`) as their text. */
  unparseSpecial?: boolean;
  /**
   * Clean up the text as `llama_detokenize` does for a whole sequence (lossy): a SentencePiece
   * vocabulary that adds a space prefix takes it off the first token; a byte-level BPE one
   * (except the Qwen 2 / 3 / 3.5 and GPT-4o families) drops the space before `? ! . ,`, around
   * a lone `'` and before `'s 'm 're 've`, like Hugging Face's `clean_up_tokenization_spaces`.
   */
  cleanUp?: boolean;
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

// ------------------------------------------------------------ the OpenAI-shaped API

export interface OpenAIChatMessage {
  role: 'system' | 'developer' | 'user' | 'assistant' | string;
  content: string | { type: 'text'; text: string }[] | null;
  name?: string;
  tool_calls?: ToolCallMessagePart[];
  tool_call_id?: string;
}

/** Fields common to both requests. Anything else (or n > 1, logprobs) is INVALID_ARGUMENT. */
export interface OpenAIRequestCommon {
  model?: string;
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean } | null;
  max_tokens?: number | null;
  max_completion_tokens?: number | null;
  /** OpenAI's default 1 (plain sampling: top_k, min_p off); 0 is greedy. */
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number | null;
  min_p?: number | null;
  seed?: number | null;
  stop?: string | string[] | null;
  frequency_penalty?: number | null;
  presence_penalty?: number | null;
  repeat_penalty?: number | null;
  n?: 1 | null;
  logprobs?: false | null;
  user?: string;
  metadata?: Record<string, string> | null;
  store?: boolean | null;
}

export interface ChatCompletionCreateParams extends OpenAIRequestCommon {
  messages: OpenAIChatMessage[];
  response_format?: ResponseFormat | null;
  /** Rendered by the model's chat template; calls come back in `message.tool_calls`. */
  tools?: ToolDefinition[] | null;
  tool_choice?: ToolChoice | null;
  parallel_tool_calls?: boolean | null;
}

export interface CompletionCreateParams extends OpenAIRequestCommon {
  prompt: string;
  echo?: false | null;
}

export type FinishReason = 'stop' | 'length' | 'tool_calls';

export interface CompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: { index: number; message: { role: 'assistant'; content: string | null; refusal: null; tool_calls?: ToolCallMessagePart[] }; logprobs: null; finish_reason: FinishReason }[];
  usage: CompletionUsage;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  /** Empty in the extra usage chunk of `stream_options.include_usage`. */
  choices: { index: number; delta: { role?: 'assistant'; content?: string; tool_calls?: ToolCallDelta[] }; logprobs: null; finish_reason: FinishReason | null }[];
  usage?: CompletionUsage;
}

export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: { index: number; text: string; logprobs: null; finish_reason: FinishReason | null }[];
  usage?: CompletionUsage;
}

/** A streamed response: `for await (const chunk of stream)`; `stop()` ends the generation. */
export interface ChunkStream<T> extends AsyncIterableIterator<T> {
  stop(): void;
}

export interface ChatCompletions {
  create(body: ChatCompletionCreateParams & { stream: true }): Promise<ChunkStream<ChatCompletionChunk>>;
  create(body: ChatCompletionCreateParams & { stream?: false | null }): Promise<ChatCompletion>;
  create(body: ChatCompletionCreateParams): Promise<ChatCompletion | ChunkStream<ChatCompletionChunk>>;
}

export interface Completions {
  create(body: CompletionCreateParams & { stream: true }): Promise<ChunkStream<Completion>>;
  create(body: CompletionCreateParams & { stream?: false | null }): Promise<Completion>;
  create(body: CompletionCreateParams): Promise<Completion | ChunkStream<Completion>>;
}

export interface OpenAIModels {
  list(): Promise<{ object: 'list'; data: { id: string; object: 'model'; created: number; owned_by: string }[] }>;
}

/**
 * The OpenAI-shaped members both engines have. `fetch` answers `/v1/chat/completions`,
 * `/v1/completions` and `/v1/models` (server-sent events when streaming):
 * `new OpenAI({ fetch: engine.fetch, baseURL: 'http://cera.local/v1', apiKey: 'unused', dangerouslyAllowBrowser: true })`.
 */
export interface OpenAICompatible {
  readonly completions: Completions;
  readonly models: OpenAIModels;
  fetch(input: string | URL | Request, init?: RequestInit): Promise<Response>;
}

export type ChatMethod = ((messages: ChatMessage[], options?: GenerateOptions) => TokenStream) & { readonly completions: ChatCompletions };

/** The OpenAI-shaped API over any engine with `chat`, `generate` and `info`. */
export function openaiApi(engine: {
  chat(messages: ChatMessage[], options?: GenerateOptions): TokenStream;
  generate(prompt: string, options?: GenerateOptions): TokenStream;
  info(): unknown;
}): OpenAICompatible & { chat: { completions: ChatCompletions } };
/** Add the OpenAI-shaped members to `engine` (both engines do this themselves). */
export function addOpenaiApi(engine: object, chatMethod: (messages: ChatMessage[], options?: GenerateOptions) => TokenStream): void;

/** Fetch and compile the .wasm once (Engine.load calls it). */
export function init(wasm?: string | URL | Response | WebAssembly.Module): Promise<unknown>;

export class Engine implements OpenAICompatible {
  private constructor();
  static load(source: ModelSource, options?: LoadOptions): Promise<Engine>;
  generate(prompt: string, options?: GenerateOptions): TokenStream;
  /** Chat as a token stream; `engine.chat.completions.create(...)` is OpenAI's API. */
  readonly chat: ChatMethod;
  readonly completions: Completions;
  readonly models: OpenAIModels;
  fetch(input: string | URL | Request, init?: RequestInit): Promise<Response>;
  tokenize(text: string, options?: TokenizeOptions): number[];
  detokenize(ids: ArrayLike<number>, options?: DetokenizeOptions): string;
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
export class WorkerEngine implements OpenAICompatible {
  private constructor();
  static load(source: ModelSource, options?: WorkerLoadOptions): Promise<WorkerEngine>;
  generate(prompt: string, options?: GenerateOptions): TokenStream;
  readonly chat: ChatMethod;
  readonly completions: Completions;
  readonly models: OpenAIModels;
  fetch(input: string | URL | Request, init?: RequestInit): Promise<Response>;
  tokenize(text: string, options?: TokenizeOptions): Promise<number[]>;
  detokenize(ids: ArrayLike<number>, options?: DetokenizeOptions): Promise<string>;
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

/**
 * Debug: bytes the wasm module on this thread has allocated and not yet freed (a worker engine's
 * heap is the worker's). Call `init()` first.
 */
export function wasmHeapLiveBytes(): number;

/** The kv_shift self-check of the GPU. */
export function gpuSelfCheck(): Promise<{
  adapter: unknown;
  backend: string;
  limits: Record<string, number>;
  cases: { name: string; maxAbsError: number; passed: boolean }[];
  passed: boolean;
}>;
