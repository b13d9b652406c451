//! Where a model's bytes come from in the browser: a URL (fetched as a stream, resumed with an
//! HTTP Range request when the connection drops, optionally read from / written to the Cache
//! API), a `Blob`/`File`, a `ReadableStream` or an `ArrayBuffer`/`Uint8Array`.
//!
//! Every source is read chunk by chunk into one reusable buffer: the wasm heap holds one chunk at
//! a time, never the file (docs/architecture.md, decision 2). The abort signal is checked between chunks and
//! also passed to `fetch`, so a stalled download ends at once.

use js_sys::{Function, Promise, Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use crate::error::{Error, ErrorCode, Result};

/// How many times a dropped download is resumed (from the byte reached) before giving up.
pub const RESUME_ATTEMPTS: u32 = 4;
/// `ArrayBuffer` sources are pushed in slices of this size (like a network would).
const SLICE: u32 = 1 << 20;
/// The Cache API cache holding models, unless the caller names another.
pub const DEFAULT_CACHE: &str = "cera-web-models";

/// A model source as the caller gave it.
pub enum Source {
    Url(String),
    Blob(web_sys::Blob),
    Stream(web_sys::ReadableStream),
    Bytes(Uint8Array),
}

impl Source {
    pub fn from_js(v: &JsValue) -> Result<Source> {
        if let Some(s) = v.as_string() {
            return Ok(Source::Url(s));
        }
        if let Some(u) = v.dyn_ref::<web_sys::Url>() {
            return Ok(Source::Url(u.href()));
        }
        if let Some(b) = v.dyn_ref::<web_sys::Blob>() {
            return Ok(Source::Blob(b.clone()));
        }
        if let Some(s) = v.dyn_ref::<web_sys::ReadableStream>() {
            return Ok(Source::Stream(s.clone()));
        }
        if v.is_instance_of::<js_sys::ArrayBuffer>() {
            return Ok(Source::Bytes(Uint8Array::new(v)));
        }
        if let Some(u) = v.dyn_ref::<Uint8Array>() {
            return Ok(Source::Bytes(u.clone()));
        }
        Err(Error::invalid(
            "Engine.load: the source must be a URL string, a File/Blob, a ReadableStream, an ArrayBuffer or a Uint8Array",
        ))
    }

    pub fn describe(&self) -> String {
        match self {
            Source::Url(u) => u.clone(),
            Source::Blob(b) => match b.dyn_ref::<web_sys::File>() {
                Some(f) => f.name(),
                None => format!("Blob of {} bytes", b.size() as u64),
            },
            Source::Stream(_) => "ReadableStream".into(),
            Source::Bytes(b) => format!("ArrayBuffer of {} bytes", b.length()),
        }
    }
}

pub fn net(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::Network, msg)
}

pub fn aborted() -> Error {
    Error::new(
        ErrorCode::Aborted,
        "the load was aborted (its AbortSignal fired); nothing is left on the GPU",
    )
}

pub fn js_msg(v: &JsValue) -> String {
    v.dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| v.as_string())
        .unwrap_or_else(|| format!("{v:?}"))
}

/// What a chunk consumer sees: each chunk, in order. Returning an error stops the read.
pub type OnChunk<'a> = dyn FnMut(&[u8]) -> Result<()> + 'a;

/// The abort signal, checked between chunks.
#[derive(Clone, Default)]
pub struct Abort(pub Option<web_sys::AbortSignal>);

impl Abort {
    pub fn check(&self) -> Result<()> {
        match &self.0 {
            Some(s) if s.aborted() => Err(aborted()),
            _ => Ok(()),
        }
    }
}

/// Read `stream` to its end into `on_chunk`. `Err(JsValue)` is a read failure (the caller
/// decides whether it resumes); engine errors from `on_chunk` come back as `Ok(Err(..))`.
async fn pump(
    stream: &web_sys::ReadableStream,
    abort: &Abort,
    buf: &mut Vec<u8>,
    on_chunk: &mut OnChunk<'_>,
) -> std::result::Result<Result<()>, JsValue> {
    let reader: web_sys::ReadableStreamDefaultReader = stream.get_reader().dyn_into()?;
    loop {
        if let Err(e) = abort.check() {
            let _ = reader.cancel();
            return Ok(Err(e));
        }
        let r = JsFuture::from(reader.read()).await?;
        if Reflect::get(&r, &"done".into())?.as_bool().unwrap_or(true) {
            return Ok(Ok(()));
        }
        let value: Uint8Array = Reflect::get(&r, &"value".into())?.dyn_into()?;
        buf.resize(value.length() as usize, 0);
        value.copy_to(buf);
        if let Err(e) = on_chunk(buf) {
            let _ = reader.cancel();
            return Ok(Err(e));
        }
    }
}

