//! Chat templates (placeholder, filled in below).
