//! How many runtime starts (sandbox creations, container create-and-starts) run at once,
//! node-wide, and who goes next when one ends: a waiting container start before a waiting
//! sandbox creation. In first-come order, a burst of new pods queued every sandbox creation
//! ahead of the first container start, so no pod ran until the last sandbox existed and every
//! status report came at the end (110 pods: sandboxes created 0.0–4.7 s, containers started
//! 4.9–8.8 s, the last pod reported Running at 9.8 s). Serving container starts first
//! finishes the pods one after another while the runtime stays as busy.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// What a start does; container starts are served first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    Sandbox,
    Container,
}

#[derive(Debug, Clone)]
pub struct StartSlots {
    queue: Arc<Mutex<Queue>>,
}

/// Free slots, or waiters: a slot is handed straight to the next waiter, so there are never
/// both.
#[derive(Debug, Default)]
struct Queue {
    free: usize,
    containers: VecDeque<oneshot::Sender<Slot>>,
    sandboxes: VecDeque<oneshot::Sender<Slot>>,
}

/// One start in flight; dropping it lets the next waiter go.
#[derive(Debug)]
pub struct Slot {
    /// `None` only for a slot being handed back by a waiter that gave up.
    queue: Option<Arc<Mutex<Queue>>>,
}

impl StartSlots {
    pub fn new(slots: usize) -> Self {
        StartSlots { queue: Arc::new(Mutex::new(Queue { free: slots, ..Queue::default() })) }
    }

    /// Waits for a slot. A caller that stops waiting (its future dropped) takes none.
    pub async fn acquire(&self, kind: StartKind) -> Slot {
        let waiting = {
            let mut queue = self.queue.lock().expect("the start queue is never poisoned");
            if queue.free > 0 {
                queue.free -= 1;
                return Slot { queue: Some(self.queue.clone()) };
            }
            let (tx, rx) = oneshot::channel();
            match kind {
                StartKind::Container => queue.containers.push_back(tx),
                StartKind::Sandbox => queue.sandboxes.push_back(tx),
            }
            rx
        };
        waiting.await.expect("a waiter's sender is dropped only after sending it a slot")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(shared) = self.queue.take() else { return };
        let mut queue = shared.lock().expect("the start queue is never poisoned");
        loop {
            let Some(next) = queue.containers.pop_front().or_else(|| queue.sandboxes.pop_front()) else {
                queue.free += 1;
                return;
            };
            match next.send(Slot { queue: Some(shared.clone()) }) {
                Ok(()) => return,
                // That waiter gave up: take the slot back without dropping it into this queue
                // again (the lock is held), and offer it to the next one.
                Err(mut unsent) => unsent.queue = None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn no_more_than_the_slots_run_at_once() {
        let slots = StartSlots::new(2);
        let a = slots.acquire(StartKind::Sandbox).await;
        let _b = slots.acquire(StartKind::Container).await;
        let mut third = Box::pin(slots.acquire(StartKind::Sandbox));
        assert!((&mut third).now_or_never().is_none(), "both slots are taken");
        drop(a);
        assert!(third.now_or_never().is_some(), "the freed slot goes to the waiter");
    }

    #[tokio::test]
    async fn a_waiting_container_start_goes_before_an_earlier_sandbox_creation() {
        let slots = StartSlots::new(1);
        let held = slots.acquire(StartKind::Sandbox).await;
        let mut sandbox = Box::pin(slots.acquire(StartKind::Sandbox));
        assert!((&mut sandbox).now_or_never().is_none());
        let mut container = Box::pin(slots.acquire(StartKind::Container));
        assert!((&mut container).now_or_never().is_none());
        drop(held);
        let slot = (&mut container).now_or_never().expect("the container start is served first");
        assert!((&mut sandbox).now_or_never().is_none(), "the sandbox creation still waits");
        drop(slot);
        assert!(sandbox.now_or_never().is_some(), "then the sandbox creation");
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_no_slot() {
        let slots = StartSlots::new(1);
        let held = slots.acquire(StartKind::Container).await;
        let mut gave_up = Box::pin(slots.acquire(StartKind::Container));
        assert!((&mut gave_up).now_or_never().is_none());
        drop(gave_up);
        drop(held);
        let first = slots.acquire(StartKind::Sandbox).now_or_never().expect("the slot came back");
        drop(first);
        assert!(slots.acquire(StartKind::Sandbox).now_or_never().is_some(), "and is not counted twice");
        assert_eq!(slots.queue.lock().unwrap().free, 1);
    }

    #[tokio::test]
    async fn a_slot_handed_to_a_waiter_that_then_gives_up_comes_back() {
        let slots = StartSlots::new(1);
        let held = slots.acquire(StartKind::Container).await;
        let mut waiter = Box::pin(slots.acquire(StartKind::Sandbox));
        assert!((&mut waiter).now_or_never().is_none());
        drop(held);
        drop(waiter);
        assert_eq!(slots.queue.lock().unwrap().free, 1, "the slot sent to it was returned");
    }
}
