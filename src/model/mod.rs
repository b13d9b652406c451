//! Transformer models: hyperparameters, tensor names, weights on the GPU and the forward pass.

pub mod forward;
pub mod hparams;
mod kernels;
pub mod names;

pub use forward::{ForwardPlan, LogitRows, Model, Workspace};
pub use hparams::{Activation, Arch, HParams};
