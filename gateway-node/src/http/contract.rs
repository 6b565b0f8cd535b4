//! The responses the gateway makes itself: the 429 contract (D6, ADR-6), 401 (D1) and the
//! proxy's 502/504. Every one carries the correlation id; none carries a limit.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{Either, Full};

use crate::retry::RetryAfter;
use crate::surface::Denial;
use bus_schemas::LimitReason;

/// What the gateway answers with: an upstream's streamed body, or one it made.
pub type Body = Either<super::proxy::UpstreamBody, Full<Bytes>>;

pub const REQUEST_ID: &str = "x-request-id";
pub const DEGRADED: &str = "x-ratelimit-degraded";
pub const RESET_MS: &str = "x-ratelimit-reset-ms";

/// A window by its length as people write it: `1s`, `60s`, `1500ms`.
pub fn window_name(length_ms: u32) -> String {
    if length_ms.is_multiple_of(1_000) {
        format!("{}s", length_ms / 1_000)
    } else {
        format!("{length_ms}ms")
    }
}

pub fn reason_label(r: LimitReason) -> &'static str {
    match r {
        LimitReason::Exhausted => "exhausted",
        LimitReason::FastPathDeadline => "fast_path_deadline",
        LimitReason::Backstop => "backstop",
    }
}

fn json_response(
    status: StatusCode,
    body: serde_json::Value,
    correlation_id: &str,
) -> Response<Body> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(body.to_string()))));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    set_correlation(h, correlation_id);
    r
}

pub fn set_correlation(h: &mut http::HeaderMap, correlation_id: &str) {
    // Ids are checked plain ASCII or made here (auth::CorrelationIds).
    if let Ok(v) = HeaderValue::from_str(correlation_id) {
        h.insert(REQUEST_ID, v);
    }
}

/// D6: `Retry-After` to the latest boundary of every window that could deny (the surface
/// computed `wait_ms` that way), `Retry-After: 0` plus `X-RateLimit-Reset-Ms` under a
/// second, whole seconds (at least 1) otherwise; the body names the denying window (the
/// one whose boundary the wait is for) and the correlation id, and never the limit.
pub fn too_many_requests(denial: &Denial, correlation_id: &str, degraded: bool) -> Response<Body> {
    too_many(
        &window_name(denial.window.length_ms),
        denial.window.number,
        reason_label(denial.reason),
        denial.wait_ms,
        correlation_id,
        degraded || denial.degraded,
    )
}

/// The 429 shape, shared with the edge guard (whose "window" is its one-second cap).
pub fn too_many(
    window: &str,
    window_number: u64,
    reason: &str,
    wait_ms: u64,
    correlation_id: &str,
    degraded: bool,
) -> Response<Body> {
    let retry = RetryAfter::from_wait_ms(wait_ms);
    let mut r = json_response(
        StatusCode::TOO_MANY_REQUESTS,
        serde_json::json!({
            "error": "rate_limited",
            "window": window,
            "window_id": window_number,
            "reason": reason,
            "correlation_id": correlation_id,
        }),
        correlation_id,
    );
    let h = r.headers_mut();
    h.insert(header::RETRY_AFTER, HeaderValue::from(retry.header_s));
    if let Some(ms) = retry.reset_ms {
        h.insert(RESET_MS, HeaderValue::from(ms));
    }
    if degraded {
        h.insert(DEGRADED, HeaderValue::from_static("true"));
    }
    r
}

pub fn unauthorized(detail: &str, correlation_id: &str) -> Response<Body> {
    let mut r = json_response(
        StatusCode::UNAUTHORIZED,
        serde_json::json!({
            "error": "unauthorized",
            "detail": detail,
            "correlation_id": correlation_id,
        }),
        correlation_id,
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

pub fn gateway_error(status: StatusCode, detail: &str, correlation_id: &str) -> Response<Body> {
    json_response(
        status,
        serde_json::json!({
            "error": status.canonical_reason().unwrap_or("error").to_ascii_lowercase(),
            "detail": detail,
            "correlation_id": correlation_id,
        }),
        correlation_id,
    )
}

pub fn plain(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut r = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schemas::WindowId;

    fn denial(wait_ms: u64, degraded: bool) -> Denial {
        Denial {
            window: WindowId {
                length_ms: 60_000,
                number: 42,
            },
            wait_ms,
            reason: LimitReason::Exhausted,
            degraded,
        }
    }

    #[test]
    fn sub_second_and_multi_second_waits() {
        let r = too_many_requests(&denial(250, false), "cid-1", false);
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "0");
        assert_eq!(r.headers()[RESET_MS], "250");
        assert_eq!(r.headers()[REQUEST_ID], "cid-1");
        assert!(r.headers().get(DEGRADED).is_none());

        let r = too_many_requests(&denial(1_001, true), "cid-2", false);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert!(r.headers().get(RESET_MS).is_none());
        assert_eq!(r.headers()[DEGRADED], "true");
    }

    #[test]
    fn window_names() {
        assert_eq!(window_name(1_000), "1s");
        assert_eq!(window_name(60_000), "60s");
        assert_eq!(window_name(1_500), "1500ms");
    }
}
