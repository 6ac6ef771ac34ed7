//! Running helper programs (gcc, busybox, ctr, ip) with errors that say what failed.

use std::process::{Command, Output};

use crate::error::{Result, TestkitError};

/// Human-readable rendering of a command line for error messages and logs.
fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

fn check(command: String, output: std::io::Result<Output>) -> Result<Vec<u8>> {
    let output = output.map_err(|source| TestkitError::Io { context: format!("spawn `{command}`"), source })?;
    if output.status.success() {
        return Ok(output.stdout);
    }
    Err(TestkitError::Command {
        command,
        status: output.status.to_string(),
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

/// Run to completion, returning stdout; a non-zero exit is an error carrying stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<Vec<u8>> {
    cmd.env("PATH", crate::prereq::tool_path());
    let command = describe(cmd);
    tracing::debug!(%command, "running");
    check(command, cmd.output())
}

/// Async flavour of [`run`] for commands issued from inside the runtime.
pub(crate) async fn run_async(mut cmd: Command) -> Result<Vec<u8>> {
    cmd.env("PATH", crate::prereq::tool_path());
    let command = describe(&cmd);
    tracing::debug!(%command, "running");
    let output = tokio::process::Command::from(cmd).output().await;
    check(command, output)
}

/// Whether `name` resolves to an executable file through `path` (a `$PATH`-style list).
pub(crate) fn on_path_in(name: &str, path: &std::ffi::OsStr) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let is_exec =
        |p: &std::path::Path| p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    std::env::split_paths(path).any(|dir| is_exec(&dir.join(name)))
}
