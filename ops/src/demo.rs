//! The README's main job (`foldgate demo`): a gateway node on its embedded defaults, one
//! key, and requests until a 429 is earned, then one more after the wait it named.

use std::path::PathBuf;
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

/// Where the demo's node archives its limit events, and what it found there at the end.
#[derive(Debug, Serialize)]
pub struct DemoArchive {
    pub dir: PathBuf,
    /// The archive's rows for the demo key, as `foldgate history` prints them.
    pub history: String,
    pub rows: usize,
}

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
    archive: &std::path::Path,
    mut on_step: impl FnMut(&DemoStep),
) -> anyhow::Result<(Vec<DemoStep>, DemoArchive)> {
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
    let mut settings: NodeSettings = toml::from_str(&format!(
        "upstream.urls = [\"http://{up_addr}\"]\nhash_key_hex = \"{secret}\"\nlog_level = \"warn\"\n{policy}"
    ))?;
    settings.events.archive_dir = Some(archive.to_path_buf());
    let clock = system_clock();
    let runtime = start_runtime(&settings, Arc::clone(&clock), stop.clone()).await?;
    let (node, epoch) = runtime.with_limiter(|l| (l.node(), l.epoch()));
    let (queue, pump) = gateway_node::events::start(&settings.events, node, epoch, stop.clone())?
        .ok_or_else(|| anyhow::anyhow!("an archive dir names a sink"))?;
    let gateway = Arc::new(NodeGateway::new(&settings, runtime, clock)?.with_events(queue));
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
    // The pump writes what is left when it sees the stop, then ends.
    pump.await?;
    let key_id = foldgate_archive::encoder::key_id_text(hasher.key_id(key.as_bytes()));
    let found = history_of(archive, key_id)?;
    if !steps.iter().any(|s| s.status == 429) {
        anyhow::bail!("no 429 earned in {} requests", steps.len());
    }
    if steps.last().is_some_and(|s| s.status == 429) {
        anyhow::bail!(
            "the first 429 came on the last of {} requests: no request after the wait it named",
            steps.len()
        );
    }
    let limited = steps.iter().filter(|s| s.status == 429).count();
    if found.rows != limited {
        anyhow::bail!(
            "{} 429s earned, {} in the archive at {}",
            limited,
            found.rows,
            archive.display()
        );
    }
    Ok((steps, found))
}

/// The demo key's rows, as `foldgate history --keys-from` would print them.
fn history_of(archive: &std::path::Path, key_id: String) -> anyhow::Result<DemoArchive> {
    let q = crate::history::HistoryQuery {
        key_ids: [key_id].into(),
        ..Default::default()
    };
    let (rows, warnings) = crate::history::query(archive, &q)?;
    if let Some(w) = warnings.first() {
        anyhow::bail!("the demo's own archive has a bad file: {w}");
    }
    let mut text = Vec::new();
    foldgate_archive::output::write(&mut text, crate::history::Format::Table, &rows)?;
    Ok(DemoArchive {
        dir: archive.to_path_buf(),
        history: String::from_utf8_lossy(&text).into_owned(),
        rows: rows.iter().map(|b| b.num_rows()).sum(),
    })
}

/// `foldgate demo`: runs the demo and prints each step as it happens, or every step as
/// one JSON array at the end.
pub fn run_and_print(
    limit_1s: u64,
    limit_60s: u64,
    json: bool,
    archive: Option<PathBuf>,
) -> anyhow::Result<()> {
    // Without --archive, a folder of its own that outlives the demo, so the history
    // command it prints can be run afterwards.
    let archive = match archive {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!(
            "foldgate-demo-{}-{:08x}",
            std::process::id(),
            gateway_node::http::auth::random_u64() as u32
        )),
    };
    if !json {
        println!(
            "Gateway with embedded defaults (in-process bus and fold owner, no NATS); \
             one key, plan {limit_1s} per 1 s and {limit_60s} per 60 s."
        );
    }
    let (steps, found) =
        crate::runtime()?.block_on(run_demo(limit_1s, limit_60s, &archive, |s| {
            if !json {
                print_step(s);
            }
        }))?;
    if json {
        println!(
            "{}",
            serde_json::json!({ "steps": steps, "archive": found })
        );
    } else {
        println!(
            "\nThe 429 as a limit event in the archive at {} \
             (`foldgate history --archive {0}`):\n{}",
            found.dir.display(),
            found.history
        );
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
