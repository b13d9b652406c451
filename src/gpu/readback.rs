//! The one readback path, for both targets: copy to a mappable buffer, `map_async` into a
//! channel, await it. Natively we also block in `device.poll` so the callback fires; in the
//! browser the event loop drives it.

use super::GpuContext;
use crate::error::{Error, ErrorCode, Result};

/// Read `size` bytes at `offset` of `src` (which needs `COPY_SRC`). Offset and size are rounded
/// out to 4 bytes for the copy and trimmed after.
pub async fn read_buffer(
    ctx: &GpuContext,
    src: &wgpu::Buffer,
    offset: u64,
    size: u64,
) -> Result<Vec<u8>> {
    if size == 0 {
        return Ok(Vec::new());
    }
    let start = offset & !3;
    let end = (offset + size).div_ceil(4) * 4;
    let len = end - start;
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback staging"),
        size: len,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("readback"),
        });
    enc.copy_buffer_to_buffer(src, start, &staging, 0, len);
    ctx.queue.submit([enc.finish()]);

    let mut bytes = map_read(ctx, &staging, len).await?;
    staging.destroy();
    let lo = (offset - start) as usize;
    bytes.truncate(lo + size as usize);
    bytes.drain(..lo);
    Ok(bytes)
}

/// Map the first `len` bytes of a `MAP_READ` buffer whose copy was submitted, copy them out and
/// unmap it. [`read_buffer`] adds its own copy and submit; the sampler's copy rides in the
/// token's encoder.
pub(crate) async fn map_read(
    ctx: &GpuContext,
    staging: &wgpu::Buffer,
    len: u64,
) -> Result<Vec<u8>> {
    let (tx, rx) = futures_channel::oneshot::channel();
    staging
        .slice(..len)
        .map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
    #[cfg(not(target_arch = "wasm32"))]
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| {
            Error::new(
                ErrorCode::DeviceLost,
                format!("waiting for the GPU failed: {e}"),
            )
        })?;
    let mapped = rx
        .await
        .map_err(|_| Error::new(ErrorCode::DeviceLost, "the GPU dropped a readback"))?;
    mapped.map_err(|e| {
        Error::new(
            ErrorCode::DeviceLost,
            format!("mapping a readback buffer failed: {e}"),
        )
    })?;
    ctx.check_errors()?;
    let bytes = staging
        .slice(..len)
        .get_mapped_range()
        .map_err(|e| {
            Error::new(
                ErrorCode::DeviceLost,
                format!("reading a mapped buffer failed: {e:?}"),
            )
        })?
        .to_vec();
    staging.unmap();
    Ok(bytes)
}

/// [`read_buffer`] as f32 values.
pub async fn read_f32(
    ctx: &GpuContext,
    src: &wgpu::Buffer,
    offset: u64,
    count: usize,
) -> Result<Vec<f32>> {
    let bytes = read_buffer(ctx, src, offset, count as u64 * 4).await?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
