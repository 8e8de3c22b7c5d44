//! What one client connection may hold, below HTTP: a deadline for its first request, an idle
//! deadline between requests, and a cap on the connections one client address keeps open.
//!
//! hyper's own header timeout covers only HTTP/1 once it knows the protocol. A connection that
//! sends nothing, a single byte, or only the HTTP/2 preface never gets that far, and HTTP/2 has
//! no idle limit at all: such sockets, opened before any authentication, would each hold one of
//! `max_connections` for ever. So every connection is watched here, whatever its protocol: it is
//! closed when it has no request in flight and has been quiet for longer than it may be.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::body_budget::ClientAddr;

/// How long a connection may stay quiet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// From accepting the connection to its first request's headers (`gateway.header_timeout`).
    pub first_request: Duration,
    /// From the end of a response to the next request's headers (`gateway.idle_timeout`).
    pub idle: Duration,
    /// How long a response that has data for the client may wait for the client to take it
    /// (`gateway.write_idle_timeout`).
    pub write_idle: Duration,
}

/// What a connection's watch does when a deadline passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overdue {
    /// Quiet without a request in flight: closed gracefully.
    Idle,
    /// A response waits on a client that stopped reading: the connection is dropped, which
    /// drops the response (an engine run or a passthrough's upstream request with it) and frees
    /// its request slot. A graceful close would wait on the same full socket.
    Unread,
}

/// Whether a connection is serving anything, and since when it has not been.
#[derive(Debug)]
pub struct Activity {
    in_flight: AtomicUsize,
    /// Response bodies that handed a frame to the connection and have not been asked for the
    /// next one yet (the connection is writing, or cannot write, what they gave), each with
    /// when it handed it. Kept per body: on HTTP/2 one stream that its client stopped taking
    /// must not be hidden by another stream of the same connection that is still read.
    handed: Mutex<HashMap<u64, Instant>>,
    /// Ids for the response bodies of this connection.
    next_body: AtomicU64,
    state: Mutex<Quiet>,
    changed: Notify,
}

#[derive(Debug, Clone, Copy)]
struct Quiet {
    since: Instant,
    /// Whether any request came: before the first, the first-request deadline applies.
    served: bool,
}

impl Activity {
    /// A connection just accepted.
    pub fn new() -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            in_flight: AtomicUsize::new(0),
            handed: Mutex::new(HashMap::new()),
            next_body: AtomicU64::new(0),
            state: Mutex::new(Quiet {
                since: now,
                served: false,
            }),
            changed: Notify::new(),
        })
    }

    fn quiet(&self) -> std::sync::MutexGuard<'_, Quiet> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request's headers arrived; it is in flight until the returned guard is dropped (with
    /// the response body, once it is sent or the client is gone).
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.quiet().served = true;
        self.changed.notify_one();
        Busy(self.clone())
    }

    /// When the connection is to be closed, and why, if nothing happens before. With a request
    /// in flight only a client that stopped taking its response is a reason (a slow answer or
    /// a long stream is bounded elsewhere); without one, quiet.
    pub fn deadline(&self, d: Deadlines) -> Option<(Instant, Overdue)> {
        let q = *self.quiet();
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            // The body whose frame has waited longest decides.
            return self
                .handed_bodies()
                .values()
                .min()
                .map(|&at| (at + d.write_idle, Overdue::Unread));
        }
        let wait = if q.served { d.idle } else { d.first_request };
        Some((q.since + wait, Overdue::Idle))
    }

    fn handed_bodies(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Instant>> {
        self.handed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Response body `id` was asked for its next frame (the connection took the last one), or
    /// is gone.
    fn pulled(&self, id: u64) {
        // No wake-up: this only moves the deadline later, and the watch rechecks a deadline
        // when it comes.
        self.handed_bodies().remove(&id);
    }

    /// Response body `id` gave the connection a frame to write.
    fn handed(&self, id: u64) {
        self.handed_bodies().insert(id, Instant::now());
        self.changed.notify_one();
    }

    /// Wakes when a request begins or ends.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// A request in flight on a connection (see [`Activity::begin`]).
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.quiet().since = Instant::now();
        }
        self.0.changed.notify_one();
    }
}

/// A response body that keeps its request in flight until it is done or dropped (a streamed
/// answer with long pauses between tokens is not an idle connection), and tells its
/// connection's [`Activity`] when it hands over a frame and when the next is asked for: a
/// frame handed over and no next one asked for means the client is not taking what it was sent.
pub struct BusyBody {
    inner: Body,
    /// Its id among its connection's bodies.
    id: u64,
    /// Whether the last frame asked for was given and the next not asked for yet.
    handed: bool,
    busy: Busy,
}

impl BusyBody {
    /// `body`, holding `busy` for as long as it lives.
    pub fn wrap(inner: Body, busy: Busy) -> Body {
        let id = busy.0.next_body.fetch_add(1, Ordering::Relaxed);
        Body::new(Self {
            inner,
            id,
            handed: false,
            busy,
        })
    }
}

