//! The grpc.health.v1 client behind `grpc` probes. It lives here because this crate is the
//! only one that speaks gRPC; the messages are upstream's prober messages.

use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Why a health check did not report `SERVING`. The texts are what upstream records in
/// `Unhealthy` events.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HealthError {
    #[error("error: failed to connect service at {addr:?}: {detail}")]
    Connect { addr: String, detail: String },
    #[error("timeout: failed to connect service {addr:?} within {secs}s")]
    ConnectTimeout { addr: String, secs: u64 },
    #[error("service unhealthy (responded with {status:?})")]
    Unhealthy { status: &'static str },
    #[error("error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {0}")]
    Unimplemented(String),
    #[error("timeout: health rpc did not complete within {secs}s")]
    RpcTimeout { secs: u64 },
    #[error("error: health rpc probe failed: {0}")]
    Rpc(String),
}

/// Asks `addr` (`host:port`, plain HTTP/2) whether `service` is serving.
pub async fn check(addr: &str, service: String, timeout: Duration) -> Result<(), HealthError> {
    let secs = timeout.as_secs();
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| HealthError::Connect { addr: addr.to_string(), detail: e.to_string() })?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(HealthError::Connect { addr: addr.to_string(), detail: error_chain(&e) }),
        Err(_) => return Err(HealthError::ConnectTimeout { addr: addr.to_string(), secs }),
    };
    match HealthClient::new(channel).check(HealthCheckRequest { service }).await {
        Ok(r) if r.get_ref().status == ServingStatus::Serving as i32 => Ok(()),
        Ok(r) => {
            let status = ServingStatus::try_from(r.get_ref().status).unwrap_or(ServingStatus::Unknown);
            Err(HealthError::Unhealthy { status: status.as_str_name() })
        }
        Err(s) if s.code() == tonic::Code::Unimplemented => Err(HealthError::Unimplemented(s.message().to_string())),
        Err(s) if matches!(s.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled) => {
            Err(HealthError::RpcTimeout { secs })
        }
        Err(s) => Err(HealthError::Rpc(s.to_string())),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    #[tokio::test]
    async fn checks_the_named_service() {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("db", tonic_health::ServingStatus::NotServing).await;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let server =
            tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
        let second = Duration::from_secs(1);
        assert_eq!(check(&addr, String::new(), second).await, Ok(()));
        assert_eq!(check(&addr, "db".into(), second).await, Err(HealthError::Unhealthy { status: "NOT_SERVING" }));
        server.abort();
    }
}
