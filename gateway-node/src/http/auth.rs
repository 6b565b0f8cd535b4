//! Authentication before the limiter (D1) and the hashed key id (D2): the raw key is read
//! from the request, hashed, and dropped. Nothing past this module sees it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use bus_schemas::KeyId;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use sha2::Sha256;

/// Raw keys longer than this are malformed: no issuer hands out 4 KiB keys, and bounding
/// it bounds the HMAC work an unauthenticated request can buy.
pub const RAW_KEY_MAX_BYTES: usize = 256;
/// Shorter than this cannot be a real key (and would be guessable).
pub const RAW_KEY_MIN_BYTES: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no API key")]
    Missing,
    #[error("malformed API key")]
    Malformed,
    #[error("unknown API key")]
    Unknown,
}

impl AuthError {
    /// The metric label and the body's `error` detail.
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing_key",
            Self::Malformed => "malformed_key",
            Self::Unknown => "unknown_key",
        }
    }
}

/// The key from `Authorization: Bearer KEY` or, failing that header, `X-Api-Key: KEY`.
/// Two different keys in one request are malformed rather than a choice the gateway makes.
pub fn extract_key(headers: &HeaderMap) -> Result<&[u8], AuthError> {
    let bearer = match headers.get(http::header::AUTHORIZATION) {
        Some(v) => Some(bearer_token(v.as_bytes()).ok_or(AuthError::Malformed)?),
        None => None,
    };
    let header = headers.get("x-api-key").map(|v| trim(v.as_bytes()));
    let key = match (bearer, header) {
        (Some(a), Some(b)) if a != b => return Err(AuthError::Malformed),
        (Some(k), _) | (None, Some(k)) => k,
        (None, None) => return Err(AuthError::Missing),
    };
    if headers.get_all("x-api-key").iter().count() > 1
        || headers.get_all(http::header::AUTHORIZATION).iter().count() > 1
    {
        return Err(AuthError::Malformed);
    }
    well_formed_key(key).ok_or(AuthError::Malformed)
}

/// The trimmed token of an `Authorization: Bearer` value (the scheme in any case).
fn bearer_token(v: &[u8]) -> Option<&[u8]> {
    let scheme = b"bearer ";
    (v.len() >= scheme.len() && v[..scheme.len()].eq_ignore_ascii_case(scheme))
        .then(|| trim(&v[scheme.len()..]))
}

/// A raw key as the gateway takes it: trimmed of ASCII whitespace, then 8 to 256 printable
/// ASCII bytes; `None` for anything the gateway would refuse as malformed.
pub fn well_formed_key(raw: &[u8]) -> Option<&[u8]> {
    let key = trim(raw);
    ((RAW_KEY_MIN_BYTES..=RAW_KEY_MAX_BYTES).contains(&key.len())
        && key.iter().all(|b| b.is_ascii_graphic()))
    .then_some(key)
}

fn trim(v: &[u8]) -> &[u8] {
    v.trim_ascii()
}

/// HMAC-SHA256 of the raw key under a versioned secret; the first 128 bits are the id
/// (D2, ADR-7: the version travels with the id, so a rotated secret adds a version).
#[derive(Clone)]
pub struct KeyHasher {
    version: u8,
    mac: Hmac<Sha256>,
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret.
        f.debug_struct("KeyHasher")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HashKeyError {
    #[error("the hash key version must be 1-255 (0 means none on the wire)")]
    Version,
    #[error("the hash key must be at least 32 bytes (64 hex digits), got {0}")]
    TooShort(usize),
    #[error("the hash key is not hex")]
    NotHex,
}

impl KeyHasher {
    pub fn new(version: u8, secret: &[u8]) -> Result<Self, HashKeyError> {
        if version == 0 {
            return Err(HashKeyError::Version);
        }
        if secret.len() < 32 {
            return Err(HashKeyError::TooShort(secret.len()));
        }
        let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
            .expect("HMAC takes a key of any length");
        Ok(Self { version, mac })
    }

    /// From the secret written as hex (a secret file or an environment variable).
    pub fn from_hex(version: u8, hex: &str) -> Result<Self, HashKeyError> {
        Self::new(
            version,
            &decode_hex(hex.trim()).ok_or(HashKeyError::NotHex)?,
        )
    }

    pub fn key_id(&self, raw: &[u8]) -> KeyId {
        let mut mac = self.mac.clone();
        mac.update(raw);
        let out = mac.finalize().into_bytes();
        let mut digest = [0u8; 16];
        digest.copy_from_slice(&out[..16]);
        KeyId {
            version: self.version,
            digest: u128::from_be_bytes(digest),
        }
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// How a hashed key id is written in logs, policy files and bodies: `v1:` and 32 hex.
pub struct KeyIdText(pub KeyId);

impl fmt::Display for KeyIdText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.text())
    }
}

pub fn parse_key_id(text: &str) -> Option<KeyId> {
    KeyId::from_text(text)
}

/// Correlation ids: a valid incoming `X-Request-Id` is kept, otherwise the gateway makes
/// one from a per-process random seed and a counter (unique without coordination).
pub struct CorrelationIds {
    seed: u64,
    next: AtomicU64,
}

/// An incoming id is kept only if it is short and plain, so it is safe to log and echo.
pub const CORRELATION_ID_MAX_BYTES: usize = 64;

impl Default for CorrelationIds {
    fn default() -> Self {
        Self {
            seed: random_u64(),
            next: AtomicU64::new(0),
        }
    }
}

