//! Watch streams: newline-delimited JSON events (ADDED/MODIFIED/DELETED, BOOKMARK, ERROR).
//!
//! A watch starts either from "now, after synthetic ADDED events for every current object"
//! (resourceVersion unset or "0", or `sendInitialEvents=true`, which then ends the initial
//! events with a bookmark annotated `k8s.io/initial-events-end`) or from a given
//! resourceVersion, replaying later changes from the history; a version older than the
//! history gets an ERROR event with a 410 Expired Status, like the watch cache.
//!
//! Selectors are applied as the watch cache does: an object that starts matching arrives as
//! ADDED and one that stops matching as DELETED (carrying its new state).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accounting::OpenWatch;
use crate::ops::{ListOptions, present};
use crate::resources::ResourceType;
use crate::state::State;
use crate::status::{ApiError, ApiResult, FieldError};
use crate::store::{Change, EventType, StoreInner};

/// How often an idle watch that asked for bookmarks gets one.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(10);
/// kube-apiserver's --min-request-timeout; watches without timeoutSeconds last this long.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

pub struct WatchRequest {
    pub rt: Arc<ResourceType>,
    pub namespace: Option<String>,
    pub opts: ListOptions,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
}

enum Start {
    /// Send the current state first.
    Initial,
    From(u64),
}

fn invalid(field: &str, detail: &str) -> ApiError {
    ApiError::invalid("ListOptions", "meta.k8s.io", "", vec![FieldError::forbidden(field, detail)])
}

fn start_point(req: &WatchRequest) -> ApiResult<Start> {
    let rv = req.opts.resource_version.as_deref().unwrap_or("");
    match (req.send_initial_events, req.opts.resource_version_match.as_deref()) {
        (true, Some("NotOlderThan")) if !req.bookmarks => {
            Err(invalid("allowWatchBookmarks", "sendInitialEvents requires setting allowWatchBookmarks to true"))
        }
        (true, Some("NotOlderThan")) => Ok(Start::Initial),
        (true, _) => Err(invalid(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        )),
        (false, Some(_)) => Err(invalid(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        )),
        (false, None) if rv.is_empty() || rv == "0" => Ok(Start::Initial),
        (false, None) => rv.parse::<u64>().map(Start::From).map_err(|_| {
            ApiError::invalid(
                "ListOptions",
                "meta.k8s.io",
                "",
                vec![FieldError::invalid("resourceVersion", &json!(rv), "must be a valid resource version")],
            )
        }),
    }
}

/// Validates the request and starts streaming; the stream ends on timeout, when the
/// client goes away, when the server stops (`epoch` cancelled) or a test drops the watches.
pub fn start(
    state: Arc<State>,
    req: WatchRequest,
    epoch: CancellationToken,
) -> ApiResult<impl Stream<Item = Bytes> + Send + 'static> {
    let start = start_point(&req)?;
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(run(state, req, start, tx, epoch));
    Ok(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) }))
}

fn line(kind: &str, object: Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn bookmark(rt: &ResourceType, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line("BOOKMARK", json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata}))
}

fn too_old(requested: u64, oldest: u64) -> Bytes {
    line("ERROR", ApiError::expired(format!("too old resource version: {requested} ({oldest})")).to_status())
}

fn in_scope(req: &WatchRequest, obj: &Value) -> bool {
    let ns_ok = req.namespace.as_deref().is_none_or(|ns| crate::meta::namespace(obj) == ns);
    ns_ok && req.opts.matches(obj)
}

/// The event (if any) a change produces for this watch.
fn event_for(req: &WatchRequest, change: &Change) -> Option<Bytes> {
    if change.storage != req.rt.storage {
        return None;
    }
    let now = in_scope(req, &change.object);
    let before = change.prev.as_ref().is_some_and(|p| in_scope(req, p));
    let kind = match (change.kind, before, now) {
        (EventType::Added, _, true) => "ADDED",
        (EventType::Modified, true, true) => "MODIFIED",
        (EventType::Modified, false, true) => "ADDED",
        (EventType::Modified, true, false) => "DELETED",
        (EventType::Deleted, true, _) => "DELETED",
        _ => return None,
    };
    Some(line(kind, present(&req.rt, &change.object)))
}

