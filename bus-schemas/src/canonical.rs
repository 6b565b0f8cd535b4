//! The per-round envelopes (report and grant batches) without prost's intermediate
//! messages: every round each node sends one report batch per shard and gets one grant
//! batch back, and building a `wire::*` value per entry (a `Vec` for every key id, nested
//! lengths computed again at each level) cost about a quarter of the simulator's time.
//!
//! Encoding writes the bytes prost writes for the same message: fields in number order,
//! proto3 defaults left out, every embedded message length-prefixed (the `*_matches_prost`
//! tests check it). Decoding reads only that canonical form, borrowing key ids from the
//! input; anything else (unknown fields, a field twice, fields out of order, other wire
//! types) returns `None` and the caller decodes with prost. Whatever this reader accepts,
//! prost reads as the same field values, so both paths feed the same validation and give
//! the same result, errors included.

use crate::codec::{RawKeyWindow, RawReportEntry};
use crate::domain::{GrantEntry, KeyWindow, ReportEntry};

const VARINT: u64 = 0;
const LEN: u64 = 2;

#[inline]
fn varint_len(v: u64) -> usize {
    // 7 payload bits per byte; 0 still takes one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
fn put_key(out: &mut Vec<u8>, field: u64, wire_type: u64) {
    put_varint(out, (field << 3) | wire_type);
}

/// A proto3 scalar: left out when it is the default.
#[inline]
fn put_u64(out: &mut Vec<u8>, field: u64, v: u64) {
    if v != 0 {
        put_key(out, field, VARINT);
        put_varint(out, v);
    }
}

#[inline]
fn u64_len(field: u64, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        varint_len(field << 3) + varint_len(v)
    }
}

#[inline]
fn message_len(field: u64, body_len: usize) -> usize {
    varint_len(field << 3) + varint_len(body_len as u64) + body_len
}

fn window_body_len(kw: &KeyWindow) -> usize {
    u64_len(1, u64::from(kw.window.length_ms)) + u64_len(2, kw.window.number)
}

fn key_window_body_len(kw: &KeyWindow) -> usize {
    // key_id is always 17 bytes, so never left out; the window is always present.
    message_len(1, crate::KeyId::WIRE_BYTES) + message_len(2, window_body_len(kw))
}

fn put_key_window(out: &mut Vec<u8>, field: u64, kw: &KeyWindow) {
    put_key(out, field, LEN);
    put_varint(out, key_window_body_len(kw) as u64);
    put_key(out, 1, LEN);
    put_varint(out, crate::KeyId::WIRE_BYTES as u64);
    out.extend_from_slice(&kw.key.to_bytes());
    put_key(out, 2, LEN);
    put_varint(out, window_body_len(kw) as u64);
    put_u64(out, 1, u64::from(kw.window.length_ms));
    put_u64(out, 2, kw.window.number);
}

fn report_entry_body_len(e: &ReportEntry) -> usize {
    message_len(1, key_window_body_len(&e.key_window))
        + u64_len(2, e.allowance)
        + u64_len(3, e.cumulative_spend)
        + u64_len(4, e.demand)
        + u64_len(5, e.held_credit)
        + u64_len(6, e.applied_grant)
        + u64_len(7, e.returned)
        + u64_len(8, e.self_granted)
        + u64_len(9, u64::from(e.standing_option))
}

/// `entry` as field `field` of its parent.
pub(crate) fn report_entry_len(field: u64, e: &ReportEntry) -> usize {
    message_len(field, report_entry_body_len(e))
}

pub(crate) fn put_report_entry(out: &mut Vec<u8>, field: u64, e: &ReportEntry) {
    put_key(out, field, LEN);
    put_varint(out, report_entry_body_len(e) as u64);
    put_key_window(out, 1, &e.key_window);
    put_u64(out, 2, e.allowance);
    put_u64(out, 3, e.cumulative_spend);
    put_u64(out, 4, e.demand);
    put_u64(out, 5, e.held_credit);
    put_u64(out, 6, e.applied_grant);
    put_u64(out, 7, e.returned);
    put_u64(out, 8, e.self_granted);
    put_u64(out, 9, u64::from(e.standing_option));
}

fn grant_entry_body_len(e: &GrantEntry) -> usize {
    message_len(1, key_window_body_len(&e.key_window))
        + u64_len(2, e.node_epoch.0)
        + u64_len(3, e.grant_seq)
        + u64_len(4, e.credit_total)
        + u64_len(5, u64::from(e.exhausted))
}

