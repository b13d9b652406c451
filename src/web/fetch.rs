//! Streaming fetch for the browser: the body is read chunk by chunk (never `arrayBuffer()`),
//! each chunk pushed straight on, so the wasm heap holds one chunk at a time.

use js_sys::{Function, Promise, Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use crate::error::{Error, ErrorCode, Result};

fn net(msg: String) -> Error {
    Error::new(ErrorCode::Network, msg)
}

fn js_msg(v: &JsValue) -> String {
    v.dyn_ref::<js_sys::Error>().map(|e| String::from(e.message())).or_else(|| v.as_string()).unwrap_or_else(|| format!("{v:?}"))
}

/// `fetch(url, {headers})` in a window or a worker.
async fn fetch(url: &str, range: Option<(u64, u64)>) -> Result<web_sys::Response> {
    let global = js_sys::global();
    let f: Function = Reflect::get(&global, &"fetch".into())
        .ok()
        .and_then(|f| f.dyn_into().ok())
        .ok_or_else(|| net("this environment has no fetch()".into()))?;
    let init = js_sys::Object::new();
    if let Some((a, b)) = range {
        let headers = js_sys::Object::new();
        let _ = Reflect::set(&headers, &"Range".into(), &format!("bytes={a}-{}", b - 1).into());
        let _ = Reflect::set(&init, &"headers".into(), &headers);
    }
    let p: Promise = f
        .call2(&global, &url.into(), &init)
        .map_err(|e| net(format!("fetch {url}: {}", js_msg(&e))))?
        .dyn_into()
        .map_err(|_| net("fetch did not return a promise".into()))?;
    let resp: web_sys::Response = JsFuture::from(p)
        .await
        .map_err(|e| net(format!("could not reach {url}: {}; check the URL and your connection", js_msg(&e))))?
        .dyn_into()
        .map_err(|_| net("fetch did not resolve to a Response".into()))?;
    if !resp.ok() {
        return Err(net(format!("{url} answered HTTP {} {}", resp.status(), resp.status_text())));
    }
    Ok(resp)
}

/// Stream `url`'s body into `on_chunk`; returns the Content-Length if the server sent one
/// (through `on_size`, before the first chunk).
pub async fn stream(
    url: &str,
    on_size: &mut dyn FnMut(Option<u64>) -> Result<()>,
    on_chunk: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let resp = fetch(url, None).await?;
    let len = resp.headers().get("content-length").ok().flatten().and_then(|s| s.parse::<u64>().ok());
    on_size(len)?;
    let body = resp.body().ok_or_else(|| net(format!("{url}: the response has no body")))?;
    let reader: web_sys::ReadableStreamDefaultReader =
        body.get_reader().dyn_into().map_err(|_| net("the response body cannot be read as a stream".into()))?;
    let mut buf = Vec::new();
    loop {
        let r = JsFuture::from(reader.read()).await.map_err(|e| net(format!("download of {url} broke off: {}", js_msg(&e))))?;
        let done = Reflect::get(&r, &"done".into()).ok().and_then(|d| d.as_bool()).unwrap_or(true);
        if done {
            break;
        }
        let value: Uint8Array = Reflect::get(&r, &"value".into())
            .ok()
            .and_then(|v| v.dyn_into().ok())
            .ok_or_else(|| net("a body chunk was not bytes".into()))?;
        buf.resize(value.length() as usize, 0);
        value.copy_to(&mut buf);
        on_chunk(&buf)?;
    }
    Ok(())
}

/// Bytes `[start, end)` of `url` (an HTTP Range request).
pub async fn range(url: &str, start: u64, end: u64) -> Result<Vec<u8>> {
    let resp = fetch(url, Some((start, end))).await?;
    let p = resp.array_buffer().map_err(|e| net(js_msg(&e)))?;
    let ab = JsFuture::from(p).await.map_err(|e| net(js_msg(&e)))?;
    let bytes = Uint8Array::new(&ab).to_vec();
    if resp.status() != 206 || bytes.len() as u64 != end - start {
        return Err(net(format!("{url}: the server ignored the Range request (HTTP {})", resp.status())));
    }
    Ok(bytes)
}

/// Load a model from `url` onto `ctx`, streaming.
pub async fn load_url(
    ctx: &crate::gpu::GpuContext,
    url: &str,
    on_progress: &mut dyn FnMut(crate::loader::Progress),
) -> Result<crate::loader::LoadedModel> {
    // Both callbacks need the loader: the size one creates it, the chunk one feeds it.
    let loader: std::cell::RefCell<Option<crate::loader::StreamLoader>> = std::cell::RefCell::new(None);
    stream(
        url,
        &mut |size| {
            *loader.borrow_mut() = Some(crate::loader::StreamLoader::new(ctx, size));
            Ok(())
        },
        &mut |chunk| {
            let mut guard = loader.borrow_mut();
            let l = guard.as_mut().expect("created on the size callback");
            l.push(chunk)?;
            on_progress(l.progress());
            Ok(())
        },
    )
    .await?;
    let l = loader.into_inner().ok_or_else(|| net("no response".into()))?;
    l.finish()
}

/// Bytes of linear memory the wasm module has now: it only grows, so this is the peak heap.
pub fn wasm_memory_bytes() -> u64 {
    core::arch::wasm32::memory_size(0) as u64 * 65536
}