/// Initial events (synthetic ADDED for the current state), and the RV they reflect.
fn initial_events(inner: &StoreInner, req: &WatchRequest) -> (Vec<Bytes>, u64) {
    let rv = inner.current_rv();
    let lines = inner
        .list(&req.rt.storage, req.namespace.as_deref())
        .iter()
        .filter(|o| in_scope(req, o))
        .map(|o| line("ADDED", present(&req.rt, o)))
        .collect();
    (lines, rv)
}

/// Changes after `cursor`, and the RV reached; Err(line) when the history lost them. A watch
/// that resumes from `cursor` needs it within the history (`resumed`), as the watch cache
/// does; a running one, only the changes of its resource.
fn catch_up(inner: &StoreInner, req: &WatchRequest, cursor: u64, resumed: bool) -> Result<(Vec<Bytes>, u64), Bytes> {
    let reached = inner.current_rv().max(cursor);
    let lines = if resumed {
        inner.changes_since(cursor).map(|changes| changes.filter_map(|c| event_for(req, c)).collect())
    } else {
        inner
            .changes_of_since(&req.rt.storage, cursor)
            .map(|changes| changes.filter_map(|c| event_for(req, c)).collect())
    };
    lines.map(|lines| (lines, reached)).map_err(|oldest| too_old(cursor, oldest))
}

/// Sends the changes after `cursor` and moves it on; false when the watch ends.
async fn advance(state: &State, req: &WatchRequest, tx: &mpsc::Sender<Bytes>, cursor: &mut u64, resumed: bool) -> bool {
    let caught_up = catch_up(&state.store.lock(), req, *cursor, resumed);
    match caught_up {
        Ok((lines, rv)) => {
            *cursor = rv;
            send_all(tx, lines).await
        }
        Err(error) => {
            let _ = tx.send(error).await;
            false
        }
    }
}

async fn send_all(tx: &mpsc::Sender<Bytes>, lines: Vec<Bytes>) -> bool {
    for l in lines {
        if tx.send(l).await.is_err() {
            return false;
        }
    }
    true
}

async fn run(state: Arc<State>, req: WatchRequest, start: Start, tx: mpsc::Sender<Bytes>, epoch: CancellationToken) {
    let dropped = state.faults.watch_token();
    let _open = state.accounting.open(OpenWatch {
        resource: req.rt.plural.clone(),
        namespace: req.namespace.clone(),
        name: req.opts.fields.single_name().map(String::from),
    });
    // Subscribe before reading so no write between the read and the wait is missed.
    let mut latest = state.store.subscribe_to(&req.rt.storage);
    let deadline = Instant::now() + req.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let (mut cursor, mut resumed) = match start {
        Start::Initial => {
            let (mut lines, rv) = initial_events(&state.store.lock(), &req);
            if req.send_initial_events {
                lines.push(bookmark(&req.rt, rv, true));
            }
            if !send_all(&tx, lines).await {
                return;
            }
            (rv, false)
        }
        Start::From(rv) => (rv, true),
    };
    let mut bookmarks = tokio::time::interval_at(Instant::now() + BOOKMARK_INTERVAL, BOOKMARK_INTERVAL);
    loop {
        if !advance(&state, &req, &tx, &mut cursor, resumed).await {
            return;
        }
        resumed = false;
        tokio::select! {
            changed = latest.changed() => if changed.is_err() { return },
            _ = bookmarks.tick(), if req.bookmarks => {
                // Caught up first, so that the bookmark carries the current resourceVersion.
                if !advance(&state, &req, &tx, &mut cursor, false).await || tx.send(bookmark(&req.rt, cursor, false)).await.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(deadline) => return,
            _ = epoch.cancelled() => return,
            _ = dropped.cancelled() => return,
            _ = tx.closed() => return,
        }
    }
}
