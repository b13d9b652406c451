//! Streaming fetch for the browser: the body is read chunk by chunk (never `arrayBuffer()`),
//! each chunk pushed straight on, so the wasm heap holds one chunk at a time.

use js_sys::Uint8Array;
use wasm_bindgen_futures::JsFuture;

use super::source::{fetch, js_msg, net, read, Abort, Source};
use crate::error::Result;

/// Stream `url`'s body into `on_chunk`, after `on_size` gets the Content-Length (if sent).
/// The same reader as the `Engine`'s ([`super::source::read`]), without cache or abort.
pub async fn stream(
    url: &str,
    on_size: &mut dyn FnMut(Option<u64>) -> Result<()>,
    on_chunk: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let src = Source::Url(url.to_string());
    read(
        &src,
        None,
        &Abort(None),
        &mut |size, _| on_size(size),
        on_chunk,
    )
    .await
    .map(|_| ())
}

/// Bytes `[start, end)` of `url` (an HTTP Range request).
pub async fn range(url: &str, start: u64, end: u64) -> Result<Vec<u8>> {
    let resp = fetch(url, start, Some(end), &Abort(None)).await?;
    let p = resp.array_buffer().map_err(|e| net(js_msg(&e)))?;
    let ab = JsFuture::from(p).await.map_err(|e| net(js_msg(&e)))?;
    let bytes = Uint8Array::new(&ab).to_vec();
    if resp.status() != 206 || bytes.len() as u64 != end - start {
        return Err(net(format!(
            "{url}: the server ignored the Range request (HTTP {})",
            resp.status()
        )));
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
    let loader: std::cell::RefCell<Option<crate::loader::StreamLoader>> =
        std::cell::RefCell::new(None);
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
    let l = loader.into_inner().ok_or_else(|| net("no response"))?;
    l.finish()
}

/// Bytes of linear memory the wasm module has now: it only grows, so this is the peak heap.
pub fn wasm_memory_bytes() -> u64 {
    core::arch::wasm32::memory_size(0) as u64 * 65536
}
