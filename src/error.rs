//! One error type for the whole engine, with a stable code that the JS boundary exposes.

use std::fmt;

/// Stable error codes: JS sees these strings as `error.code`, so never rename one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// No WebGPU (browser) or no GPU adapter at all (native).
    NoWebgpu,
    /// The adapter's limits are below what the work needs.
    AdapterTooSmall,
    /// The GPU device was lost or an operation on it failed.
    DeviceLost,
    /// A malformed or truncated GGUF file.
    BadGguf,
    UnsupportedArch,
    UnsupportedQuant,
    Network,
    Aborted,
    ContextFull,
    /// The caller passed something out of range (documented per function).
    InvalidArgument,
    /// A bug in cera-web (e.g. a shader that fails validation).
    Internal,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NoWebgpu => "NO_WEBGPU",
            ErrorCode::AdapterTooSmall => "ADAPTER_TOO_SMALL",
            ErrorCode::DeviceLost => "DEVICE_LOST",
            ErrorCode::BadGguf => "BAD_GGUF",
            ErrorCode::UnsupportedArch => "UNSUPPORTED_ARCH",
            ErrorCode::UnsupportedQuant => "UNSUPPORTED_QUANT",
            ErrorCode::Network => "NETWORK",
            ErrorCode::Aborted => "ABORTED",
            ErrorCode::ContextFull => "CONTEXT_FULL",
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::Internal => "INTERNAL",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An engine error: a stable [`ErrorCode`] and a message that says what is wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::InvalidArgument, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Internal, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;
