//! The long-running tasks of one process part (the node agent, the maintenance controller)
//! run here, in one `JoinSet` under one cancellation token.
//!
//! The rule: a supervised task runs for its owner's whole lifetime. One that returns or panics
//! is a fault, named in the returned [`TaskFault`], and every other task is stopped, so that
//! the owner exits with an error and the service manager (systemd for the node agent, the
//! Deployment for the controller) restarts it. A restart is safe by design (a node's running
//! pods keep running and are adopted; the controller's state is in the objects' status); a
//! process that silently lost one of its loops (status, lease, a watch) is not.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

/// Why the supervised tasks stopped before their owner was told to shut down.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TaskFault {
    #[error("task {task:?} ended, but every supervised task runs until shutdown")]
    Ended { task: &'static str },
    #[error("task {task:?} panicked: {message}")]
    Panicked { task: &'static str, message: String },
}

#[derive(Default)]
pub struct Supervisor {
    tasks: JoinSet<()>,
    names: HashMap<Id, &'static str>,
    cancel: CancellationToken,
}

impl Supervisor {
    /// Runs `task` until it ends or the supervisor stops.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let cancel = self.cancel.clone();
        let handle = self.tasks.spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = task => {}
            }
        });
        self.names.insert(handle.id(), name);
    }

    /// Supervises a task something else spawned: it counts as this supervisor's, and it is
    /// aborted when the supervisor stops.
    pub fn adopt(&mut self, name: &'static str, handle: JoinHandle<()>) {
        let mut guard = AbortOnDrop(handle);
        self.spawn(name, async move {
            if let Err(e) = (&mut guard.0).await
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
        });
    }

    /// Runs until `shutdown` completes (`Ok`) or a task ends or panics (`Err` naming it). Every
    /// task has stopped when this returns.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), TaskFault> {
        let outcome = tokio::select! {
            () = shutdown => Ok(()),
            fault = first_fault(&mut self.tasks, &self.names) => Err(fault),
        };
        self.cancel.cancel();
        self.tasks.shutdown().await;
        outcome
    }
}

async fn first_fault(tasks: &mut JoinSet<()>, names: &HashMap<Id, &'static str>) -> TaskFault {
    let name = |id: Id| names.get(&id).copied().unwrap_or("unnamed");
    loop {
        match tasks.join_next_with_id().await {
            None => std::future::pending::<()>().await,
            Some(Ok((id, ()))) => return TaskFault::Ended { task: name(id) },
            Some(Err(e)) if e.is_panic() => {
                let task = name(e.id());
                return TaskFault::Panicked { task, message: panic_message(e.into_panic()) };
            }
            Some(Err(_)) => {}
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload.downcast::<&str>().map(|s| s.to_string()).unwrap_or_else(|_| "(no message)".into()),
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    struct SetOnDrop(Arc<AtomicBool>);

    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_task_that_ends_stops_the_others_and_is_named() {
        let stopped = Arc::new(AtomicBool::new(false));
        let mut s = Supervisor::default();
        let guard = SetOnDrop(stopped.clone());
        s.spawn("forever", async move {
            let _guard = guard;
            std::future::pending::<()>().await
        });
        s.spawn("status", async {});
        let fault = s.run(std::future::pending()).await.unwrap_err();
        assert_eq!(fault, TaskFault::Ended { task: "status" });
        assert!(stopped.load(Ordering::SeqCst), "the other task was stopped");
    }

    #[tokio::test]
    async fn a_panic_is_reported_with_the_task_and_message() {
        let mut s = Supervisor::default();
        s.spawn("forever", std::future::pending());
        s.spawn("lease", async { panic!("lost the lease loop") });
        let fault = s.run(std::future::pending()).await.unwrap_err();
        assert_eq!(fault, TaskFault::Panicked { task: "lease", message: "lost the lease loop".into() });
    }

    #[tokio::test]
    async fn shutdown_stops_every_task_including_adopted_ones() {
        let stopped = Arc::new(AtomicBool::new(false));
        let guard = SetOnDrop(stopped.clone());
        let adopted = tokio::spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await
        });
        let mut s = Supervisor::default();
        s.adopt("node-status", adopted);
        s.spawn("pods", std::future::pending());
        assert_eq!(s.run(async {}).await, Ok(()));
        tokio::task::yield_now().await;
        assert!(stopped.load(Ordering::SeqCst), "the adopted task was aborted");
    }

    #[tokio::test]
    async fn an_adopted_task_that_panics_is_a_fault() {
        let mut s = Supervisor::default();
        s.adopt("registration", tokio::spawn(async { panic!("boom") }));
        let fault = s.run(std::future::pending()).await.unwrap_err();
        assert_eq!(fault, TaskFault::Panicked { task: "registration", message: "boom".into() });
    }
}
