//! The reverse-proxy hop, shared by the node and the edge guard: streaming bodies both
//! ways, pooled upstream connections, an upstream that is down or slow turned into a
//! 502 or 504 within a bound, never a hang, and a cap on exchanges in flight to it (503
//! past it, as Envoy's circuit breaker does).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, Version};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::contract::{self, Body};
use super::metrics::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream `{0}` is not an http://host:port URL")]
    BadUrl(String),
    #[error("upstream.max_in_flight must be 1..={}", Semaphore::MAX_PERMITS)]
    InFlightOutOfRange,
    #[error(
        "upstream.timeout_ms and connect_timeout_ms must be at least 1: 0 fails every \
         exchange, after the limiter charged its key"
    )]
    NoTimeout,
    #[error(transparent)]
    Server(#[from] super::server::LimitsError),
}

/// The `[upstream]` table: where requests go on to, and how long they may take.
#[derive(Clone, Debug, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpstreamSettings {
    pub urls: Vec<String>,
    pub connect_timeout_ms: u64,
    pub timeout_ms: u64,
    pub pool_idle_per_host: usize,
    /// Exchanges with the upstream in flight at once, from the request sent until its
    /// response body is done or dropped; one more is answered 503 at once. Without it
    /// each request in flight could hold an upstream connection of its own (the client
    /// pool has no cap), up to `max_connections` x `h2_max_concurrent_streams`. 1,024 is
    /// Envoy's default for a cluster's `max_requests`.
    pub max_in_flight: usize,
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self {
            urls: vec!["http://127.0.0.1:8081".into()],
            connect_timeout_ms: 1_000,
            timeout_ms: 10_000,
            pool_idle_per_host: 256,
            max_in_flight: 1_024,
        }
    }
}

impl UpstreamSettings {
    /// `client`: the server's bounds on a client that stops taking a response or stops
    /// sending its request's body (`ServerLimits`), held here per exchange.
    pub fn build(&self, client: &super::server::ServerLimits) -> Result<Upstream, UpstreamError> {
        // The server's own bounds are checked here too: every gateway builds its upstream
        // from them at start, so a bad one stops it there.
        client.check()?;
        Upstream::new(self, client.send_timeout, client.body_read_timeout)
    }
}

/// One or more upstreams (the edge spreads over its nodes; a node has one API behind it),
/// chosen round-robin.
pub struct Upstream {
    targets: Vec<(Scheme, Authority)>,
    next: AtomicUsize,
    client: Client<HttpConnector, ClientBody>,
    timeout: Duration,
    send_timeout: Duration,
    body_read_timeout: Duration,
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
}

/// One exchange's place under `Upstream::max_in_flight`, held until its bodies are done.
pub struct Place(OwnedSemaphorePermit);

/// No place under `max_in_flight` was free (`Upstream::take_place`).
pub struct Overloaded;

impl Overloaded {
    /// The gateway's 503, and the outcome it counts as.
    pub fn response(&self, correlation_id: &str) -> (Response<Body>, Outcome) {
        (
            contract::gateway_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "upstream overloaded",
                correlation_id,
            ),
            Outcome::UpstreamOverloaded,
        )
    }
}

/// Headers that belong to one hop (RFC 9110 7.6.1) and never go further.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