impl Drop for BusyBody {
    fn drop(&mut self) {
        if self.handed {
            self.busy.0.pulled(self.id);
        }
    }
}

impl HttpBody for BusyBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if std::mem::take(&mut self.handed) {
            self.busy.0.pulled(self.id);
        }
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = frame {
            self.handed = true;
            self.busy.0.handed(self.id);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The router, with each request counted in flight on its connection's [`Activity`] until
/// its response body is done.
#[derive(Clone)]
pub struct Tracked {
    app: axum::Router,
    activity: Arc<Activity>,
    client: Option<IpAddr>,
}

impl Tracked {
    /// `app` serving the connection whose activity is `activity`, from `client` (set on each
    /// request as a [`ClientAddr`]).
    pub fn new(app: axum::Router, activity: Arc<Activity>, client: Option<IpAddr>) -> Self {
        Self {
            app,
            activity,
            client,
        }
    }
}

impl tower::Service<axum::extract::Request<hyper::body::Incoming>> for Tracked {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower::Service::<axum::extract::Request<hyper::body::Incoming>>::poll_ready(
            &mut self.app,
            cx,
        )
    }

    fn call(&mut self, mut req: axum::extract::Request<hyper::body::Incoming>) -> Self::Future {
        if let Some(ip) = self.client {
            req.extensions_mut().insert(ClientAddr(ip));
        }
        let busy = self.activity.begin();
        let answer = self.app.call(req);
        Box::pin(async move {
            let res = answer.await?;
            Ok(res.map(|body| BusyBody::wrap(body, busy)))
        })
    }
}

/// Open connections per client address, at most `cap` each (0: no cap).
#[derive(Debug)]
pub struct PerAddress {
    cap: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One of a client address's connections; given back when dropped.
#[derive(Debug)]
pub struct AddressSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerAddress {
    /// At most `cap` connections per address; 0 for no cap.
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            open: Arc::default(),
        }
    }

    /// A slot for one more connection from `ip`, or `None` when it has `cap` open already.
    pub fn try_take(&self, ip: IpAddr) -> Option<AddressSlot> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if self.cap > 0 && *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            ip,
            open: self.open.clone(),
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_cap_and_a_slot_comes_back_when_dropped() {
        let per = PerAddress::new(2);
        let a: IpAddr = [127, 0, 0, 2].into();
        let b: IpAddr = [127, 0, 0, 3].into();
        let s1 = per.try_take(a);
        let s2 = per.try_take(a);
        assert!(s1.is_some() && s2.is_some());
        assert!(per.try_take(a).is_none(), "a third from the same address");
        assert!(per.try_take(b).is_some(), "another address has its own");
        drop(s1);
        assert!(per.try_take(a).is_some());
        assert!(PerAddress::new(0).try_take(a).is_some(), "0: no cap");
    }

    fn deadlines() -> Deadlines {
        Deadlines {
            first_request: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            write_idle: Duration::from_secs(30),
        }
    }

    /// The deadline less `wait`, when it is for `why`.
    fn started(a: &Activity, wait: Duration, why: Overdue) -> Option<Instant> {
        a.deadline(deadlines())
            .filter(|d| d.1 == why)
            .map(|d| d.0 - wait)
    }

    #[tokio::test]
    async fn the_deadline_is_the_first_requests_then_the_idle_one_and_none_while_busy() {
        let d = deadlines();
        let before = Instant::now();
        let a = Activity::new();
        let after = Instant::now();
        let first = started(&a, d.first_request, Overdue::Idle);
        assert!(
            first.is_some_and(|t| before <= t && t <= after),
            "{first:?}"
        );
        let busy = a.begin();
        let other = a.begin();
        assert_eq!(a.deadline(d), None);
        drop(busy);
        assert_eq!(a.deadline(d), None, "one request is still in flight");
        let before = Instant::now();
        drop(other);
        let after = Instant::now();
        let idle = started(&a, d.idle, Overdue::Idle);
        assert!(idle.is_some_and(|t| before <= t && t <= after), "{idle:?}");
    }

    #[tokio::test]
    async fn a_body_whose_frame_is_not_taken_is_overdue_after_the_write_idle() {
        use http_body_util::BodyExt;
        let d = deadlines();
        let a = Activity::new();
        let mut body = BusyBody::wrap(Body::from("one frame"), a.begin());
        assert_eq!(a.deadline(d), None, "in flight, nothing handed yet");
        let before = Instant::now();
        assert!(body.frame().await.is_some_and(|f| f.is_ok()));
        let after = Instant::now();
        // A frame was handed and the next not asked for.
        let due = started(&a, d.write_idle, Overdue::Unread);
        assert!(due.is_some_and(|t| before <= t && t <= after), "{due:?}");
        // Asked again (the connection wrote it): nothing is owed.
        assert!(body.frame().await.is_none());
        assert_eq!(a.deadline(d), None);
        drop(body);
        assert!(started(&a, d.idle, Overdue::Idle).is_some());
    }
}
