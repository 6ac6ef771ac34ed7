//! Handing freed memory back to the system once the node has settled after a burst of pod
//! changes. Pods starting or stopping by the hundred allocate a peak the allocator then keeps
//! (glibc returns only the top of its heap by itself); the binary, which owns the allocator,
//! says how to release it, and this decides when: once the pods' statuses have been still for
//! [`SETTLE`] after a change. A node whose pods do not change never wakes for it.

use std::sync::Arc;
use std::time::Duration;

use gantry_agent::status_store::StatusStore;

/// How long the statuses must be still: a start-up burst changes them several times a second,
/// and one release after it is enough.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Calls `release` once after each burst of status changes, when [`SETTLE`] passed without one.
pub async fn when_settled(statuses: Arc<StatusStore>, release: fn()) {
    let mut changes = statuses.subscribe();
    while changes.changed().await.is_ok() {
        loop {
            match tokio::time::timeout(SETTLE, changes.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return,
                Err(_) => break,
            }
        }
        release();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::{Pod, PodStatus};

    use super::*;

    static RELEASES: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        RELEASES.fetch_add(1, Ordering::SeqCst);
    }

    fn change(statuses: &StatusStore, phase: &str) {
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u".into());
        assert!(statuses.set(&std::sync::Arc::new(pod), PodStatus { phase: Some(phase.into()), ..Default::default() }));
    }

    #[tokio::test(start_paused = true)]
    async fn releases_once_after_a_burst_has_settled_and_not_while_still() {
        let statuses = Arc::new(StatusStore::default());
        let task = tokio::spawn(when_settled(statuses.clone(), count));
        tokio::time::sleep(SETTLE * 3).await;
        assert_eq!(RELEASES.load(Ordering::SeqCst), 0, "nothing changed: nothing to release");
        // A burst: a change every second for five seconds.
        for i in 0..5 {
            change(&statuses, &format!("p{i}"));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(RELEASES.load(Ordering::SeqCst), 0, "not during the burst");
        tokio::time::sleep(SETTLE).await;
        assert_eq!(RELEASES.load(Ordering::SeqCst), 1, "once, after it settled");
        tokio::time::sleep(SETTLE * 3).await;
        assert_eq!(RELEASES.load(Ordering::SeqCst), 1, "not again while nothing changes");
        change(&statuses, "again");
        tokio::time::sleep(SETTLE + Duration::from_secs(1)).await;
        assert_eq!(RELEASES.load(Ordering::SeqCst), 2, "once more after the next change");
        task.abort();
    }
}
