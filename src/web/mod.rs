//! The JS boundary (wasm32 only): thin, typed, errors as `Error` objects with a stable `code`.

use wasm_bindgen::prelude::*;

pub mod engine;
pub mod fetch;
pub mod heap;
pub mod source;

use crate::error::Error;
use crate::gpu::{GpuContext, LimitRequest};

#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
}

/// A JS `Error` whose `code` property is the stable [`crate::ErrorCode`] string.
pub fn js_error(e: Error) -> JsValue {
    let err = js_sys::Error::new(&e.message);
    let _ = js_sys::Reflect::set(
        &err,
        &JsValue::from_str("code"),
        &JsValue::from_str(e.code.as_str()),
    );
    err.into()
}

fn to_js<T: serde::Serialize>(v: &T) -> Result<JsValue, JsValue> {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| js_error(Error::internal(e.to_string())))
}

/// Open the GPU and run the `kv_shift` self-check; resolves to
/// `{adapter, backend, limits, cases: [{name, maxAbsError, passed}], passed}`.
#[wasm_bindgen(js_name = gpuSelfCheck)]
pub async fn gpu_self_check() -> Result<JsValue, JsValue> {
    let ctx = GpuContext::new(&LimitRequest::default())
        .await
        .map_err(js_error)?;
    let report = crate::selfcheck::run(&ctx).await.map_err(js_error)?;
    to_js(&report)
}
