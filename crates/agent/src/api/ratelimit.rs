//! Client-side rate limit for API requests: a token bucket (`kubeAPIQPS`
//! tokens per second, at most `kubeAPIBurst` saved up), as client-go's
//! `NewTokenBucketRateLimiter`, as a tower layer in the kube client's stack.
//!
//! The kube client drives its service through a `Buffer` with one worker, so
//! a request that waits for a token holds the ones behind it in order.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tower::{Layer, Service};

/// Adds the token bucket to a service.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl RateLimitLayer {
    /// `qps` tokens per second, at most `burst` at once (both at least 1).
    pub fn new(qps: u32, burst: u32) -> Self {
        let qps = NonZeroU32::new(qps).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        RateLimitLayer { limiter: Arc::new(RateLimiter::direct(Quota::per_second(qps).allow_burst(burst))) }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited { inner, limiter: self.limiter.clone(), state: State::Idle }
    }
}

enum State {
    /// No token taken for the next request yet.
    Idle,
    /// Waiting for a token.
    Waiting(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// A token is held for the next `call`.
    Permitted,
}

/// A service that takes one token per request.
pub struct RateLimited<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    state: State,
}

impl<S, R> Service<R> for RateLimited<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        loop {
            match &mut self.state {
                State::Permitted => return self.inner.poll_ready(cx),
                State::Idle => {
                    if self.limiter.check().is_ok() {
                        self.state = State::Permitted;
                    } else {
                        let limiter = self.limiter.clone();
                        self.state = State::Waiting(Box::pin(async move { limiter.until_ready().await }));
                    }
                }
                State::Waiting(wait) => {
                    ready!(wait.as_mut().poll(cx));
                    self.state = State::Permitted;
                }
            }
        }
    }

    fn call(&mut self, req: R) -> S::Future {
        self.state = State::Idle;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn burst_then_steady_rate() {
        let svc = tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(Instant::now()) });
        let mut svc = RateLimitLayer::new(20, 3).layer(svc);
        let start = Instant::now();
        let mut times = Vec::new();
        for _ in 0..7 {
            times.push(svc.ready().await.unwrap().call(()).await.unwrap() - start);
        }
        // Three at once, then one per 50 ms.
        assert!(times[2] < Duration::from_millis(30), "{times:?}");
        assert!(times[3] >= Duration::from_millis(40), "{times:?}");
        assert!(times[6] >= Duration::from_millis(190), "{times:?}");
        assert!(times[6] < Duration::from_millis(600), "{times:?}");
    }

    #[tokio::test]
    async fn tokens_refill_while_idle() {
        let svc = tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(()) });
        let mut svc = RateLimitLayer::new(100, 2).layer(svc);
        for _ in 0..2 {
            svc.ready().await.unwrap().call(()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        let start = Instant::now();
        for _ in 0..2 {
            svc.ready().await.unwrap().call(()).await.unwrap();
        }
        assert!(start.elapsed() < Duration::from_millis(15), "{:?}", start.elapsed());
    }
}