impl Upstream {
    fn new(
        settings: &UpstreamSettings,
        send_timeout: Duration,
        body_read_timeout: Duration,
    ) -> Result<Self, UpstreamError> {
        let targets = settings
            .urls
            .iter()
            .map(|u| {
                let uri: Uri = u.parse().map_err(|_| UpstreamError::BadUrl(u.clone()))?;
                match (uri.scheme(), uri.authority()) {
                    (Some(s), Some(a)) if *s == Scheme::HTTP => Ok((s.clone(), a.clone())),
                    _ => Err(UpstreamError::BadUrl(u.clone())),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        if targets.is_empty() {
            return Err(UpstreamError::BadUrl(String::new()));
        }
        if !(1..=Semaphore::MAX_PERMITS).contains(&settings.max_in_flight) {
            return Err(UpstreamError::InFlightOutOfRange);
        }
        if settings.timeout_ms == 0 || settings.connect_timeout_ms == 0 {
            return Err(UpstreamError::NoTimeout);
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_millis(settings.connect_timeout_ms)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(settings.pool_idle_per_host)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            targets,
            next: AtomicUsize::new(0),
            client,
            timeout: Duration::from_millis(settings.timeout_ms),
            send_timeout,
            body_read_timeout,
            in_flight: Arc::new(Semaphore::new(settings.max_in_flight)),
            max_in_flight: settings.max_in_flight,
        })
    }

    /// Exchanges with the upstream in flight now (`max_in_flight` at most).
    pub fn in_flight(&self) -> usize {
        self.max_in_flight - self.in_flight.available_permits()
    }

    /// A place under `max_in_flight`, or the gateway's 503 when there is none. Taken
    /// before the limiter charges the key: a request the gateway sheds for its own
    /// overload never reached the API and must not spend the client's allowance.
    pub fn take_place(&self, correlation_id: &str) -> Result<Place, Overloaded> {
        Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map(Place)
            .map_err(|_| {
                tracing::warn!(
                    correlation_id,
                    max_in_flight = self.max_in_flight,
                    "upstream overloaded"
                );
                Overloaded
            })
    }

    /// Sends `req` on in `place` (`take_place`), with the correlation id and whatever
    /// `extra` headers the caller adds; returns the upstream's response with its body
    /// still streaming, or the gateway's own 502/504, and which of those it was.
    pub async fn forward(
        &self,
        place: Place,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        correlation_id: &str,
        extra: &[(HeaderName, HeaderValue)],
    ) -> (Response<Body>, Outcome) {
        let Place(permit) = place;
        let Some(uri) = self.target_uri(&req) else {
            return (
                contract::gateway_error(
                    StatusCode::BAD_REQUEST,
                    "bad request target",
                    correlation_id,
                ),
                Outcome::UpstreamError,
            );
        };
        *req.uri_mut() = uri;
        // The upstream leg is HTTP/1.1 whatever the client spoke: the pool is h1.
        *req.version_mut() = Version::HTTP_11;
        upstream_headers(req.headers_mut(), peer, correlation_id, extra);
        // The place is shared by the request body on its way up and the response body on
        // its way down, and goes when both are done.
        let permit = Arc::new(permit);
        let body_read_timeout = self.body_read_timeout;
        let req = req.map(|body| ClientBody::new(body, body_read_timeout, Arc::clone(&permit)));
        let answer = tokio::time::timeout(self.timeout, self.client.request(req)).await;
        self.respond(answer, permit, correlation_id)
    }

    /// The request's path and query on the next upstream, round-robin.
    fn target_uri(&self, req: &Request<Incoming>) -> Option<Uri> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.targets.len();
        let (scheme, authority) = &self.targets[i];
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query(path)
            .build()
            .ok()
    }

    /// The client's answer: the upstream's response relayed with its body streaming in
    /// `permit`'s place, or the gateway's 502 or 504.
    fn respond(
        &self,
        answer: Result<
            Result<Response<Incoming>, hyper_util::client::legacy::Error>,
            tokio::time::error::Elapsed,
        >,
        permit: Arc<OwnedSemaphorePermit>,
        correlation_id: &str,
    ) -> (Response<Body>, Outcome) {
        match answer {
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                contract::set_correlation(&mut parts.headers, correlation_id);
                (
                    Response::from_parts(
                        parts,
                        Either::Left(UpstreamBody::relay(
                            body,
                            self.timeout,
                            self.send_timeout,
                            permit,
                        )),
                    ),
                    Outcome::Proxied,
                )
            }
            Ok(Err(e)) => {
                tracing::warn!(correlation_id, error = %e, "upstream error");
                (
                    contract::gateway_error(
                        StatusCode::BAD_GATEWAY,
                        "upstream unavailable",
                        correlation_id,
                    ),
                    Outcome::UpstreamError,
                )
            }
            Err(_) => {
                tracing::warn!(
                    correlation_id,
                    timeout_ms = self.timeout.as_millis() as u64,
                    "upstream timeout"
                );
                (
                    contract::gateway_error(
                        StatusCode::GATEWAY_TIMEOUT,
                        "upstream timed out",
                        correlation_id,
                    ),
                    Outcome::UpstreamTimeout,
                )
            }
        }
    }
}