/// `fetch(url)` in a window or a worker: from byte `from` on when non-zero, up to byte `to`
/// (exclusive) when given, each as an HTTP Range request.
pub(crate) async fn fetch(
    url: &str,
    from: u64,
    to: Option<u64>,
    abort: &Abort,
) -> Result<web_sys::Response> {
    let global = js_sys::global();
    let f: Function = Reflect::get(&global, &"fetch".into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or_else(|| net("this environment has no fetch()"))?;
    let init = js_sys::Object::new();
    if from > 0 || to.is_some() {
        let end = to
            .map(|t| t.saturating_sub(1).to_string())
            .unwrap_or_default();
        let headers = js_sys::Object::new();
        let _ = Reflect::set(
            &headers,
            &"Range".into(),
            &format!("bytes={from}-{end}").into(),
        );
        let _ = Reflect::set(&init, &"headers".into(), &headers);
    }
    if let Some(s) = &abort.0 {
        let _ = Reflect::set(&init, &"signal".into(), s);
    }
    let p: Promise = f
        .call2(&global, &url.into(), &init)
        .map_err(|e| net(format!("fetch {url}: {}", js_msg(&e))))?
        .dyn_into()
        .map_err(|_| net("fetch did not return a promise"))?;
    let resp = JsFuture::from(p).await.map_err(|e| {
        if abort.check().is_err() {
            aborted()
        } else {
            net(format!("could not reach {url}: {}; check the URL, the server's CORS headers and your connection", js_msg(&e)))
        }
    })?;
    let resp: web_sys::Response = resp
        .dyn_into()
        .map_err(|_| net("fetch did not resolve to a Response"))?;
    if !resp.ok() {
        return Err(net(format!(
            "{url} answered HTTP {} {}",
            resp.status(),
            resp.status_text()
        )));
    }
    Ok(resp)
}

fn header(resp: &web_sys::Response, name: &str) -> Option<String> {
    resp.headers().get(name).ok().flatten()
}

/// A resumed (206) response must continue the same file from byte `reached`: its Content-Range
/// (`bytes START-END/TOTAL`) starts there and names the first response's size, and its ETag is
/// the first one's. Either header may be missing (or hidden by CORS): then that check is skipped.
/// A mismatch means the file changed on the server between the two requests; splicing the two
/// would load a model made of two files, so the load fails.
fn check_resumed(
    url: &str,
    resp: &web_sys::Response,
    reached: u64,
    total: Option<u64>,
    etag: Option<&str>,
) -> Result<()> {
    if let (Some(before), Some(now)) = (etag, header(resp, "etag")) {
        if before != now {
            return Err(net(format!(
                "{url} changed on the server during the download (ETag {before} before byte {reached}, {now} after); load it again"
            )));
        }
    }
    if let Some(range) = header(resp, "content-range") {
        // "bytes 1000-2047/2048"; a total of "*" is unknown.
        let parsed = range
            .strip_prefix("bytes ")
            .and_then(|r| r.split_once('/'))
            .and_then(|(span, size)| {
                let start = span.split_once('-')?.0.trim().parse::<u64>().ok()?;
                Some((start, size.trim().parse::<u64>().ok()))
            });
        let ok = match parsed {
            Some((start, size)) => {
                start == reached
                    && match (size, total) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    }
            }
            None => false,
        };
        if !ok {
            return Err(net(format!(
                "{url} changed on the server during the download: resuming at byte {reached} of {total:?}, the server answered Content-Range {range:?}; load it again"
            )));
        }
    }
    Ok(())
}

fn content_length(resp: &web_sys::Response) -> Option<u64> {
    resp.headers()
        .get("content-length")
        .ok()
        .flatten()
        .and_then(|s| s.parse::<u64>().ok())
}

/// The Cache API's `caches`, when this context has it (secure contexts only).
fn caches() -> Option<web_sys::CacheStorage> {
    Reflect::get(&js_sys::global(), &"caches".into())
        .ok()
        .and_then(|c| c.dyn_into().ok())
}

async fn open_cache(name: &str) -> Option<web_sys::Cache> {
    let c = caches()?;
    JsFuture::from(c.open(name)).await.ok()?.dyn_into().ok()
}

/// Where the bytes of a load came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Origin {
    Network,
    Cache,
    File,
    Stream,
    Memory,
}

/// The outcome of reading one source.
pub struct ReadReport {
    pub origin: Origin,
    /// Times the download was resumed with a Range request.
    pub resumes: u32,
    /// Whether the bytes were written to the Cache API.
    pub cached: bool,
}

