//! `softcap` (Gemma 2's final logit soft-capping) against its CPU reference: values from tiny
//! to far past the cap (where tanh saturates), odd counts, an offset range leaving its
//! neighbours untouched. Runs natively and in headless Chrome.

mod common;

use cera_web::gpu::readback::read_f32;
use cera_web::ops::softcap;
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

gpu_test!(softcap_matches_tanh_reference, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(41);
    for (count, cap) in [(1usize, 30.0f32), (37, 2.5), (1025, 50.0)] {
        let mut x: Vec<f32> = rng.vec(count + 3).iter().map(|v| v * 4.0 * cap).collect();
        x[1] = 1e-30;
        x[2] = -1e30;
        let buf = ctx.storage_buffer("x", bytemuck::cast_slice(&x));
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        softcap::encode(&ctx, &mut enc, &buf, 1, count as u32, cap).unwrap();
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(&ctx, &buf, 0, x.len()).await.unwrap();
        let want = softcap::reference(&x[1..1 + count], cap);
        for (i, (&g, &w)) in got[1..1 + count].iter().zip(&want).enumerate() {
            // |error| / cap: exp and a division in f32.
            let err = (g as f64 - w).abs() / cap as f64;
            assert!(
                err <= 1e-6,
                "softcap {count} x cap {cap}: [{i}] = {g}, want {w}"
            );
        }
        assert_eq!(got[0], x[0], "before the range");
        assert_eq!(&got[1 + count..], &x[1 + count..], "after the range");
    }
    let buf = ctx.empty_storage("x", 16).unwrap();
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    assert!(
        softcap::encode(&ctx, &mut enc, &buf, 2, 3, 1.0).is_err(),
        "past the end"
    );
    assert!(
        softcap::encode(&ctx, &mut enc, &buf, 0, 1, 0.0).is_err(),
        "zero cap"
    );
});
