//! Container log files as the runtime writes them: the CRI log format back into plain lines
//! (`format`, `render`), the query options (`options`), the files of a log including rotations
//! (`files`), streaming with follow across rotation (`reader`), and the log rotation task
//! (`rotation`).
//!
//! Architecture invariant: this crate knows the on-disk log format and nothing of HTTP; the
//! node API (`gantry-server`) serves what it reads.

pub mod files;
pub mod format;
pub mod options;
pub mod reader;
pub mod render;
pub mod rotation;

pub use options::{InvalidParam, LogOptions};