impl CorrelationIds {
    pub fn for_request(&self, headers: &HeaderMap) -> String {
        if let Some(v) = headers.get("x-request-id") {
            let b = v.as_bytes();
            let valid = !b.is_empty()
                && b.len() <= CORRELATION_ID_MAX_BYTES
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
            if valid && !holds_credential(b, headers) {
                // Checked ASCII above.
                return String::from_utf8_lossy(b).into_owned();
            }
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{:016x}", self.seed, splitmix(self.seed ^ n))
    }
}

/// Whether `id` holds a credential this request carries, or 8 bytes or more of one: kept,
/// a client that sent its key as its request id had it logged, echoed in every answer and
/// archived with its limit events.
fn holds_credential(id: &[u8], headers: &HeaderMap) -> bool {
    let contains = |hay: &[u8], needle: &[u8]| {
        needle.len() >= RAW_KEY_MIN_BYTES && hay.windows(needle.len()).any(|w| w == needle)
    };
    let bearer = headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .map(|v| bearer_token(v.as_bytes()).unwrap_or_else(|| trim(v.as_bytes())));
    let header = headers
        .get_all("x-api-key")
        .iter()
        .map(|v| trim(v.as_bytes()));
    bearer
        .chain(header)
        .any(|cred| contains(cred, id) || contains(id, cred))
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 random bits from the standard library's per-process random hash keys: enough for
/// correlation ids; secrets come from files, not from here.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn keys_come_from_bearer_or_x_api_key() {
        let k = "fgk_0123456789abcdef";
        assert_eq!(
            extract_key(&headers(&[("authorization", &format!("Bearer {k}"))])),
            Ok(k.as_bytes())
        );
        assert_eq!(
            extract_key(&headers(&[("authorization", &format!("bearer  {k} "))])),
            Ok(k.as_bytes())
        );
        assert_eq!(extract_key(&headers(&[("x-api-key", k)])), Ok(k.as_bytes()));
        assert_eq!(extract_key(&headers(&[])), Err(AuthError::Missing));
        for bad in [
            vec![("authorization", "Basic abcdefghijk")],
            vec![("x-api-key", "short")],
            vec![("x-api-key", &"k".repeat(RAW_KEY_MAX_BYTES + 1))],
            vec![("x-api-key", "has space inside")],
            vec![("x-api-key", "fgk_aaaaaaaa"), ("x-api-key", "fgk_bbbbbbbb")],
            vec![
                ("authorization", "Bearer fgk_aaaaaaaa"),
                ("x-api-key", "fgk_bbbbbbbb"),
            ],
        ] {
            assert_eq!(
                extract_key(&headers(&bad)),
                Err(AuthError::Malformed),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn key_ids_are_keyed_versioned_and_printable() {
        let a = KeyHasher::new(1, &[7u8; 32]).unwrap();
        let b = KeyHasher::new(2, &[8u8; 32]).unwrap();
        let id = a.key_id(b"fgk_secret_key_1");
        assert_eq!(id, a.key_id(b"fgk_secret_key_1"));
        assert_ne!(id.digest, b.key_id(b"fgk_secret_key_1").digest);
        assert_eq!(b.key_id(b"x").version, 2);
        let text = KeyIdText(id).to_string();
        assert!(text.starts_with("v1:") && text.len() == 35, "{text}");
        assert!(!text.contains("secret"));
        assert_eq!(parse_key_id(&text), Some(id));
        assert_eq!(parse_key_id("v0:00000000000000000000000000000001"), None);
        assert_eq!(parse_key_id("v1:xyz"), None);
        assert_eq!(
            KeyHasher::new(1, &[0; 8]).unwrap_err(),
            HashKeyError::TooShort(8)
        );
        assert_eq!(
            KeyHasher::from_hex(1, "zz").unwrap_err(),
            HashKeyError::NotHex
        );
        assert!(KeyHasher::from_hex(1, &"ab".repeat(32)).is_ok());
        assert!(!format!("{a:?}").contains("07"));
    }

    #[test]
    fn correlation_ids_are_kept_when_plain_else_generated() {
        let ids = CorrelationIds::default();
        assert_eq!(
            ids.for_request(&headers(&[("x-request-id", "abc-123_x.y")])),
            "abc-123_x.y"
        );
        let made = ids.for_request(&headers(&[("x-request-id", "bad id with spaces")]));
        assert_eq!(made.len(), 32);
        assert_ne!(made, ids.for_request(&headers(&[])));
        let long = "a".repeat(CORRELATION_ID_MAX_BYTES + 1);
        assert_ne!(ids.for_request(&headers(&[("x-request-id", &long)])), long);
    }

    /// A client that sends its key (or a piece of it) as its request id does not get it
    /// logged and echoed: the id is replaced.
    #[test]
    fn a_request_id_holding_the_key_is_replaced() {
        let ids = CorrelationIds::default();
        let key = "fgk_live_0123456789abcdef";
        for (name, value) in [
            ("authorization", format!("Bearer {key}")),
            ("x-api-key", key.to_string()),
        ] {
            for id in [key, &key[..12], &format!("req-{key}")] {
                let got =
                    ids.for_request(&headers(&[(name, value.as_str()), ("x-request-id", id)]));
                assert_ne!(got, id, "{name}");
                assert!(!got.contains(&key[..8]), "{got}");
            }
        }
        let own = ids.for_request(&headers(&[
            ("authorization", &format!("Bearer {key}")),
            ("x-request-id", "trace-42"),
        ]));
        assert_eq!(own, "trace-42", "an id of the client's own is kept");
    }
}
