//! The 429 timing contract (D6, ADR-6, A42).

/// What a 429 tells the client about when to come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryAfter {
    /// The `Retry-After` header in whole seconds: 0 under a second, else rounded up, >= 1.
    pub header_s: u64,
    /// `X-RateLimit-Reset-Ms`, present only when the wait is under a second.
    pub reset_ms: Option<u64>,
}

impl RetryAfter {
    /// Integer seconds cannot express a sub-second wait, so it goes in the millisecond
    /// header and `Retry-After` says 0; longer waits round up so the client never comes
    /// back before the boundary it was told about.
    pub fn from_wait_ms(wait_ms: u64) -> Self {
        if wait_ms < 1_000 {
            Self {
                header_s: 0,
                reset_ms: Some(wait_ms),
            }
        } else {
            Self {
                header_s: wait_ms.div_ceil(1_000).max(1),
                reset_ms: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_table() {
        let table: &[(u64, u64, Option<u64>)] = &[
            (0, 0, Some(0)),
            (1, 0, Some(1)),
            (25, 0, Some(25)),
            (999, 0, Some(999)),
            (1_000, 1, None),
            (1_001, 2, None),
            (1_999, 2, None),
            (2_000, 2, None),
            (59_001, 60, None),
            (60_000, 60, None),
        ];
        for &(wait_ms, header_s, reset_ms) in table {
            assert_eq!(
                RetryAfter::from_wait_ms(wait_ms),
                RetryAfter { header_s, reset_ms },
                "wait {wait_ms} ms"
            );
        }
    }
}
