//! Teacher-forced scoring: run given token ids through the model in batches and report, for
//! every position, the top next tokens (what `cera score` prints and the llama.cpp checks use).

use crate::error::Result;
use crate::gpu::readback::read_f32;
use crate::gpu::GpuContext;
use crate::model::{LogitRows, Model};

/// The `k` best `(id, logit)` of each position of `tokens` from `from` on, best first.
///
/// `batch` tokens are evaluated per forward pass. Positions before `from` only fill the cache
/// (one row of logits per batch); from `from` on every row's logits are read back whole (a test
/// and analysis path, not generation).
pub async fn score(ctx: &GpuContext, model: &Model, tokens: &[u32], from: usize, k: usize, batch: u32) -> Result<Vec<Vec<(u32, f32)>>> {
    let n_vocab = model.hp.n_vocab as usize;
    let mut out = Vec::with_capacity(tokens.len().saturating_sub(from));
    forward_rows(ctx, model, tokens, from, batch, &mut |logits| out.extend(logits.chunks_exact(n_vocab).map(|row| top_k(row, k)))).await?;
    Ok(out)
}

/// Run `tokens` through a fresh cache in batches of `batch`; `on_rows` gets the full logits
/// `(rows, n_vocab)` of every chunk at or after position `from`.
async fn forward_rows(
    ctx: &GpuContext,
    model: &Model,
    tokens: &[u32],
    from: usize,
    batch: u32,
    on_rows: &mut dyn FnMut(Vec<f32>),
) -> Result<()> {
    let n_vocab = model.hp.n_vocab as usize;
    let batch = batch.max(1) as usize;
    let mut kv = model.new_kv_cache(ctx, (tokens.len() as u32).max(1))?;
    let ws = model.workspace(ctx, batch as u32, batch as u32)?;
    let mut pos = 0usize;
    while pos < tokens.len() {
        // Chunks end at `from` so every reported row comes from an `All` pass.
        let end = if pos < from { from.min(pos + batch) } else { (pos + batch).min(tokens.len()) };
        let chunk = &tokens[pos..end];
        let rows = if pos >= from { LogitRows::All } else { LogitRows::Last };
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        model.encode(ctx, &mut enc, &ws, &kv, chunk, pos as u32, rows)?;
        ctx.submit([enc.finish()]);
        kv.advance(chunk.len() as u32)?;
        if rows == LogitRows::All {
            on_rows(read_f32(ctx, &ws.logits, 0, chunk.len() * n_vocab).await?);
        }
        pos = end;
    }
    Ok(())
}

/// The `k` largest `(index, value)`, best first; ties by lower index.
pub fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &v) in row.iter().enumerate() {
        if best.len() < k || v > best[best.len() - 1].1 {
            let at = best.iter().position(|&(_, b)| v > b).unwrap_or(best.len());
            best.insert(at, (i as u32, v));
            best.truncate(k);
        }
    }
    best
}

/// Every position's full logits, `(tokens.len(), n_vocab)` row-major (tests on small vocabularies).
pub async fn score_logits(ctx: &GpuContext, model: &Model, tokens: &[u32], batch: u32) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(tokens.len() * model.hp.n_vocab as usize);
    forward_rows(ctx, model, tokens, 0, batch, &mut |logits| out.extend(logits)).await?;
    Ok(out)
}
