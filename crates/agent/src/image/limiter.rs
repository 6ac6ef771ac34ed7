//! The node-wide limit on concurrent image pulls (`serializeImagePulls`,
//! `maxParallelImagePulls`): one limiter shared by all pod workers, first come first served.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone, Debug)]
pub struct PullLimiter {
    /// `None`: no limit.
    slots: Option<Arc<Semaphore>>,
}

impl PullLimiter {
    /// `limit` pulls at once (1 = serialized); `None` for no limit.
    pub fn new(limit: Option<usize>) -> Self {
        PullLimiter { slots: limit.map(|n| Arc::new(Semaphore::new(n.max(1)))) }
    }

    /// Waits for a free slot; the pull may run while the returned permit is held.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        let slots = self.slots.clone()?;
        // The semaphore is never closed, so acquiring cannot fail.
        slots.acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    /// Whether a pull asking now would have to wait (one poll, no timing involved).
    async fn waits(limiter: &PullLimiter) -> bool {
        limiter.acquire().now_or_never().is_none()
    }

    #[tokio::test]
    async fn serialized_pulls_wait_for_the_one_running() {
        let limiter = PullLimiter::new(Some(1));
        let first = limiter.acquire().await;
        assert!(first.is_some());
        assert!(waits(&limiter).await, "a second pull must wait");
        drop(first);
        assert!(!waits(&limiter).await, "the next pull runs once the first is done");
    }

    #[tokio::test]
    async fn parallel_pulls_are_bounded() {
        let limiter = PullLimiter::new(Some(2));
        let (_a, _b) = (limiter.acquire().await, limiter.acquire().await);
        assert!(waits(&limiter).await, "a third pull must wait");
    }

    #[tokio::test]
    async fn unlimited_pulls_never_wait() {
        let limiter = PullLimiter::new(None);
        let _held: Vec<_> = futures::future::join_all((0..100).map(|_| limiter.acquire())).await;
        assert!(!waits(&limiter).await);
    }

    #[tokio::test]
    async fn waiting_pulls_are_served_in_order() {
        let limiter = PullLimiter::new(Some(1));
        let held = limiter.acquire().await;
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (limiter, order) = (limiter.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = limiter.acquire().await;
                order.lock().unwrap().push(i);
            }));
            // Queue them in a known order.
            tokio::task::yield_now().await;
        }
        drop(held);
        futures::future::join_all(tasks).await;
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
    }
}
