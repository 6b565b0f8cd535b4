//! The README's main job (`foldgate demo`): a gateway node on its embedded defaults, one
//! key, and requests until a 429 is earned, then one more after the wait it named.

use std::sync::Arc;
use std::time::Duration;

use foldgate_harness::http_tools::{
    bench_key, bench_policy_toml, get_once, loopback, plain_client, run_upstream, serve_on_loopback,
};
use gateway_node::http::auth::KeyHasher;
use gateway_node::http::contract;
use http::StatusCode;
use serde::Serialize;
use tokio::sync::watch;

/// What the demo saw: each request's status and the 429's headers and body.
#[derive(Debug, Serialize)]
pub struct DemoStep {
    pub request: u32,
    pub status: u16,
    pub retry_after: Option<String>,
    pub reset_ms: Option<String>,
    pub correlation_id: Option<String>,
    pub body: Option<String>,
}

/// The README's main job: an upstream and a gateway node with its embedded defaults (no
/// NATS: the in-process bus and fold owner), one key on a plan of `limit_1s` per second and
/// `limit_60s` per minute, and requests until a 429 is earned, then one more after the
/// wait the 429 named. Returns the steps; an error if no 429 was earned or the wait lied.
pub async fn run_demo(
    limit_1s: u64,
    limit_60s: u64,
    mut on_step: impl FnMut(&DemoStep),
) -> anyhow::Result<Vec<DemoStep>> {
    use gateway_node::http::node::{NodeGateway, NodeSettings, start_runtime, system_clock};

    let (stop_tx, stop) = watch::channel(false);
    let (up_listener, up_addr) = loopback().await?;
    tokio::spawn(run_upstream(up_listener, 0, stop.clone()));

    // A demo secret made here and dropped at exit; a deployment reads `hash_key_file`.
    let secret: String = (0..4)
        .map(|_| format!("{:016x}", gateway_node::http::auth::random_u64()))
        .collect();
    let hasher = KeyHasher::from_hex(1, &secret)?;
    let seed = gateway_node::http::auth::random_u64();
    let policy = bench_policy_toml(&hasher, seed, 1, &[(1_000, limit_1s), (60_000, limit_60s)]);
    let settings: NodeSettings = toml::from_str(&format!(
        "upstream.urls = [\"http://{up_addr}\"]\nhash_key_hex = \"{secret}\"\nlog_level = \"warn\"\n{policy}"
    ))?;
    let clock = system_clock();
    let runtime = start_runtime(&settings, Arc::clone(&clock), stop.clone()).await?;
    let gateway = Arc::new(NodeGateway::new(&settings, runtime, clock)?);
    let (addr, _) = serve_on_loopback(gateway, settings.server.limits(), stop).await?;

    let client = plain_client();
    let url = format!("http://{addr}/hello");
    let key = bench_key(seed, 0);
    let mut steps = Vec::new();
    let mut waited = false;
    for n in 1..=(limit_1s as u32 + 10) {
        let (status, headers, body) = get_once(&client, &url, Some(&key)).await?;
        let h = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        let step = DemoStep {
            request: n,
            status: status.as_u16(),
            retry_after: h("retry-after"),
            reset_ms: h(contract::RESET_MS),
            correlation_id: h(contract::REQUEST_ID),
            body: (status == StatusCode::TOO_MANY_REQUESTS).then_some(body),
        };
        on_step(&step);
        let wait_ms = match (&step.reset_ms, &step.retry_after) {
            (Some(ms), _) => ms.parse::<u64>().ok(),
            (None, Some(s)) => s.parse::<u64>().ok().map(|s| s * 1_000),
            _ => None,
        };
        let limited = step.status == 429;
        steps.push(step);
        if limited {
            if waited {
                anyhow::bail!("a 429 again after waiting the time the first one named");
            }
            tokio::time::sleep(Duration::from_millis(wait_ms.unwrap_or(1_000) + 5)).await;
            waited = true;
        } else if waited {
            break;
        }
    }
    let _ = stop_tx.send(true);
    if !steps.iter().any(|s| s.status == 429) {
        anyhow::bail!("no 429 earned in {} requests", steps.len());
    }
    if steps.last().is_some_and(|s| s.status == 429) {
        anyhow::bail!(
            "the first 429 came on the last of {} requests: no request after the wait it named",
            steps.len()
        );
    }
    Ok(steps)
}

/// `foldgate demo`: runs the demo and prints each step as it happens, or every step as
/// one JSON array at the end.
pub fn run_and_print(limit_1s: u64, limit_60s: u64, json: bool) -> anyhow::Result<()> {
    if !json {
        println!(
            "Gateway with embedded defaults (in-process bus and fold owner, no NATS); \
             one key, plan {limit_1s} per 1 s and {limit_60s} per 60 s."
        );
    }
    let steps = crate::runtime()?.block_on(run_demo(limit_1s, limit_60s, |s| {
        if !json {
            print_step(s);
        }
    }))?;
    if json {
        println!("{}", serde_json::to_string(&steps)?);
    }
    Ok(())
}

fn print_step(s: &DemoStep) {
    match s.status {
        429 => println!(
            "request {:>2}: 429  Retry-After: {}  X-RateLimit-Reset-Ms: {}  X-Request-Id: {}\n            body: {}\n            (waiting the time it named)",
            s.request,
            s.retry_after.as_deref().unwrap_or("-"),
            s.reset_ms.as_deref().unwrap_or("-"),
            s.correlation_id.as_deref().unwrap_or("-"),
            s.body.as_deref().unwrap_or("")
        ),
        st => println!("request {:>2}: {st}", s.request),
    }
}
