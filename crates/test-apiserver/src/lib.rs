//! In-process test API server (under construction).