pub(crate) fn grant_entry_len(field: u64, e: &GrantEntry) -> usize {
    message_len(field, grant_entry_body_len(e))
}

pub(crate) fn put_grant_entry(out: &mut Vec<u8>, field: u64, e: &GrantEntry) {
    put_key(out, field, LEN);
    put_varint(out, grant_entry_body_len(e) as u64);
    put_key_window(out, 1, &e.key_window);
    put_u64(out, 2, e.node_epoch.0);
    put_u64(out, 3, e.grant_seq);
    put_u64(out, 4, e.credit_total);
    put_u64(out, 5, u64::from(e.exhausted));
}

/// Scalar header fields of a batch, in field order, then its repeated entries.
pub(crate) fn header_len(fields: &[(u64, u64)]) -> usize {
    fields.iter().map(|&(f, v)| u64_len(f, v)).sum()
}

pub(crate) fn put_header(out: &mut Vec<u8>, fields: &[(u64, u64)]) {
    for &(f, v) in fields {
        put_u64(out, f, v);
    }
}

/// A reader of the canonical form only: every method returns `None` where prost might
/// read something other than the obvious value.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    #[inline]
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first()?;
            self.buf = rest;
            if i == 9 && b > 1 {
                // Past 64 bits: prost rejects it.
                return None;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    /// The next field's number and wire type; `None` at the end of the buffer too.
    #[inline]
    fn key(&mut self) -> Option<(u64, u64)> {
        if self.buf.is_empty() {
            return None;
        }
        let k = self.varint()?;
        let field = k >> 3;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return None;
        }
        Some((field, k & 7))
    }

    #[inline]
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        if len > self.buf.len() {
            return None;
        }
        let (b, rest) = self.buf.split_at(len);
        self.buf = rest;
        Some(b)
    }
}

/// Every top-level `schema_version` (field 1) varint of an envelope as sent, in any field
/// order: prost reads the field as `uint32` and keeps the low 32 bits of a larger value,
/// so a version of 2^32 + 1 would read as 1. `None` where prost would fail anyway (a
/// truncated field, a wire type it cannot skip), the value otherwise the largest seen.
pub(crate) fn raw_schema_version_max(buf: &[u8]) -> Option<u64> {
    const I64: u64 = 1;
    const I32: u64 = 5;
    let mut r = Reader { buf };
    let mut max = 0;
    while let Some((field, wt)) = r.key() {
        match wt {
            VARINT => {
                let v = r.varint()?;
                if field == 1 {
                    max = max.max(v);
                }
            }
            LEN => {
                r.bytes()?;
            }
            I64 | I32 => {
                let n = if wt == I64 { 8 } else { 4 };
                r.buf = r.buf.get(n..)?;
            }
            _ => return None,
        }
    }
    r.buf.is_empty().then_some(max)
}

/// Reads a message's fields in strictly increasing number order (`repeated` may recur
/// back to back); `field` handles one and returns `None` to give up on the whole input.
fn fields<'a>(
    buf: &'a [u8],
    repeated: u64,
    mut field: impl FnMut(u64, u64, &mut Reader<'a>) -> Option<()>,
) -> Option<()> {
    let mut r = Reader { buf };
    let mut last = 0;
    while !r.buf.is_empty() {
        let (f, wt) = r.key()?;
        if f < last || (f == last && f != repeated) {
            return None;
        }
        last = f;
        field(f, wt, &mut r)?;
    }
    Some(())
}

fn scalar(wt: u64, r: &mut Reader<'_>) -> Option<u64> {
    (wt == VARINT).then_some(())?;
    r.varint()
}

fn scalar_u32(wt: u64, r: &mut Reader<'_>) -> Option<u32> {
    u32::try_from(scalar(wt, r)?).ok()
}

fn embedded<'a>(wt: u64, r: &mut Reader<'a>) -> Option<&'a [u8]> {
    (wt == LEN).then_some(())?;
    r.bytes()
}

fn window(buf: &[u8]) -> Option<(u32, u64)> {
    let mut w = (0u32, 0u64);
    fields(buf, 0, |f, wt, r| {
        match f {
            1 => w.0 = scalar_u32(wt, r)?,
            2 => w.1 = scalar(wt, r)?,
            _ => return None,
        }
        Some(())
    })?;
    Some(w)
}

