//! The accept loop shared by every HTTP listener (node, edge, admin): HTTP/1.1 and HTTP/2
//! on one port, a cap on connections, header size and header time bounded, and a graceful
//! stop. Servers take their listener and shutdown signal as arguments (as mini-redis
//! does), so tests bind port 0 and stop them.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use super::contract::Body;
use super::metrics::GatewayMetrics;
use super::proxy;

/// The `[server]` table of a gateway binary's configuration: where it listens and the
/// bounds on what a client may do to it.
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub header_read_timeout_ms: u64,
    pub max_header_bytes: usize,
    pub max_connections: usize,
    pub h2_max_concurrent_streams: u32,
    pub drain_ms: u64,
    pub send_timeout_ms: u64,
    pub body_read_timeout_ms: u64,
}

impl Default for ServerSettings {
    fn default() -> Self {
        let limits = ServerLimits::default();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            header_read_timeout_ms: limits.header_read_timeout.as_millis() as u64,
            max_header_bytes: limits.max_header_bytes,
            max_connections: limits.max_connections,
            h2_max_concurrent_streams: limits.h2_max_concurrent_streams,
            drain_ms: limits.drain.as_millis() as u64,
            send_timeout_ms: limits.send_timeout.as_millis() as u64,
            body_read_timeout_ms: limits.body_read_timeout.as_millis() as u64,
        }
    }
}

impl ServerSettings {
    pub fn limits(&self) -> ServerLimits {
        ServerLimits {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            max_header_bytes: self.max_header_bytes,
            max_connections: self.max_connections,
            h2_max_concurrent_streams: self.h2_max_concurrent_streams,
            drain: Duration::from_millis(self.drain_ms),
            send_timeout: Duration::from_millis(self.send_timeout_ms),
            body_read_timeout: Duration::from_millis(self.body_read_timeout_ms),
        }
    }

    pub async fn bind(&self) -> std::io::Result<(TcpListener, TcpListener)> {
        bind_pair(self.listen, self.admin_listen).await
    }
}

#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// A client must finish sending a request head within this (slow-client bound).
    pub header_read_timeout: Duration,
    /// Request head size bound; larger heads get 431 (HTTP/1.1) or a stream reset (HTTP/2).
    pub max_header_bytes: usize,
    /// Connections open at once; one more is closed at accept.
    pub max_connections: usize,
    pub h2_max_concurrent_streams: u32,
    /// In-flight requests get this long to finish once shutdown is signalled.
    pub drain: Duration,
    /// A write to a client may wait this long for the client to take bytes (nginx's
    /// `send_timeout`, with its default); then the connection is closed. A client that
    /// stops reading a response held its slot, the upstream connection the response
    /// streams from and its place under `upstream.max_in_flight` for good.
    pub send_timeout: Duration,
    /// A request body may go this long without a byte from the client (nginx's
    /// `client_body_timeout`, with its default); then the exchange is given up. A client
    /// uploading slowly held an upstream connection for as long as it liked.
    pub body_read_timeout: Duration,
}

/// A `[server]` value the server would run with but not serve under: each of these was
/// accepted at start and then dropped every connection, refused every HTTP/2 stream, or
/// panicked in `serve`.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error(
        "server.header_read_timeout_ms must be at least 1: 0 drops every connection whose \
         head is not already buffered"
    )]
    HeaderReadTimeout,
    #[error(
        "server.max_connections must be 1..={}",
        tokio::sync::Semaphore::MAX_PERMITS
    )]
    MaxConnections,
    #[error("server.h2_max_concurrent_streams must be at least 1: 0 refuses every HTTP/2 stream")]
    H2Streams,
    #[error("server.max_header_bytes must be {}..={}", MIN_HEADER_BYTES, u32::MAX)]
    MaxHeaderBytes,
    #[error(
        "server.send_timeout_ms and body_read_timeout_ms must be at least 1: 0 would cut \
         every write or read that waits"
    )]
    NoSendTimeout,
}

/// hyper's HTTP/1.1 read buffer has a floor of 8 KiB; HTTP/2 takes the same bound, so a
/// head too large for one is too large for the other.
pub const MIN_HEADER_BYTES: usize = 8 * 1024;

