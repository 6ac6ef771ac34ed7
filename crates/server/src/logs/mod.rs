//! `/containerLogs`: the request (`service`: pod, container and instance lookup, streaming from
//! a blocking thread) and its axum handler (`http`). The log format and files are `gantry-logs`.

pub mod http;
pub mod service;