/// Read `source` to its end, chunk by chunk. `on_size` gets the total size (when known) before
/// the first chunk. `cache`: the Cache API cache name to read from and fill (URLs only).
pub async fn read(
    source: &Source,
    cache: Option<&str>,
    abort: &Abort,
    on_size: &mut dyn FnMut(Option<u64>, Origin) -> Result<()>,
    on_chunk: &mut OnChunk<'_>,
) -> Result<ReadReport> {
    let mut buf = Vec::new();
    abort.check()?;
    match source {
        Source::Url(url) => read_url(url, cache, abort, &mut buf, on_size, on_chunk).await,
        Source::Blob(b) => {
            on_size(Some(b.size() as u64), Origin::File)?;
            let r = pump(&b.stream(), abort, &mut buf, on_chunk)
                .await
                .map_err(|e| net(format!("reading the file failed: {}", js_msg(&e))))?;
            r.map(|_| ReadReport {
                origin: Origin::File,
                resumes: 0,
                cached: false,
            })
        }
        Source::Stream(s) => {
            on_size(None, Origin::Stream)?;
            let r = pump(s, abort, &mut buf, on_chunk)
                .await
                .map_err(|e| net(format!("the stream failed: {}", js_msg(&e))))?;
            r.map(|_| ReadReport {
                origin: Origin::Stream,
                resumes: 0,
                cached: false,
            })
        }
        Source::Bytes(u) => {
            let n = u.length();
            on_size(Some(n as u64), Origin::Memory)?;
            let mut at = 0;
            while at < n {
                abort.check()?;
                let end = (at + SLICE).min(n);
                let part = u.subarray(at, end);
                buf.resize(part.length() as usize, 0);
                part.copy_to(&mut buf);
                on_chunk(&buf)?;
                at = end;
            }
            Ok(ReadReport {
                origin: Origin::Memory,
                resumes: 0,
                cached: false,
            })
        }
    }
}

async fn read_url(
    url: &str,
    cache: Option<&str>,
    abort: &Abort,
    buf: &mut Vec<u8>,
    on_size: &mut dyn FnMut(Option<u64>, Origin) -> Result<()>,
    on_chunk: &mut OnChunk<'_>,
) -> Result<ReadReport> {
    let cache = match cache {
        Some(name) => open_cache(name).await,
        None => None,
    };
    // A cache hit: stream from the cache, no network at all.
    if let Some(c) = &cache {
        if let Ok(hit) = JsFuture::from(c.match_with_str(url)).await {
            if let Ok(resp) = hit.dyn_into::<web_sys::Response>() {
                if let Some(body) = resp.body() {
                    on_size(content_length(&resp), Origin::Cache)?;
                    let r = pump(&body, abort, buf, on_chunk).await.map_err(|e| {
                        net(format!(
                            "reading {url} from the cache failed: {}",
                            js_msg(&e)
                        ))
                    })?;
                    return r.map(|_| ReadReport {
                        origin: Origin::Cache,
                        resumes: 0,
                        cached: true,
                    });
                }
            }
        }
    }

    let mut reached = 0u64;
    let mut total: Option<u64> = None;
    // The first response's ETag: a resumed response must carry the same one (when the server
    // sends and, cross-origin, exposes it), or the bytes after the break come from another file.
    let mut etag: Option<String> = None;
    let mut resumes = 0u32;
    let mut put: Option<Promise> = None;
    loop {
        let resp = fetch(url, reached, None, abort).await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) if e.code == ErrorCode::Network && reached > 0 && resumes < RESUME_ATTEMPTS => {
                resumes += 1;
                sleep_ms(200 * resumes).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if reached == 0 {
            total = content_length(&resp);
            etag = header(&resp, "etag");
            on_size(total, Origin::Network)?;
        } else if resp.status() != 206 {
            return Err(net(format!(
                "the download of {url} broke off at byte {reached} and the server does not support Range requests to resume it (HTTP {})",
                resp.status()
            )));
        } else {
            check_resumed(url, &resp, reached, total, etag.as_deref())?;
        }
        let body = resp
            .body()
            .ok_or_else(|| net(format!("{url}: the response has no body")))?;
        // On the first full response, tee the body: one branch to the GPU, one to the cache.
        let body = match (&cache, reached) {
            (Some(c), 0) => {
                let branches = body.tee();
                let (a, b): (web_sys::ReadableStream, web_sys::ReadableStream) = (
                    branches.get(0).unchecked_into(),
                    branches.get(1).unchecked_into(),
                );
                let init = web_sys::ResponseInit::new();
                let headers = web_sys::Headers::new().map_err(|e| net(js_msg(&e)))?;
                if let Some(t) = total {
                    let _ = headers.set("content-length", &t.to_string());
                }
                let _ = headers.set("content-type", "application/octet-stream");
                init.set_headers(&headers);
                if let Ok(r) =
                    web_sys::Response::new_with_opt_readable_stream_and_init(Some(&b), &init)
                {
                    let p = c.put_with_str(url, &r);
                    // A failed put (quota, a dropped connection) is not a failed load: the caught
                    // promise resolves to `false` then.
                    let catch: Option<Function> = Reflect::get(&p, &"catch".into())
                        .ok()
                        .and_then(|f| f.dyn_into().ok());
                    put = catch
                        .and_then(|f| f.call1(&p, &Function::new_no_args("return false")).ok())
                        .and_then(|v| v.dyn_into::<Promise>().ok());
                }
                a
            }
            _ => body,
        };
        let mut counted = |chunk: &[u8]| {
            reached += chunk.len() as u64;
            on_chunk(chunk)
        };
        match pump(&body, abort, buf, &mut counted).await {
            Ok(Ok(())) if total.is_none_or(|t| reached >= t) => break,
            Ok(Ok(())) | Err(_) if resumes < RESUME_ATTEMPTS => {
                abort.check()?;
                // The cache branch broke with the connection: this load will not be cached.
                put = None;
                resumes += 1;
                sleep_ms(200 * resumes).await;
            }
            Ok(Ok(())) => {
                return Err(net(format!(
                    "the download of {url} ended at byte {reached} of {:?}",
                    total
                )))
            }
            Ok(Err(e)) => return Err(e),
            Err(e) => {
                abort.check()?;
                return Err(net(format!("the download of {url} broke off at byte {reached} ({}) and could not be resumed", js_msg(&e))));
            }
        }
    }
    // Wait for the cache copy, so the next load finds it.
    let cached = match put {
        Some(p) => JsFuture::from(p)
            .await
            .map(|v| v != JsValue::FALSE)
            .unwrap_or(false),
        None => false,
    };
    if cache.is_some() && !cached {
        // The load itself succeeded; say why the next one downloads again. The Cache API writes
        // an entry only once its body is complete, so a failed put leaves no partial entry.
        web_sys::console::warn_1(
            &format!(
                "cera-web: {url} loaded from the network but was not stored in the cache ({}); the next load downloads it again",
                if resumes > 0 {
                    "the download was resumed"
                } else {
                    "the cache refused it: storage quota?"
                }
            )
            .into(),
        );
    }
    Ok(ReadReport {
        origin: Origin::Network,
        resumes,
        cached,
    })
}