impl ServerLimits {
    pub fn check(&self) -> Result<(), LimitsError> {
        if self.header_read_timeout.is_zero() {
            return Err(LimitsError::HeaderReadTimeout);
        }
        if !(1..=tokio::sync::Semaphore::MAX_PERMITS).contains(&self.max_connections) {
            return Err(LimitsError::MaxConnections);
        }
        if self.h2_max_concurrent_streams == 0 {
            return Err(LimitsError::H2Streams);
        }
        if !(MIN_HEADER_BYTES..=u32::MAX as usize).contains(&self.max_header_bytes) {
            return Err(LimitsError::MaxHeaderBytes);
        }
        if self.send_timeout.is_zero() || self.body_read_timeout.is_zero() {
            return Err(LimitsError::NoSendTimeout);
        }
        Ok(())
    }
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 16 * 1024,
            max_connections: 10_000,
            h2_max_concurrent_streams: 256,
            drain: Duration::from_secs(5),
            send_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(60),
        }
    }
}

/// Serves `listener` until `shutdown` turns true, then drains. `on_refused` is told of each
/// connection closed at the cap.
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: ServerLimits,
    handler: H,
    on_refused: impl Fn() + Send + 'static,
    mut shutdown: watch::Receiver<bool>,
) where
    H: Fn(Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // hyper's floor for the read buffer is 8 KiB.
        .max_buf_size(limits.max_header_bytes.max(MIN_HEADER_BYTES));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.h2_max_concurrent_streams)
        .max_header_list_size(
            u32::try_from(limits.max_header_bytes.max(MIN_HEADER_BYTES)).unwrap_or(u32::MAX),
        )
        // An HTTP/2 connection with no stream open holds a slot as long as its peer
        // answers pings; one that stops answering (gone, or a peer that never reads) is
        // closed instead of holding it for good.
        .keep_alive_interval(Some(H2_PING_EVERY))
        .keep_alive_timeout(H2_PING_TIMEOUT);
    loop {
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                // EMFILE and friends: back off briefly rather than spin.
                Err(_) => { tokio::time::sleep(Duration::from_millis(5)).await; continue; }
            },
            _ = shutdown.changed() => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            on_refused();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let service = service_fn(move |mut req: Request<Incoming>| {
            // Hop-by-hop headers (and those `Connection` names) are this hop's: dropped on
            // arrival, so the key a gateway decides on is the one it forwards. Stripped
            // only on the way out, `Connection: authorization` beside a malformed decoy
            // let a request past the edge's per-key floor with a key the node accepted.
            proxy::strip_hop_by_hop(req.headers_mut());
            let f = handler(req, peer);
            async move { Ok::<_, Infallible>(f.await) }
        });
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        let (head_by, send_timeout) = (limits.header_read_timeout, limits.send_timeout);
        tokio::spawn(async move {
            // hyper's HTTP/1 header timer starts once the protocol is known, and telling
            // HTTP/1 from HTTP/2 reads the first bytes with no timer: a client that sends
            // nothing held its slot for good, and `max_connections` of them shut the
            // listener. The start of a request must come within the head's bound.
            if request_begins(&stream, head_by).await {
                let io = TokioIo::new(SendTimeout::new(stream, send_timeout));
                let conn = builder.serve_connection(io, service);
                let _ = watcher.watch(conn.into_owned()).await;
            }
            drop(permit);
        });
    }
    let _ = tokio::time::timeout(limits.drain, graceful.shutdown()).await;
}

/// A client connection whose writes wait at most `limit` for the client to take bytes
/// (`ServerLimits::send_timeout`); reads pass through.
struct SendTimeout<S> {
    inner: S,
    stall: Stall,
}

impl<S> SendTimeout<S> {
    fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            stall: Stall::new(limit),
        }
    }

    fn bounded<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.stall.progress();
            return r;
        }
        if self.stall.expired(cx) {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no bytes for send_timeout",
            )));
        }
        Poll::Pending
    }
}

