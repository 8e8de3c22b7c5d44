//! The accept loop against raw sockets: quiet connections are closed whatever they sent (nothing,
//! a byte, the HTTP/2 preface), a kept-alive one when idle but never while its answer streams,
//! one address cannot hold more than its cap while others are served, and shutdown lets a
//! stream in flight finish.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

use crate::policy::{Auth, GatewayPolicy};
use crate::server::accept_loop;

const SLOW_CHUNKS: usize = 3;
const SLOW_GAP: Duration = Duration::from_millis(400);

fn gateway(header: Duration, idle: Duration, per_ip: usize) -> GatewayPolicy {
    writing(header, idle, per_ip, Duration::from_secs(60))
}

fn writing(header: Duration, idle: Duration, per_ip: usize, write_idle: Duration) -> GatewayPolicy {
    GatewayPolicy {
        auth: Auth::None,
        api_keys_env: None,
        max_body_bytes: 1 << 20,
        max_concurrent_requests: 64,
        request_timeout: Duration::from_secs(30),
        header_timeout: header,
        max_n: 16,
        max_response_bytes: 32 << 20,
        body_timeout: std::time::Duration::from_secs(30),
        body_idle_timeout: std::time::Duration::from_secs(10),
        max_connections: 1024,
        idle_timeout: idle,
        max_connections_per_ip: per_ip,
        write_idle_timeout: write_idle,
        max_tokens_limit: 1000,
        default_max_tokens: 100,
    }
}

/// Only the write-idle deadline short: the others far off, no per-address cap.
fn only_writing(write_idle: Duration) -> GatewayPolicy {
    writing(
        Duration::from_secs(30),
        Duration::from_secs(30),
        0,
        write_idle,
    )
}

/// Set when the endless answer is dropped (its connection gone).
static ENDLESS_DROPPED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// The same for the HTTP/2 test's own endless answer (tests run side by side).
static ENDLESS_H2_DROPPED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

struct SetOnDrop(&'static std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// How long until `dropped` is set (an endless answer was dropped); fails the test if that
/// takes `within` or more, naming `what` was kept.
async fn until_dropped(
    dropped: &std::sync::atomic::AtomicBool,
    within: Duration,
    what: &str,
) -> Duration {
    let started = Instant::now();
    while !dropped.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(started.elapsed() < within, "{what} was kept for {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// 64 KiB chunks for ever, as fast as they are taken; `dropped` is set when the answer is.
fn endless(dropped: &'static std::sync::atomic::AtomicBool) -> Body {
    let guard = SetOnDrop(dropped);
    let chunks = futures::stream::repeat_with(move || {
        let _held = &guard;
        Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 64 << 10]))
    });
    Body::from_stream(chunks)
}

/// `/health` answers at once; `/slow` streams a few chunks with pauses longer than the idle
/// deadlines the tests set; `/endless` and `/endless-h2` stream 64 KiB chunks for ever, as fast
/// as they may; `/trickle` a small chunk every 100 ms for 6 s.
fn app() -> Router {
    Router::new()
        .route("/endless", get(|| async { endless(&ENDLESS_DROPPED) }))
        .route(
            "/endless-h2",
            get(|| async { endless(&ENDLESS_H2_DROPPED) }),
        )
        .route(
            "/trickle",
            get(|| async {
                let chunks = futures::stream::unfold(0usize, |i| async move {
                    (i < 60).then_some(())?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((Ok::<_, std::io::Error>(Bytes::from_static(b"t")), i + 1))
                });
                Body::from_stream(chunks)
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                let chunks = futures::stream::unfold(0usize, |i| async move {
                    if i == SLOW_CHUNKS {
                        return None;
                    }
                    tokio::time::sleep(SLOW_GAP).await;
                    Some((
                        Ok::<_, std::io::Error>(Bytes::from(format!("chunk{i};"))),
                        i + 1,
                    ))
                });
                Body::from_stream(chunks)
            }),
        )
}

/// A running accept loop; sending on the handle shuts it down, and the task ends when drained.
async fn serve(
    gw: GatewayPolicy,
) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        accept_loop(listener, app(), &gw, async {
            let _ = stopped.await;
        })
        .await;
    });
    (addr, stop, task)
}

/// A connection from the loopback address `from` (127.0.0.x: one machine, several clients).
async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap_or_else(|e| panic!("socket: {e}"));
    s.bind(SocketAddr::from((from, 0)))
        .unwrap_or_else(|e| panic!("bind {from:?}: {e}"));
    s.connect(to)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// Reads until the server closes the connection (end of stream or a reset); what it sent,
