//! B2 / A56 on a real nats-server: mutual TLS on every connection and authorization per
//! role. A gateway certificate may publish reports and fast-path requests but never a
//! grant; a client without a certificate cannot connect at all.

use std::time::Duration;

use bus_schemas::{Envelope, GrantBatch, NodeId, OwnerEpoch, ShardId, subjects};
use foldgate_tests::tls::{connect_as, start_role_server};
use futures::StreamExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_cannot_forge_grants_and_strangers_cannot_connect() {
    let (_server, pki, url) = start_role_server();

    let stranger = tokio::time::timeout(Duration::from_secs(5), connect_as(&url, &pki, None)).await;
    assert!(
        !matches!(stranger, Ok(Ok(_))),
        "a client without a certificate connected"
    );

    let gateway = connect_as(&url, &pki, Some("gateway"))
        .await
        .expect("gateway connects");
    let fold = connect_as(&url, &pki, Some("fold"))
        .await
        .expect("fold worker connects");
    let mut grants = fold.subscribe(subjects::grant_inbox(0)).await.unwrap();
    let mut reports = fold.subscribe(subjects::report(0)).await.unwrap();
    // Barrier: once the fold worker hears its own message, the server has both of its
    // subscriptions (a flush only means the bytes left; stack-facts pitfall 5).
    fold.publish(subjects::grant_inbox(0), b"barrier".to_vec().into())
        .await
        .unwrap();
    let barrier = tokio::time::timeout(Duration::from_secs(5), grants.next())
        .await
        .expect("the barrier arrives")
        .unwrap();
    assert_eq!(&barrier.payload[..], b"barrier");

    let forged = GrantBatch {
        full_report_taken: None,
        owner_epoch: OwnerEpoch(u64::MAX),
        shard: ShardId(0),
        node: NodeId(0),
        entries: Vec::new(),
    };
    // The server refuses the publish (a permissions violation); nothing reaches the inbox.
    let _ = gateway
        .publish(subjects::grant_inbox(0), forged.encode().into())
        .await;
    gateway
        .publish(subjects::report(0), b"a report".to_vec().into())
        .await
        .unwrap();
    gateway.flush().await.unwrap();
    let report = tokio::time::timeout(Duration::from_secs(2), reports.next())
        .await
        .expect("the gateway's report arrives")
        .unwrap();
    assert_eq!(&report.payload[..], b"a report");

    // A control grant from the fold role does arrive: the only grant seen must be it.
    fold.publish(subjects::grant_inbox(0), b"control".to_vec().into())
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(2), grants.next())
        .await
        .expect("the fold worker's grant arrives")
        .unwrap();
    assert_eq!(
        &first.payload[..],
        b"control",
        "the forged grant got through"
    );
    let more = tokio::time::timeout(Duration::from_millis(300), grants.next()).await;
    assert!(more.is_err(), "nothing else arrived on the grant inbox");
}
