//! `rest_client_requests_total{code,method,host}` as client-go counts it: one tower layer in
//! the kube client's stack sees every request and its status (`<error>` when none came back).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use gantry_metrics::Metrics;
use tower::{Layer, Service};

#[derive(Clone)]
pub struct RequestMetricsLayer {
    host: String,
    metrics: Arc<Metrics>,
}

impl RequestMetricsLayer {
    /// `host` is the API server's `host:port`, the label value.
    pub fn new(host: impl Into<String>, metrics: Arc<Metrics>) -> Self {
        RequestMetricsLayer { host: host.into(), metrics }
    }
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> RequestMetrics<S> {
        RequestMetrics { inner, host: self.host.clone(), metrics: self.metrics.clone() }
    }
}

#[derive(Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    host: String,
    metrics: Arc<Metrics>,
}

impl<S, B, RB> Service<http::Request<B>> for RequestMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.method().to_string();
        let host = self.host.clone();
        let metrics = self.metrics.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let result = fut.await;
            let code = match &result {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            metrics.rest_client_requests.get_or_create(&gantry_metrics::RequestLabels { code, method, host }).inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[tokio::test]
    async fn counts_requests_by_code_method_and_host() {
        let svc = tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::builder().status(201).body(()).unwrap())
        });
        let metrics = Arc::new(Metrics::new());
        let svc = RequestMetricsLayer::new("api.test:6443", metrics.clone()).layer(svc);
        let req = http::Request::builder().method("POST").body(()).unwrap();
        svc.oneshot(req).await.unwrap();
        let text = metrics.encode();
        assert!(
            text.contains("rest_client_requests_total{code=\"201\",method=\"POST\",host=\"api.test:6443\"} 1"),
            "{text}"
        );
    }
}