/// The request's headers as the upstream gets them: this hop's removed, the correlation
/// id set, the peer appended to `x-forwarded-for`, and the caller's `extra` added.
fn upstream_headers(
    h: &mut HeaderMap,
    peer: SocketAddr,
    correlation_id: &str,
    extra: &[(HeaderName, HeaderValue)],
) {
    strip_hop_by_hop(h);
    h.remove(http::header::HOST);
    contract::set_correlation(h, correlation_id);
    let forwarded = match h.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prior) => format!("{prior}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        h.insert("x-forwarded-for", v);
    }
    for (k, v) in extra {
        h.insert(k.clone(), v.clone());
    }
}

pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Headers named by Connection are hop-by-hop too.
    let named: Vec<HeaderName> = h
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client's request body on its way upstream, given up when no part of it comes for
/// `idle` (`ServerLimits::body_read_timeout`, nginx's `client_body_timeout`): a client
/// uploading slowly held an upstream connection for as long as it liked, and, once the
/// upstream had answered, no place under `max_in_flight` at all. It holds its share of
/// the exchange's place until it is done or dropped.
pub struct ClientBody {
    inner: Incoming,
    stall: super::server::Stall,
    in_flight: Option<Arc<OwnedSemaphorePermit>>,
}

impl ClientBody {
    fn new(inner: Incoming, idle: Duration, in_flight: Arc<OwnedSemaphorePermit>) -> Self {
        Self {
            inner,
            stall: super::server::Stall::new(idle),
            in_flight: Some(in_flight),
        }
    }
}

