//! Lifecycle hooks (`postStart`, `preStop`) with `exec`, `httpGet` and `sleep`, and the upstream
//! failure messages.

use std::time::Duration;

use k8s_openapi::api::core::v1::{LifecycleHandler, Pod};

use super::handlers::{self, ExecError, HttpError, Target};
use gantry_vocab::spec;

/// Upstream never lets preStop eat the whole grace period: StopContainer gets at least this.
pub const MIN_GRACE: Duration = Duration::from_secs(2);

/// Why a hook failed, with upstream's messages (`pod` is `name_namespace(uid)`).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(
        "Exec lifecycle hook ([{}]) for Container {container:?} in Pod {pod:?} failed - error: {error}, message: {output:?}",
        command.join(" ")
    )]
    Exec { command: Vec<String>, container: String, pod: String, error: String, output: String },
    #[error("HTTP lifecycle hook ({path}) for Container {container:?} in Pod {pod:?} failed - error: {error}")]
    Http { path: String, container: String, pod: String, error: HttpError },
    #[error("Lifecycle hook for Container {container:?} in Pod {pod:?} has no handler (exec, httpGet or sleep)")]
    NoHandler { container: String, pod: String },
}

/// Runs a hook; `Err` carries upstream's detailed message, which goes into the container's
/// waiting state (events only say that the hook failed, so secrets do not leak into them). An
/// HTTP hook succeeds on any response, as upstream's does.
pub async fn run(t: Target<'_>, pod: &Pod, handler: &LifecycleHandler) -> Result<(), HookError> {
    let who = Who { container: &t.container.name, pod: spec::format_pod(pod) };
    if let Some(e) = &handler.exec {
        let cmd = e.command.clone().unwrap_or_default();
        return match handlers::exec(t, &cmd, Duration::ZERO).await {
            Ok(out) if out.exit_code == 0 => Ok(()),
            Ok(out) => {
                let error = format!("command '{}' exited with {}: {}", cmd.join(" "), out.exit_code, out.output);
                Err(who.exec_failed(&cmd, &error, &out.output))
            }
            Err(ExecError::TimedOut) => Err(who.exec_failed(&cmd, "timed out", "")),
            Err(ExecError::Failed(e)) => Err(who.exec_failed(&cmd, &e, "")),
        };
    }
    if let Some(h) = &handler.http_get {
        let path = h.path.as_deref().unwrap_or_default();
        return handlers::http(h, t.container, t.pod_ip, Duration::ZERO)
            .await
            .map(|_| ())
            .map_err(|e| who.http_failed(path, e));
    }
    if let Some(s) = &handler.sleep {
        tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64)).await;
        return Ok(());
    }
    Err(HookError::NoHandler { container: who.container.to_string(), pod: who.pod })
}

/// The container a hook ran for, in upstream's failure messages.
struct Who<'a> {
    container: &'a str,
    pod: String,
}

impl Who<'_> {
    fn exec_failed(&self, cmd: &[String], error: &str, output: &str) -> HookError {
        HookError::Exec {
            command: cmd.to_vec(),
            container: self.container.to_string(),
            pod: self.pod.clone(),
            error: error.to_string(),
            output: output.to_string(),
        }
    }

    fn http_failed(&self, path: &str, error: HttpError) -> HookError {
        HookError::Http { path: path.to_string(), container: self.container.to_string(), pod: self.pod.clone(), error }
    }
}

/// The grace left for StopContainer after preStop ran for `elapsed` (whole seconds, as
/// upstream counts them), never below [`MIN_GRACE`].
pub fn remaining_grace(grace: Duration, elapsed: Duration) -> Duration {
    Duration::from_secs(grace.as_secs().saturating_sub(elapsed.as_secs())).max(MIN_GRACE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_stop_time_comes_out_of_the_grace_period() {
        let s = Duration::from_secs;
        assert_eq!(remaining_grace(s(30), Duration::from_millis(10_900)), s(20));
        assert_eq!(remaining_grace(s(30), s(29)), MIN_GRACE);
        assert_eq!(remaining_grace(s(5), s(60)), MIN_GRACE);
    }

    #[test]
    fn failure_messages_as_upstream_words_them() {
        let who = Who { container: "web", pod: "web_prod(u1)".into() };
        let cmd = ["sh".to_string(), "-c".into(), "exit 3".into()];
        assert_eq!(
            who.exec_failed(&cmd, "command 'sh -c exit 3' exited with 3: ", "oops\n").to_string(),
            "Exec lifecycle hook ([sh -c exit 3]) for Container \"web\" in Pod \"web_prod(u1)\" failed - error: \
             command 'sh -c exit 3' exited with 3: , message: \"oops\\n\""
        );
        assert_eq!(
            who.http_failed(
                "/hook",
                HttpError::Request { url: "http://x/hook".into(), chain: "connection refused".into() }
            )
            .to_string(),
            "HTTP lifecycle hook (/hook) for Container \"web\" in Pod \"web_prod(u1)\" failed - error: Get \"http://x/hook\": \
             connection refused"
        );
    }
}