/// and when it closed, or `None` when it is still open after `limit`.
async fn until_closed(s: &mut TcpStream, limit: Duration) -> Option<(Vec<u8>, Instant)> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let closed = tokio::time::timeout(limit, read_all).await.ok()?;
    Some((got, closed))
}

async fn get_health(s: &mut TcpStream) -> String {
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("no answer"))
        .unwrap_or_else(|e| panic!("read: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// An HTTP/2 client's opening: the preface, then an empty SETTINGS frame.
const H2_PREFACE_AND_SETTINGS: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[tokio::test]
async fn quiet_connections_are_closed_within_the_first_request_deadline_whatever_they_sent() {
    let deadline = Duration::from_millis(300);
    let (addr, _stop, _task) = serve(gateway(deadline, Duration::from_secs(30), 0)).await;
    let openings: [(&str, &[u8]); 4] = [
        ("nothing", b""),
        ("one byte", b"P"),
        (
            "the HTTP/2 preface alone",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ),
        ("the HTTP/2 preface and settings", H2_PREFACE_AND_SETTINGS),
    ];
    let mut held = Vec::new();
    for (what, bytes) in openings {
        let mut s = connect_from([127, 0, 0, 1], addr).await;
        s.write_all(bytes)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        held.push((what, s, Instant::now()));
    }
    // Watched together, so that each close is timed on its own and an early one shows.
    let closes =
        futures::future::join_all(held.into_iter().map(|(what, mut s, opened)| async move {
            let closed = until_closed(&mut s, Duration::from_secs(5)).await;
            (what, opened, closed.map(|(_, at)| at))
        }))
        .await;
    for (what, opened, at) in closes {
        let Some(at) = at else {
            panic!("{what}: still open 5 s after it was opened");
        };
        let after = at - opened;
        assert!(
            after >= deadline - Duration::from_millis(50),
            "{what}: closed after {after:?}, before its deadline"
        );
        // The watcher looks at least every deadline: later than twice it is a missed deadline.
        assert!(
            after <= 2 * deadline + Duration::from_secs(1),
            "{what}: closed only after {after:?}"
        );
    }
    // A client that sends its request in time is served.
    let mut s = connect_from([127, 0, 0, 1], addr).await;
    assert!(get_health(&mut s).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_when_idle_but_never_while_its_answer_streams() {
    let idle = Duration::from_millis(300);
    let (addr, _stop, _task) = serve(gateway(Duration::from_secs(30), idle, 0)).await;
    let mut s = connect_from([127, 0, 0, 1], addr).await;
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    // The answer pauses longer than the idle deadline between chunks, and arrives whole.
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let whole = tokio::time::timeout(Duration::from_secs(10), async {
        while !got.ends_with(b"0\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap_or(0);
            assert!(
                n > 0,
                "closed mid-answer: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(whole.is_ok(), "{}", String::from_utf8_lossy(&got));
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.contains("chunk0;") && text.contains("chunk2;"),
        "{text}"
    );
    // Then it is quiet, and closed.
    let answered = Instant::now();
    let closed = until_closed(&mut s, Duration::from_secs(5)).await;
    let Some((_, at)) = closed else {
        panic!("an idle kept-alive connection stayed open");
    };
    assert!(at - answered >= idle - Duration::from_millis(50));
}

#[tokio::test]
async fn one_address_holds_at_most_its_cap_while_another_is_served() {
    let cap = 256;
    let (addr, _stop, _task) = serve(gateway(
        Duration::from_secs(30),
        Duration::from_secs(30),
        cap,
    ))
    .await;
    // Hundreds of idle connections from one address.
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(connect_from([127, 0, 0, 2], addr).await);
    }
    // Those over the cap are closed at once; the others stay open.
    let mut closed = 0;
    for s in &mut held {
        if until_closed(s, Duration::from_millis(20)).await.is_some() {
            closed += 1;
        }
    }
    assert_eq!(closed, 300 - cap);
    // Another address is served meanwhile.
    let mut s = connect_from([127, 0, 0, 1], addr).await;
    assert!(get_health(&mut s).await.starts_with("HTTP/1.1 200"));
    // A slot comes back when a connection ends.
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut s = connect_from([127, 0, 0, 2], addr).await;
    assert!(get_health(&mut s).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn shutdown_lets_a_stream_in_flight_finish_and_closes_idle_connections() {
    let (addr, stop, task) =
        serve(gateway(Duration::from_secs(30), Duration::from_secs(30), 0)).await;
    let mut idle = connect_from([127, 0, 0, 1], addr).await;
    let mut s = connect_from([127, 0, 0, 1], addr).await;
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = stop.send(());
    let got = until_closed(&mut s, Duration::from_secs(10)).await;
    let text = got.map(|g| String::from_utf8_lossy(&g.0).into_owned());
    assert!(
        text.as_deref()
            .is_some_and(|t| t.contains("chunk2;") && t.ends_with("0\r\n\r\n")),
        "{text:?}"
    );
    assert!(
        until_closed(&mut idle, Duration::from_secs(5))
            .await
            .is_some()
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .is_ok(),
        "the accept loop did not end once drained"
    );
}

#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_with_its_answer_after_the_write_idle() {
    let write_idle = Duration::from_millis(500);
    let (addr, _stop, _task) = serve(only_writing(write_idle)).await;
    let mut s = connect_from([127, 0, 0, 1], addr).await;
    s.write_all(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap_or_else(|e| panic!("write: {e}"));
    // Nothing is read: the socket's buffers fill, and then the answer waits on the client.
    let took = until_dropped(
        &ENDLESS_DROPPED,
        Duration::from_secs(10),
        "an answer its client does not read",
    )
    .await;
    assert!(took >= write_idle);
    // The connection is gone too: what was in the buffers, then the end.
    assert!(
        until_closed(&mut s, Duration::from_secs(10))
            .await
            .is_some()
    );
}

/// hyper starts its HTTP/1 header timer when a kept-alive connection goes idle: with the
/// header deadline shorter than the idle one, keep-alive used to end at the header deadline.
#[tokio::test]
async fn a_kept_alive_http1_connection_lasts_its_idle_deadline_not_the_header_one() {
    let (header, idle) = (Duration::from_millis(300), Duration::from_millis(2000));
    let (addr, _stop, _task) = serve(gateway(header, idle, 0)).await;
    let mut s = connect_from([127, 0, 0, 1], addr).await;
    assert!(get_health(&mut s).await.starts_with("HTTP/1.1 200"));
    // Past the header deadline, well before the idle one: the connection still serves.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(get_health(&mut s).await.starts_with("HTTP/1.1 200"));
    // And it is closed once idle for its deadline.
    let answered = Instant::now();
    let Some((_, at)) = until_closed(&mut s, Duration::from_secs(10)).await else {
        panic!("an idle kept-alive connection stayed open");
    };
    let after = at - answered;
    assert!(
        after >= idle - Duration::from_millis(50) && after <= idle + Duration::from_secs(2),
        "closed {after:?} after its answer"
    );
}

/// On HTTP/2 one stream whose client stopped taking it is dropped after the write-idle
/// deadline even while another stream of the same connection is read all along (a deadline
/// kept per connection was moved by the live stream, and the stalled one held its slot).
#[tokio::test]
async fn an_http2_stream_its_client_stopped_reading_is_not_hidden_by_a_live_one() {
    let write_idle = Duration::from_millis(500);
    let (addr, _stop, _task) = serve(only_writing(write_idle)).await;
    let tcp = connect_from([127, 0, 0, 1], addr).await;
    // A connection window large enough that the stalled stream cannot starve the live one.
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(64 << 10)
        .initial_connection_window_size(64 << 20)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap_or_else(|e| panic!("handshake: {e}"));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut client = client
        .ready()
        .await
        .unwrap_or_else(|e| panic!("ready: {e}"));
    let ask = |path: &str| {
        http::Request::get(format!("http://{addr}{path}"))
            .body(())
            .unwrap_or_else(|e| panic!("request: {e}"))
    };
    let (stalled, _) = client
        .send_request(ask("/endless-h2"), true)
        .unwrap_or_else(|e| panic!("send: {e}"));
    let (live, _) = client
        .send_request(ask("/trickle"), true)
        .unwrap_or_else(|e| panic!("send: {e}"));
    // The stalled stream's body is never read, so its window is never given back.
    let _stalled = stalled.await.unwrap_or_else(|e| panic!("head: {e}"));
    let mut live = live
        .await
        .unwrap_or_else(|e| panic!("head: {e}"))
        .into_body();
    let reader = tokio::spawn(async move {
        while let Some(Ok(chunk)) = live.data().await {
            let _ = live.flow_control().release_capacity(chunk.len());
        }
    });
    // The live stream lasts 6 s: the stalled one must go well before it ends.
    let took = until_dropped(
        &ENDLESS_H2_DROPPED,
        Duration::from_secs(4),
        "a stalled stream, while another stream of its connection was read,",
    )
    .await;
    assert!(took >= write_idle - Duration::from_millis(50));
    reader.abort();
}
