//! Pods bound to this node, from the API server: list and watch with
//! `spec.nodeName=<node>`, resuming from the last resourceVersion and relisting on 410 Gone
//! (kube-runtime's watcher does both).

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use crate::source::{SourceKind, SourceUpdate};
use gantry_vocab::keys::CONFIG_SOURCE;
use gantry_vocab::spec;

pub use gantry_vocab::keys::{MIRROR as MIRROR_ANNOTATION, is_mirror};

/// Runs forever: sends a SET of the node's (non-mirror) pods after every change, and publishes
/// the node's mirror pods for the mirror pod manager.
pub async fn run(client: Client, node: String, tx: mpsc::Sender<SourceUpdate>, mirrors: watch::Sender<Vec<Pod>>) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
    let mut initial: Option<BTreeMap<String, Pod>> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => initial = Some(BTreeMap::new()),
            Ok(Event::InitApply(pod)) => {
                if let Some(buffer) = initial.as_mut() {
                    buffer.insert(spec::uid(&pod).to_string(), slim(pod));
                }
            }
            Ok(Event::InitDone) => pods = initial.take().unwrap_or_default(),
            Ok(Event::Apply(pod)) => {
                pods.insert(spec::uid(&pod).to_string(), slim(pod));
            }
            Ok(Event::Delete(pod)) => {
                pods.remove(spec::uid(&pod));
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching this node's pods failed; retrying");
                continue;
            }
        }
        if initial.is_some() {
            continue; // wait for the complete list before acting on it
        }
        let (mirror, regular): (Vec<Pod>, Vec<Pod>) = pods.values().cloned().partition(is_mirror);
        mirrors.send_replace(mirror);
        let regular = regular.into_iter().map(mark_api_source).collect();
        if tx.send(SourceUpdate { source: SourceKind::Api, pods: regular }).await.is_err() {
            return;
        }
    }
}

/// Drops what the agent never reads but would keep (and copy on every change) for each pod:
/// server-side-apply bookkeeping is often as large as the spec itself.
fn slim(mut pod: Pod) -> Pod {
    pod.metadata.managed_fields = None;
    pod
}

fn mark_api_source(mut pod: Pod) -> Pod {
    pod.metadata.annotations.get_or_insert_with(Default::default).insert(CONFIG_SOURCE.to_string(), "api".to_string());
    pod
}
