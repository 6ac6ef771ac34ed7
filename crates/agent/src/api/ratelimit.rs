//! Client-side rate limit for API requests: a token bucket (`kubeAPIQPS`
//! tokens per second, at most `kubeAPIBurst` saved up), as client-go's
//! `NewTokenBucketRateLimiter`, as a tower layer in the kube client's stack.
//!
//! Watch requests take no token, as client-go's `Request.Watch` takes none: a watch is one
//! long request, and a node starting 110 pods with a ConfigMap and a Secret each opens 220 of
//! them, which would otherwise queue its LISTs and status patches behind them.
//!
//! Each request is given its time when it arrives ([`Schedule`]), so requests go in arrival
//! order and each waits once, for its own time, as a reservation of Go's `rate.Limiter`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// When each request may go: a token bucket kept as the time its next token is due (the
/// generic cell rate algorithm), so a request's time is known on arrival.
#[derive(Debug)]
struct Schedule {
    /// One token's worth of time (1 / qps).
    interval: Duration,
    /// How far ahead of its due time a request may go: the burst less one token.
    tolerance: Duration,
    /// When the bucket is next empty, if that is ahead of now.
    due: Option<Instant>,
}

impl Schedule {
    /// `qps` tokens per second, at most `burst` at once (both at least 1).
    fn new(qps: u32, burst: u32) -> Self {
        let interval = Duration::from_secs(1) / qps.max(1);
        Schedule { interval, tolerance: interval * (burst.max(1) - 1), due: None }
    }

    /// When a request arriving `now` may go (`now` or later); takes its token.
    fn reserve(&mut self, now: Instant) -> Instant {
        let due = self.due.map_or(now, |due| due.max(now));
        self.due = Some(due + self.interval);
        due.checked_sub(self.tolerance).map_or(now, |at| at.max(now))
    }
}

/// Adds the token bucket to a service.
#[derive(Clone)]
pub struct RateLimitLayer {
    schedule: Arc<Mutex<Schedule>>,
}

impl RateLimitLayer {
    /// `qps` tokens per second, at most `burst` at once (both at least 1).
    pub fn new(qps: u32, burst: u32) -> Self {
        RateLimitLayer { schedule: Arc::new(Mutex::new(Schedule::new(qps, burst))) }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited { inner, schedule: self.schedule.clone() }
    }
}

/// A service that takes one token per request other than a watch.
#[derive(Clone)]
pub struct RateLimited<S> {
    inner: S,
    schedule: Arc<Mutex<Schedule>>,
}

/// Whether the request asks for a watch (`?watch=true`, or `1` as the server also takes).
fn is_watch<B>(request: &http::Request<B>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    query.split('&').any(|pair| matches!(pair, "watch=true" | "watch=1"))
}

type Waiting<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B> Service<http::Request<B>> for RateLimited<S>
where
    S: Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Waiting<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if is_watch(&request) {
            return Box::pin(self.inner.call(request));
        }
        let now = Instant::now();
        let at = self.schedule.lock().unwrap_or_else(|p| p.into_inner()).reserve(now);
        if at <= now {
            return Box::pin(self.inner.call(request));
        }
        // The readied service goes with the request; a clone takes its place (tower's way of
        // calling a service later).
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            tokio::time::sleep_until(at).await;
            inner.oneshot(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str) -> http::Request<()> {
        http::Request::get(uri).body(()).unwrap()
    }

    /// The service the limiter wraps answers with the (paused) time it was called.
    fn timed() -> RateLimited<tower::util::BoxCloneService<http::Request<()>, Instant, std::convert::Infallible>> {
        let svc = tower::service_fn(|_: http::Request<()>| std::future::ready(Ok(Instant::now())));
        RateLimitLayer::new(20, 3).layer(tower::util::BoxCloneService::new(svc))
    }

    #[tokio::test(start_paused = true)]
    async fn burst_then_one_per_interval_in_arrival_order() {
        let mut svc = timed();
        let start = Instant::now();
        let mut calls = Vec::new();
        for _ in 0..7 {
            calls.push(svc.ready().await.unwrap().call(request("/api/v1/pods")));
        }
        // Polled last to first: the times still follow arrival.
        calls.reverse();
        let mut times: Vec<Duration> =
            futures::future::join_all(calls).await.into_iter().map(|went| went.unwrap() - start).collect();
        times.reverse();
        let ms = |n| Duration::from_millis(n);
        assert_eq!(times, [ms(0), ms(0), ms(0), ms(50), ms(100), ms(150), ms(200)]);
    }

    #[tokio::test(start_paused = true)]
    async fn watches_take_no_token() {
        let mut svc = timed();
        let start = Instant::now();
        for _ in 0..3 {
            svc.ready().await.unwrap().call(request("/api/v1/pods")).await.unwrap();
        }
        for uri in
            ["/api/v1/namespaces/a/configmaps?fieldSelector=metadata.name%3Dx&watch=true", "/api/v1/pods?watch=1"]
        {
            let went = svc.ready().await.unwrap().call(request(uri)).await.unwrap();
            assert_eq!(went, start, "{uri} waited for a token");
        }
        // The bucket is as the three requests left it: the next non-watch waits one interval.
        let list = svc.ready().await.unwrap().call(request("/api/v1/configmaps?watch=false")).await.unwrap();
        assert_eq!(list - start, Duration::from_millis(50));
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_refill_while_idle() {
        let mut svc = timed();
        for _ in 0..3 {
            svc.ready().await.unwrap().call(request("/api/v1/pods")).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let start = Instant::now();
        for _ in 0..2 {
            let went = svc.ready().await.unwrap().call(request("/api/v1/pods")).await.unwrap();
            assert_eq!(went, start);
        }
        let third = svc.ready().await.unwrap().call(request("/api/v1/pods")).await.unwrap();
        assert_eq!(third - start, Duration::from_millis(50), "two tokens came back in 100 ms, not three");
    }
}
