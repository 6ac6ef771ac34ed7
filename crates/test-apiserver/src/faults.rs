//! Fault injection: a test makes the server fail, hang or slow down for a while, or cut its
//! open watches, to see how clients ride it out.
//!
//! Faults queue up: each one starts when the one before it ends, so "500 for 30 s, then hang
//! for 30 s" is two calls and no timing in the test. They apply to every request before
//! authentication and routing (as a broken or overloaded kube-apiserver, or a load balancer in
//! front of it, would answer), and a request a fault answered is not counted in
//! [`requests`](crate::TestApiServer::requests): it never reached the API.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::status::ApiError;

/// How a failing server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// 500 InternalError, as when etcd is unreachable.
    InternalError,
    /// 429 TooManyRequests with `Retry-After: 1`, as kube-apiserver's max-in-flight filter.
    TooManyRequests,
}

/// One period of misbehaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every request is answered with this failure.
    Fail(Failure),
    /// No request is answered until the period ends; then each is served (unless its client
    /// gave up on it before: a request whose connection went away is never served).
    Hang,
    /// Every request waits this long before it is served.
    Delay(Duration),
}

/// What to do with one request now.
#[derive(Debug)]
enum Verdict {
    Serve,
    Answer(ApiError),
    /// Wait until the instant (or a change of faults), then decide again.
    HangUntil(Instant),
    /// Wait this long, then serve.
    Delay(Duration),
}

#[derive(Debug, Clone, Copy)]
struct Period {
    fault: Fault,
    start: Instant,
    end: Instant,
}