/// Remove `url` from the cache (after an integrity failure).
pub async fn evict(cache: &str, url: &str) {
    if let Some(c) = open_cache(cache).await {
        let _ = JsFuture::from(c.delete_with_str(url)).await;
    }
}

pub async fn sleep_ms(ms: u32) {
    let p = Promise::new(&mut |resolve, _| {
        let global = js_sys::global();
        if let Ok(f) =
            Reflect::get(&global, &"setTimeout".into()).and_then(|f| f.dyn_into::<Function>())
        {
            let _ = f.call2(&global, &resolve, &JsValue::from(ms));
        } else {
            let _ = resolve.call0(&JsValue::NULL);
        }
    });
    let _ = JsFuture::from(p).await;
}

/// The part URLs of a split GGUF named like `name-00001-of-00003.gguf`, or just `url`.
pub fn split_urls(url: &str) -> Vec<String> {
    let (path, query) = match url.find(['?', '#']) {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, ""),
    };
    let Some(stem) = path.strip_suffix(".gguf") else {
        return vec![url.to_string()];
    };
    let b = stem.as_bytes();
    // ...-NNNNN-of-MMMMM
    if b.len() < 15 || &stem[stem.len() - 9..stem.len() - 5] != "-of-" || b[b.len() - 15] != b'-' {
        return vec![url.to_string()];
    }
    let no = &stem[stem.len() - 14..stem.len() - 9];
    let count = &stem[stem.len() - 5..];
    let (Ok(no), Ok(count)) = (no.parse::<u32>(), count.parse::<u32>()) else {
        return vec![url.to_string()];
    };
    if no != 1 || count < 2 {
        return vec![url.to_string()];
    }
    let base = &stem[..stem.len() - 15];
    (1..=count)
        .map(|i| format!("{base}-{i:05}-of-{count:05}.gguf{query}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split_urls;

    #[wasm_bindgen_test::wasm_bindgen_test]
    fn split_names() {
        assert_eq!(split_urls("/m/a.gguf"), vec!["/m/a.gguf"]);
        assert_eq!(
            split_urls("/m/a-00001-of-00003.gguf?x=1"),
            vec![
                "/m/a-00001-of-00003.gguf?x=1",
                "/m/a-00002-of-00003.gguf?x=1",
                "/m/a-00003-of-00003.gguf?x=1"
            ]
        );
        assert_eq!(
            split_urls("/m/a-00002-of-00003.gguf"),
            vec!["/m/a-00002-of-00003.gguf"]
        );
    }
}
