//! Bench knobs: environment variables that override a kernel-shape decision on native builds, so
//! `cera bench` can compare shapes on a GPU without a rebuild (`docs/benchmarking.md` lists
//! them). Read when a plan is built, never per token; the browser has none.

/// The knob's value, natively; `None` when unset and always in the browser.
pub fn knob(name: &str) -> Option<String> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::env::var(name).ok()
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = name;
        None
    }
}

/// A numeric knob; a value that is not a number is reported and ignored.
pub fn knob_u64(name: &str) -> Option<u64> {
    let v = knob(name)?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => {
            eprintln!("{name}={v:?} is not a number; using the default");
            None
        }
    }
}

/// Whether an on/off knob is set to `1` (on).
pub fn knob_on(name: &str) -> bool {
    knob(name).is_some_and(|v| v.trim() == "1")
}

/// Whether an on/off knob is set to `0` (off).
pub fn knob_off(name: &str) -> bool {
    knob(name).is_some_and(|v| v.trim() == "0")
}
