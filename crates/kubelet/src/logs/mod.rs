//! Container logs: the CRI log format back into plain lines (`format`, `render`), the query
//! options (`options`), the files of a log including rotations (`files`), streaming with
//! follow across rotation (`reader`), the `/containerLogs` request (`service`) and the log
//! rotation task (`rotation`).

pub mod files;
pub mod format;
pub mod http;
pub mod options;
pub mod reader;
pub mod render;
pub mod rotation;
pub mod service;

pub use options::{InvalidParam, LogOptions};
