//! The manifest URL (`staticPodURL`): polled every `httpCheckFrequency`; serves a Pod or a
//! PodList.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use super::manifest::{self, MAX_MANIFEST_BYTES, ManifestError};
use super::static_pod::{self, Origin};
use super::{SourceKind, SourceUpdate};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub struct HttpSource {
    url: String,
    headers: Vec<(String, String)>,
    node: String,
    client: reqwest::Client,
    last_body: Option<Vec<u8>>,
}

impl HttpSource {
    pub fn new(url: String, headers: Vec<(String, String)>, node: &str) -> Self {
        let client = reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().unwrap_or_default();
        HttpSource { url, headers, node: node.to_string(), client, last_body: None }
    }

    /// Fetches the URL. `Ok(None)` when the body did not change since the last poll.
    pub async fn poll(&mut self) -> Result<Option<Vec<Pod>>, ManifestError> {
        let body = self.fetch().await?;
        if self.last_body.as_ref() == Some(&body) {
            return Ok(None);
        }
        self.last_body = Some(body.clone());
        if body.is_empty() {
            return Err(ManifestError::new(&self.url, "(document)", "zero-length data received"));
        }
        let pods = manifest::parse_pods(&body, &self.url)?;
        let origin = Origin::Url(&self.url);
        pods.into_iter().map(|p| static_pod::prepare(p, &origin, &self.node)).collect::<Result<_, _>>().map(Some)
    }

    async fn fetch(&self) -> Result<Vec<u8>, ManifestError> {
        let fail = |reason: String| ManifestError::new(&self.url, "(request)", reason);
        let mut request = self.client.get(&self.url);
        for (k, v) in &self.headers {
            request = request.header(k, v);
        }
        let response = request.send().await.map_err(|e| fail(e.to_string()))?;
        if !response.status().is_success() {
            return Err(fail(format!("server answered {}", response.status())));
        }
        let body = response.bytes().await.map_err(|e| fail(e.to_string()))?;
        if body.len() > MAX_MANIFEST_BYTES {
            return Err(fail(format!("response larger than {MAX_MANIFEST_BYTES} bytes")));
        }
        Ok(body.to_vec())
    }
}

/// Runs the source. A failing URL keeps the last good SET (a flaky server does not stop
/// pods), except that an empty body means "no pods", as upstream. Until the URL answered once
/// the source has not reported, so pods it may have started before a restart are left alone.
pub async fn run(mut source: HttpSource, period: Duration, tx: mpsc::Sender<SourceUpdate>) {
    let mut ticker = tokio::time::interval(period);
    let mut failures = 0u32;
    loop {
        ticker.tick().await;
        let pods = match source.poll().await {
            Ok(Some(pods)) => {
                if failures > 0 {
                    tracing::info!(url = %source.url, "successfully read pods from URL");
                }
                failures = 0;
                Some(pods)
            }
            Ok(None) => None,
            Err(e) => {
                failures += 1;
                // Upstream logs the first few failures loudly, then quietly.
                if failures <= 3 {
                    tracing::warn!(url = %e.origin, field = %e.field, error = %e.reason, "cannot read static pods from URL");
                } else {
                    tracing::debug!(url = %e.origin, error = %e.reason, "cannot read static pods from URL");
                }
                source.last_body.as_ref().is_some_and(Vec::is_empty).then(Vec::new)
            }
        };
        if let Some(pods) = pods
            && tx.send(SourceUpdate::owned(SourceKind::Http, pods)).await.is_err()
        {
            return;
        }
    }
}