/// The fault switch a test holds ([`TestApiServer::faults`](crate::TestApiServer::faults)).
pub struct Faults {
    periods: Mutex<Vec<Period>>,
    /// Bumped on every change, so hung requests notice a [`clear`](Self::clear).
    changed: watch::Sender<u64>,
    watches: Mutex<CancellationToken>,
    connections: Mutex<CancellationToken>,
    answered: Mutex<u64>,
    held: Mutex<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            periods: Mutex::new(Vec::new()),
            changed: watch::Sender::new(0),
            watches: Mutex::new(CancellationToken::new()),
            connections: Mutex::new(CancellationToken::new()),
            answered: Mutex::new(0),
            held: Mutex::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Faults {
    /// Every request is answered with `failure` for `period` (after the faults queued before).
    pub fn fail(&self, failure: Failure, period: Duration) {
        self.queue(Fault::Fail(failure), period);
    }

    /// No request is answered for `period` (after the faults queued before).
    pub fn hang(&self, period: Duration) {
        self.queue(Fault::Hang, period);
    }

    /// Every request waits `delay` first, for `period` (after the faults queued before).
    pub fn delay(&self, delay: Duration, period: Duration) {
        self.queue(Fault::Delay(delay), period);
    }

    /// Queues `fault` for `period`, starting when the last queued fault ends (now if none).
    pub fn queue(&self, fault: Fault, period: Duration) {
        let now = Instant::now();
        let mut periods = lock(&self.periods);
        let start = periods.last().map_or(now, |p| p.end.max(now));
        periods.push(Period { fault, start, end: start + period });
        drop(periods);
        self.changed.send_modify(|v| *v += 1);
    }

    /// Ends every fault now; hung requests are served.
    pub fn clear(&self) {
        lock(&self.periods).clear();
        self.changed.send_modify(|v| *v += 1);
    }

    /// Ends every watch being served now (the connection stays), as when an API server
    /// instance behind a load balancer goes away; clients must watch again.
    pub fn drop_watches(&self) {
        let mut token = lock(&self.watches);
        token.cancel();
        *token = CancellationToken::new();
    }

    /// Closes every client connection now (watches and requests in flight with them), as a
    /// load balancer or a restarting server instance does; new connections are accepted.
    pub fn drop_connections(&self) {
        let mut token = lock(&self.connections);
        token.cancel();
        *token = CancellationToken::new();
    }

    /// When the last queued fault ends (None if none is queued or in effect).
    pub fn recovery(&self) -> Option<Instant> {
        let now = Instant::now();
        lock(&self.periods).last().map(|p| p.end).filter(|end| *end > now)
    }

    /// Waits until no fault is in effect or queued any more.
    pub async fn recovered(&self) {
        let mut changes = self.changed.subscribe();
        while let Some(end) = self.recovery() {
            tokio::select! {
                _ = tokio::time::sleep_until(end) => {}
                _ = changes.changed() => {}
            }
        }
    }

    /// How many requests a fault answered (failed) so far.
    pub fn answered(&self) -> u64 {
        *lock(&self.answered)
    }

    /// How many requests a hang held so far.
    pub fn held(&self) -> u64 {
        *lock(&self.held)
    }

    /// The token a watch stream ends on when [`drop_watches`](Self::drop_watches) is called.
    pub(crate) fn watch_token(&self) -> CancellationToken {
        lock(&self.watches).clone()
    }

    /// The token a connection is closed on when [`drop_connections`](Self::drop_connections)
    /// is called.
    pub(crate) fn connection_token(&self) -> CancellationToken {
        lock(&self.connections).clone()
    }

    /// The fault for a request arriving at `now`.
    fn verdict(&self, now: Instant) -> Verdict {
        let mut periods = lock(&self.periods);
        periods.retain(|p| p.end > now);
        let Some(period) = periods.iter().find(|p| p.start <= now) else { return Verdict::Serve };
        match period.fault {
            Fault::Fail(failure) => Verdict::Answer(answer(failure)),
            Fault::Hang => Verdict::HangUntil(period.end),
            Fault::Delay(d) => Verdict::Delay(d),
        }
    }

    /// Applies the faults to one request: None to serve it, or the error to answer.
    pub(crate) async fn apply(&self) -> Option<ApiError> {
        let mut changes = self.changed.subscribe();
        let mut held = false;
        loop {
            match self.verdict(Instant::now()) {
                Verdict::Serve => return None,
                Verdict::Answer(e) => {
                    *lock(&self.answered) += 1;
                    return Some(e);
                }
                Verdict::Delay(d) => {
                    tokio::time::sleep(d).await;
                    return None;
                }
                Verdict::HangUntil(until) => {
                    if !std::mem::replace(&mut held, true) {
                        *lock(&self.held) += 1;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => {}
                        _ = changes.changed() => {}
                    }
                }
            }
        }
    }
}

fn answer(failure: Failure) -> ApiError {
    match failure {
        Failure::InternalError => {
            ApiError::internal("Internal error occurred: injected fault").with_details(serde_json::json!({
                "causes": [{"message": "injected fault"}],
            }))
        }
        Failure::TooManyRequests => {
            ApiError::too_many_requests("Too many requests, please try again later.", 1, vec![])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn queued_faults_follow_each_other_then_requests_are_served() {
        let faults = Faults::default();
        faults.fail(Failure::InternalError, Duration::from_secs(30));
        faults.hang(Duration::from_secs(30));
        let t0 = Instant::now();
        assert_eq!(faults.apply().await.map(|e| e.code), Some(500));
        assert_eq!(faults.recovery(), Some(t0 + Duration::from_secs(60)));

        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(faults.apply().await.is_none(), "served once the hang is over");
        assert_eq!(Instant::now(), t0 + Duration::from_secs(60), "answered when the hang ended");
        assert_eq!(faults.recovery(), None);
        assert_eq!((faults.answered(), faults.held()), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn too_many_requests_says_when_to_retry() {
        let faults = Faults::default();
        faults.fail(Failure::TooManyRequests, Duration::from_secs(5));
        let e = faults.apply().await.unwrap();
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        assert_eq!(e.details.unwrap()["retryAfterSeconds"], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_is_waited_once_per_request() {
        let faults = Faults::default();
        faults.delay(Duration::from_millis(300), Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(faults.apply().await.is_none());
        assert_eq!(Instant::now() - t0, Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn clear_releases_hung_requests() {
        let faults = std::sync::Arc::new(Faults::default());
        faults.hang(Duration::from_secs(3600));
        let waiting = tokio::spawn({
            let faults = faults.clone();
            async move { faults.apply().await }
        });
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "hung");
        faults.clear();
        assert!(waiting.await.unwrap().is_none());
        faults.recovered().await;
    }

    #[test]
    fn dropping_watches_cancels_the_current_token_only() {
        let faults = Faults::default();
        let before = faults.watch_token();
        faults.drop_watches();
        assert!(before.is_cancelled());
        assert!(!faults.watch_token().is_cancelled());
    }
}