impl hyper::body::Body for ClientBody {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(r)) => {
                this.stall.progress();
                Poll::Ready(Some(r.map_err(BoxError::from)))
            }
            Poll::Ready(None) => {
                this.stall.progress();
                this.in_flight = None;
                Poll::Ready(None)
            }
            Poll::Pending if this.stall.expired(cx) => {
                this.in_flight = None;
                Poll::Ready(Some(Err("the client's request body stalled".into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// An upstream response's body, moved by a task of its own (`relay`) through a channel of
/// one frame, so both of its bounds hold whichever side stalls:
/// - the upstream: no frame for `idle` (the upstream timeout, which bounds the wait for
///   the head; a body that stalled after it held everything for good);
/// - the client: a frame not taken for `send_timeout`. Over HTTP/2 a stream the client
///   stopped reading waits on flow control with nothing polling its body and nothing
///   pending on the socket, so the server's `SendTimeout` never sees it.
///
/// Either way the relay ends, dropping the upstream connection and the exchange's place
/// under `max_in_flight`, and the client's stream ends in an error.
pub struct UpstreamBody {
    /// None once the body has ended whole, or from the start for a body with nothing in
    /// it (HEAD, 204, 304): hyper must see those as ended (`is_end_stream`), or it sends
    /// an empty DATA frame that contradicts a 304's `content-length` and resets the
    /// HTTP/2 stream, and adds `content-length: 0` to a 204 or a HEAD answer.
    frames: Option<tokio::sync::mpsc::Receiver<Result<hyper::body::Frame<bytes::Bytes>, BoxError>>>,
    size_hint: hyper::body::SizeHint,
    /// Set by a relay that gave up with a frame it could not hand over: the end of the
    /// channel is then an error, not the end of the body (a truncated response must not
    /// read as a whole one).
    cut: Arc<std::sync::atomic::AtomicBool>,
}

impl UpstreamBody {
    fn relay(
        inner: Incoming,
        idle: Duration,
        send_timeout: Duration,
        in_flight: Arc<OwnedSemaphorePermit>,
    ) -> Self {
        use hyper::body::Body as _;
        let size_hint = inner.size_hint();
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if inner.is_end_stream() {
            // Nothing to relay; the upstream connection and the place go at once.
            return Self {
                frames: None,
                size_hint,
                cut,
            };
        }
        let (tx, frames) = tokio::sync::mpsc::channel(1);
        tokio::spawn(relay(
            inner,
            tx,
            idle,
            send_timeout,
            in_flight,
            Arc::clone(&cut),
        ));
        Self {
            frames: Some(frames),
            size_hint,
            cut,
        }
    }
}

async fn relay(
    mut inner: Incoming,
    tx: tokio::sync::mpsc::Sender<Result<hyper::body::Frame<bytes::Bytes>, BoxError>>,
    idle: Duration,
    send_timeout: Duration,
    in_flight: Arc<OwnedSemaphorePermit>,
    cut: Arc<std::sync::atomic::AtomicBool>,
) {
    use http_body_util::BodyExt;
    let _in_flight = in_flight;
    loop {
        let next = tokio::select! {
            next = tokio::time::timeout(idle, inner.frame()) => next,
            // The client went away while the upstream was quiet: let go now, not at
            // the upstream timeout.
            () = tx.closed() => return,
        };
        let frame = match next {
            Ok(Some(Ok(frame))) => Ok(frame),
            Ok(Some(Err(e))) => Err(BoxError::from(e)),
            // The end: the upstream connection goes back to the pool.
            Ok(None) => return,
            Err(_) => Err("the upstream's body stalled".into()),
        };
        let last = frame.is_err();
        match tokio::time::timeout(send_timeout, tx.send(frame)).await {
            Ok(Ok(())) if !last => {}
            // An error handed over, or the client gone.
            Ok(_) => return,
            // A client that took nothing for `send_timeout`: its stream ends in an error
            // when (if) it is polled again.
            Err(_) => {
                cut.store(true, std::sync::atomic::Ordering::Release);
                return;
            }
        }
    }
}

impl hyper::body::Body for UpstreamBody {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let Some(frames) = self.frames.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        match frames.poll_recv(cx) {
            std::task::Poll::Ready(None) => {
                if self.cut.load(std::sync::atomic::Ordering::Acquire) {
                    return std::task::Poll::Ready(Some(Err(
                        "the client took nothing for send_timeout".into(),
                    )));
                }
                self.frames = None;
                std::task::Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_none()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.size_hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_that_would_refuse_everything_are_refused() {
        use super::super::server::ServerLimits;
        let limits = ServerLimits::default();
        let ok = UpstreamSettings::default();
        assert!(ok.build(&limits).is_ok());
        let none_in_flight = UpstreamSettings {
            max_in_flight: 0,
            ..ok.clone()
        };
        assert!(matches!(
            none_in_flight.build(&limits),
            Err(UpstreamError::InFlightOutOfRange)
        ));
        for bad in [
            ServerLimits {
                send_timeout: Duration::ZERO,
                ..limits
            },
            ServerLimits {
                body_read_timeout: Duration::ZERO,
                ..limits
            },
            ServerLimits {
                header_read_timeout: Duration::ZERO,
                ..limits
            },
            ServerLimits {
                max_connections: 0,
                ..limits
            },
            ServerLimits {
                max_connections: Semaphore::MAX_PERMITS + 1,
                ..limits
            },
            ServerLimits {
                h2_max_concurrent_streams: 0,
                ..limits
            },
            ServerLimits {
                max_header_bytes: 4 * 1024,
                ..limits
            },
            ServerLimits {
                max_header_bytes: 1 << 32,
                ..limits
            },
        ] {
            assert!(
                matches!(ok.build(&bad), Err(UpstreamError::Server(_))),
                "{bad:?}"
            );
        }
        for bad in [
            UpstreamSettings {
                timeout_ms: 0,
                ..ok.clone()
            },
            UpstreamSettings {
                connect_timeout_ms: 0,
                ..ok.clone()
            },
        ] {
            assert!(matches!(bad.build(&limits), Err(UpstreamError::NoTimeout)));
        }
    }
}
