//! The connections to the API server: HTTP/2 when the server offers it (ALPN `h2`, as
//! client-go), so that all the node's requests and watches share one connection instead of one
//! HTTP/1.1 connection each; HTTP/1.1 when it does not.
//!
//! An HTTP/2 server limits the streams open at once on one connection (kube-apiserver: 100 by
//! default, `--http2-max-streams-per-connection`), and hyper's client queues a request on a full
//! connection rather than opening another, which would block a watch forever. So requests are
//! spread over [`Lanes`]: each lane is one connection pool, and a lane is given at most
//! [`STREAMS_PER_CONNECTION`] requests in flight (a watch counts until its response body is
//! dropped); when every lane is full a new one is opened, as Go's HTTP/2 transport dials a new
//! connection when the others are full.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::connect::Connect;
use hyper_util::client::legacy::{Builder, Client, Error};
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// The streams one connection carries at most: kube-apiserver's default limit (and the least a
/// server should allow, RFC 9113 §6.5.2).
pub const STREAMS_PER_CONNECTION: usize = 100;
/// An HTTP/2 connection nothing was read from for this long is pinged (client-go's
/// `ReadIdleTimeout`)...
const PING_AFTER_IDLE: Duration = Duration::from_secs(30);
/// ...and closed when the ping is not answered within this (client-go's `PingTimeout`), so
/// that watches on a dead connection restart instead of waiting forever.
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// Connection pools to one API server, filled one after the other (see the module docs).
/// Clones share the pools.
pub struct Lanes<C> {
    connector: C,
    lanes: Arc<Mutex<Vec<Lane<C>>>>,
}

impl<C: Clone> Clone for Lanes<C> {
    fn clone(&self) -> Self {
        Lanes { connector: self.connector.clone(), lanes: self.lanes.clone() }
    }
}

struct Lane<C> {
    client: Client<C, kube::client::Body>,
    /// Requests in flight on this lane.
    streams: Arc<AtomicUsize>,
}

impl<C> Lanes<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    pub fn new(connector: C) -> Self {
        Lanes { connector, lanes: Arc::default() }
    }

    /// The client of the first lane with room for one more request (a new lane when all are
    /// full), and its slot, held until the request's response is done with.
    fn take_slot(&self) -> (Client<C, kube::client::Body>, Slot) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let free = lanes.iter().position(|l| l.streams.load(Ordering::Relaxed) < STREAMS_PER_CONNECTION);
        let index = free.unwrap_or_else(|| {
            lanes.push(Lane { client: pool(self.connector.clone()), streams: Arc::default() });
            lanes.len() - 1
        });
        let lane = &lanes[index];
        lane.streams.fetch_add(1, Ordering::Relaxed);
        (lane.client.clone(), Slot(lane.streams.clone()))
    }
}

/// One connection pool: HTTP/2 over a connection whose ALPN chose `h2`, else HTTP/1.1.
fn pool<C: Connect + Clone>(connector: C) -> Client<C, kube::client::Body> {
    Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_AFTER_IDLE)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .build(connector)
}

/// A request's place on its lane.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<C> tower::Service<http::Request<kube::client::Body>> for Lanes<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    type Response = http::Response<SlotBody>;
    type Error = Error;
    type Future = BoxFuture<'static, Result<Self::Response, Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // hyper's client is always ready: it queues in its pool.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let (client, slot) = self.take_slot();
        Box::pin(async move {
            let response = client.request(request).await?;
            Ok(response.map(|body| SlotBody { body, _slot: slot }))
        })
    }
}

/// A response body that keeps its request's slot until it is dropped.
pub struct SlotBody {
    body: Incoming,
    _slot: Slot,
}

impl hyper::body::Body for SlotBody {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::client::legacy::connect::HttpConnector;

    #[tokio::test]
    async fn a_full_lane_opens_the_next_and_a_freed_slot_is_reused() {
        let lanes = Lanes::new(HttpConnector::new());
        let mut held: Vec<Slot> = (0..STREAMS_PER_CONNECTION).map(|_| lanes.take_slot().1).collect();
        assert_eq!(lanes.lanes.lock().unwrap().len(), 1, "one lane carries {STREAMS_PER_CONNECTION} requests");
        held.push(lanes.take_slot().1);
        assert_eq!(lanes.lanes.lock().unwrap().len(), 2, "request {} opens a second lane", STREAMS_PER_CONNECTION + 1);
        held.swap_remove(0);
        let (_, slot) = lanes.take_slot();
        assert_eq!(lanes.lanes.lock().unwrap().len(), 2, "a slot freed on the first lane is used again");
        let counts: Vec<usize> =
            lanes.lanes.lock().unwrap().iter().map(|l| l.streams.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, [STREAMS_PER_CONNECTION, 1]);
        drop((held, slot));
        let counts: Vec<usize> =
            lanes.lanes.lock().unwrap().iter().map(|l| l.streams.load(Ordering::Relaxed)).collect();
        assert_eq!(counts, [0, 0], "every slot is given back");
    }
}