/// A bound on how long polls may stay Pending in a row: `SendTimeout`'s writes and a
/// request body's reads (`proxy::ClientBody`). The first Pending arms it, any progress
/// clears it.
pub(crate) struct Stall {
    limit: Duration,
    since: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stall {
    pub(crate) fn new(limit: Duration) -> Self {
        Self { limit, since: None }
    }

    pub(crate) fn progress(&mut self) {
        self.since = None;
    }

    /// A poll came back Pending: whether `limit` has passed since the first of them in a
    /// row (if not, `cx` is woken when it does).
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let limit = self.limit;
        self.since
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)))
            .as_mut()
            .poll(cx)
            .is_ready()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SendTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SendTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.bounded(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.bounded(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.bounded(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.bounded(cx, r)
    }
}

/// HTTP/2 keep-alive pings on an idle connection, and how long an answer may take.
const H2_PING_EVERY: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a request starts on `stream` within `within`: a line end, or as many bytes as
/// the HTTP/2 preface, seen without reading them (hyper reads them next). A client that
/// sends nothing, or a few bytes and then nothing, is let go at the bound.
async fn request_begins(stream: &tokio::net::TcpStream, within: Duration) -> bool {
    const PREFACE_BYTES: usize = 24;
    let deadline = tokio::time::Instant::now() + within;
    let mut seen = [0u8; PREFACE_BYTES];
    loop {
        match tokio::time::timeout_at(deadline, stream.peek(&mut seen)).await {
            Ok(Ok(n)) if n == PREFACE_BYTES || seen[..n].contains(&b'\n') => return true,
            // End of stream, an error, or the bound.
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return false,
            // A partial start: peeking again returns at once with the same bytes, so wait
            // a little for the rest.
            Ok(Ok(_)) => {
                if tokio::time::Instant::now() >= deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// A gateway process's two faces: the API listener and the admin listener.
pub trait Gateway: Send + Sync + 'static {
    fn handle(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
    ) -> impl Future<Output = Response<Body>> + Send;
    /// `/metrics`, `/healthz`, `/readyz`.
    fn admin(&self, req: &Request<Incoming>) -> Response<Body>;
    fn metrics(&self) -> &GatewayMetrics;
}

/// Serves `gateway` on `listener` (API traffic) and `admin` until `shutdown` turns true.
pub async fn run<G: Gateway>(
    gateway: Arc<G>,
    limits: ServerLimits,
    listener: TcpListener,
    admin: TcpListener,
    shutdown: watch::Receiver<bool>,
) {
    let api = {
        let (g, refused) = (Arc::clone(&gateway), Arc::clone(&gateway));
        serve(
            listener,
            limits,
            move |req, peer| {
                let g = Arc::clone(&g);
                async move { g.handle(req, peer).await }
            },
            move || {
                refused
                    .metrics()
                    .connections_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            },
            shutdown.clone(),
        )
    };
    let admin = {
        let g = Arc::clone(&gateway);
        serve(
            admin,
            ServerLimits {
                max_connections: 64,
                ..limits
            },
            move |req, _| {
                let g = Arc::clone(&g);
                async move { g.admin(&req) }
            },
            || {},
            shutdown,
        )
    };
    tokio::join!(api, admin);
}

/// Binds the API and admin listeners, naming the address that failed.
pub async fn bind_pair(
    listen: SocketAddr,
    admin_listen: SocketAddr,
) -> std::io::Result<(TcpListener, TcpListener)> {
    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("binding {addr}: {e}")))
    };
    Ok((bind(listen).await?, bind(admin_listen).await?))
}

/// `run` until SIGTERM or Ctrl-C (or `stop` is sent), then drain: the binaries' main loop.
/// SIGTERM is what systemd, Kubernetes and `docker stop` send; with Ctrl-C alone it killed
/// the process mid-request and `drain_ms` never applied.
pub async fn run_until_ctrl_c<G: Gateway>(
    gateway: Arc<G>,
    limits: ServerLimits,
    (listener, admin): (TcpListener, TcpListener),
    stop: watch::Sender<bool>,
) {
    let shutdown = stop.subscribe();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = stop.send(true);
    });
    run(gateway, limits, listener, admin, shutdown).await;
}
