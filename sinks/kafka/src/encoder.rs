//! A limit event as a Kafka message. The bytes come from `bus-schemas` alone (B2), so the
//! archiver decodes them with the same validation as the bus. The message key is the
//! hashed key id (its version byte and digest, never the raw key): librdkafka's default
//! partitioner hashes the key, so one key's events stay in order in one partition.

use bus_schemas::{Envelope, KeyId, LimitEvent};

/// One event ready for the producer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub key: [u8; KeyId::WIRE_BYTES],
    pub payload: Vec<u8>,
}

pub fn encode(event: &LimitEvent) -> Encoded {
    Encoded {
        key: event.key.to_bytes(),
        payload: event.encode(),
    }
}

/// The hashed key id a message was keyed by, if its key is one.
pub fn message_key(key: &[u8]) -> Option<KeyId> {
    KeyId::from_bytes(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bus_schemas::{EventId, LimitReason, NodeEpoch, NodeId, WindowId};

    #[test]
    fn an_event_round_trips_and_is_keyed_by_its_hashed_key_id() {
        let key = KeyId {
            version: 2,
            digest: 0xfeed_beef,
        };
        let e = LimitEvent {
            id: EventId {
                node: NodeId(3),
                node_epoch: NodeEpoch(9),
                seq: 1,
            },
            key,
            plan_id: 1,
            window: WindowId {
                length_ms: 1_000,
                number: 5,
            },
            at_ms: 5_000,
            correlation_id: "c".into(),
            reason: LimitReason::Exhausted,
            degraded: false,
            retry_after_ms: 10,
        };
        let m = encode(&e);
        assert_eq!(message_key(&m.key), Some(key));
        assert_eq!(LimitEvent::decode(&m.payload).unwrap(), e);
    }
}