fn key_window(buf: &[u8]) -> Option<RawKeyWindow<'_>> {
    let mut kw = RawKeyWindow {
        key_id: &[],
        window: None,
    };
    fields(buf, 0, |f, wt, r| {
        match f {
            1 => kw.key_id = embedded(wt, r)?,
            2 => kw.window = Some(window(embedded(wt, r)?)?),
            _ => return None,
        }
        Some(())
    })?;
    Some(kw)
}

fn report_entry(buf: &[u8]) -> Option<RawReportEntry<'_>> {
    let mut e = RawReportEntry::default();
    fields(buf, 0, |f, wt, r| {
        match f {
            1 => e.key_window = Some(key_window(embedded(wt, r)?)?),
            2 => e.allowance = scalar(wt, r)?,
            3 => e.cumulative_spend = scalar(wt, r)?,
            4 => e.demand = scalar(wt, r)?,
            5 => e.held_credit = scalar(wt, r)?,
            6 => e.applied_grant = scalar(wt, r)?,
            7 => e.returned = scalar(wt, r)?,
            8 => e.self_granted = scalar(wt, r)?,
            9 => e.standing_option = scalar(wt, r)? != 0,
            _ => return None,
        }
        Some(())
    })?;
    Some(e)
}

/// A report batch's fields as prost would read them: the scalars by field number (1-7,
/// 9-10; slot 8 unused) and the entries (field 8).
pub(crate) struct RawReportBatch<'a> {
    pub scalars: [u64; 11],
    pub entries: Vec<RawReportEntry<'a>>,
}

pub(crate) fn report_batch(buf: &[u8]) -> Option<RawReportBatch<'_>> {
    let mut b = RawReportBatch {
        scalars: [0; 11],
        entries: Vec::new(),
    };
    fields(buf, 8, |f, wt, r| {
        match f {
            // schema_version, node, shard and the full-report pair are uint32.
            1 | 2 | 5 | 9 | 10 => b.scalars[f as usize] = u64::from(scalar_u32(wt, r)?),
            3 | 4 | 6 | 7 => b.scalars[f as usize] = scalar(wt, r)?,
            8 => b.entries.push(report_entry(embedded(wt, r)?)?),
            _ => return None,
        }
        Some(())
    })?;
    Some(b)
}

#[derive(Default)]
pub(crate) struct RawGrantEntry<'a> {
    pub key_window: Option<RawKeyWindow<'a>>,
    pub node_epoch: u64,
    pub grant_seq: u64,
    pub credit_total: u64,
    pub exhausted: bool,
}

fn grant_entry(buf: &[u8]) -> Option<RawGrantEntry<'_>> {
    let mut e = RawGrantEntry::default();
    fields(buf, 0, |f, wt, r| {
        match f {
            1 => e.key_window = Some(key_window(embedded(wt, r)?)?),
            2 => e.node_epoch = scalar(wt, r)?,
            3 => e.grant_seq = scalar(wt, r)?,
            4 => e.credit_total = scalar(wt, r)?,
            // prost reads any non-zero varint as true.
            5 => e.exhausted = scalar(wt, r)? != 0,
            _ => return None,
        }
        Some(())
    })?;
    Some(e)
}

/// A grant batch's scalars by field number (1-4, 6; slot 5 unused) and its entries
/// (field 5).
pub(crate) struct RawGrantBatch<'a> {
    pub scalars: [u64; 7],
    pub entries: Vec<RawGrantEntry<'a>>,
}

pub(crate) fn grant_batch(buf: &[u8]) -> Option<RawGrantBatch<'_>> {
    let mut b = RawGrantBatch {
        scalars: [0; 7],
        entries: Vec::new(),
    };
    fields(buf, 5, |f, wt, r| {
        match f {
            // schema_version, shard and node are uint32.
            1 | 3 | 4 => b.scalars[f as usize] = u64::from(scalar_u32(wt, r)?),
            2 => b.scalars[f as usize] = scalar(wt, r)?,
            5 => b.entries.push(grant_entry(embedded(wt, r)?)?),
            6 => b.scalars[f as usize] = scalar(wt, r)?,
            _ => return None,
        }
        Some(())
    })?;
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths() {
        for (v, n) in [
            (0u64, 1usize),
            (1, 1),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (u64::MAX, 10),
        ] {
            assert_eq!(varint_len(v), n, "{v}");
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), n);
            assert_eq!(Reader { buf: &out }.varint(), Some(v));
        }
    }
}
