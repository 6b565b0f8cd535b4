//! The one API a node runtime offers the HTTP gateway and the harnesses, whichever bus is
//! under it: [`NodeRuntime`], implemented by the NATS runtime ([`NodeBus`]) and the
//! embedded one ([`EmbeddedBus`]).
//!
//! The decision itself is written once, here ([`decide_at`]): the surface's memory read,
//! and only when it asks for one, a fast path (the runtime's own, over its bus) or a join
//! of the fast path already in flight for the key. What differs between runtimes is how a
//! fast path reaches an owner, so that is all a runtime implements.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bus_schemas::{KeyId, Now, subjects};
use tokio::sync::{Notify, watch};

use crate::bus::{NodeBus, NodeBusStats};
use crate::deadline::within;
use crate::embedded::EmbeddedBus;
use crate::http::node::NodeSettings;
use crate::http::node::SettingsError;
use crate::limiter::NodeLimiter;
use crate::policy::{KeyPolicy, PolicyIndex};
use crate::surface::{Decision, DecisionSurface, FastPathNeed};
use foldgate_runtime::Clock;

/// A fast path in flight: boxed, because a trait object cannot name its future's type.
/// It is built only when the surface asks for a fast path (A48: under 0.5% of requests)
/// that the runtime cannot answer in place (`NodeRuntime::fast_path_in_place`), never on
/// the decision's common path.
pub type FastPathFuture<'a> = Pin<Box<dyn Future<Output = Decision> + Send + 'a>>;

/// What the gateway needs of a node runtime.
pub trait NodeRuntime: Send + Sync {
    /// The decision surface the runtime's limiter fills.
    fn surface(&self) -> &Arc<DecisionSurface>;

    /// The policy in force (P1), to resolve a key's plan when it authenticates (D1).
    fn policy(&self) -> watch::Receiver<Arc<PolicyIndex>>;

    /// Fast paths that missed their deadline.
    fn fast_path_deadline_missed(&self) -> u64;

    /// The bus counters, for a runtime that has a bus.
    fn bus_stats(&self) -> Option<&NodeBusStats> {
        None
    }

    /// Woken when a fast path settles, for the requests that joined it.
    fn fast_path_done(&self) -> &Notify;

    /// How long a fast path (or a request joining one) may take.
    fn fast_path_wait(&self) -> Duration;

    /// The fast path answered at once, with no future built, if the runtime can: the
    /// embedded runtime's owners are in this process, so with its books free the answer
    /// is a function call. `Err` hands the need back for `fast_path`; by default it
    /// always is (an owner over a bus has to be waited for).
    fn fast_path_in_place(
        &self,
        now: Now,
        need: FastPathNeed,
        policy: &KeyPolicy,
    ) -> Result<Decision, FastPathNeed> {
        let _ = (now, policy);
        Err(need)
    }

    /// Asks the owner for the key-window that ran dry, then decides on what came back.
    fn fast_path<'a>(
        &'a self,
        now: Now,
        need: FastPathNeed,
        policy: &'a KeyPolicy,
    ) -> FastPathFuture<'a>;

    /// Runs `f` on the limiter (for invariant checks and inspection).
    fn with_limiter_dyn(&self, f: &mut dyn FnMut(&mut NodeLimiter));
}

impl dyn NodeRuntime {
    /// One request's decision, for a request that arrived at `now` ([`decide_at`]).
    pub async fn decide_at(&self, key: KeyId, policy: &KeyPolicy, now: Now) -> Decision {
        decide_at(self, key, policy, now).await
    }

    /// Runs `f` on the limiter and returns what it returns.
    pub fn with_limiter<R>(&self, f: impl FnOnce(&mut NodeLimiter) -> R) -> R {
        let mut f = Some(f);
        let mut out = None;
        self.with_limiter_dyn(&mut |l| out = f.take().map(|f| f(l)));
        out.expect("with_limiter_dyn calls its closure once")
    }
}

/// One request's decision, for a request that arrived at `now`. Returns at once unless the
/// surface asks for a fast path, which is then given at most `fast_path_wait`. Every window
/// the request is charged to is named from this one reading, the fast path's second look
/// included, so a caller that books the request (the oracle in `bench fleet`) books it
/// where it was charged.
pub async fn decide_at<R: NodeRuntime + ?Sized>(
    runtime: &R,
    key: KeyId,
    policy: &KeyPolicy,
    now: Now,
) -> Decision {
    let surface = runtime.surface();
    match surface.decide(key, now.wall_ms, policy) {
        Decision::FastPath(need) if need.join => {
            let (done, wait) = (runtime.fast_path_done(), runtime.fast_path_wait());
            join_fast_path(surface, done, wait, now, need, policy).await
        }
        Decision::FastPath(need) => match runtime.fast_path_in_place(now, need, policy) {
            Ok(d) => d,
            Err(need) => runtime.fast_path(now, need, policy).await,
        },
        d => d,
    }
}

/// Waits, at most the `wait` its own fast path would have had, for the request that is
/// asking the owner for this key (it wakes `done` when it settles); then decides on what
/// it brought.
async fn join_fast_path(
    surface: &DecisionSurface,
    done: &Notify,
    wait: Duration,
    now: Now,
    need: FastPathNeed,
    policy: &KeyPolicy,
) -> Decision {
    let deadline = Instant::now() + wait;
    let mut missed = false;
    loop {
        // Armed before the check, so an answer landing in between still wakes us.
        let settled = done.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        if !surface.fast_path_pending(need.key) {
            break;
        }
        if within(deadline, settled).await.is_none() {
            missed = true;
            break;
        }
    }
    surface.decide_after_fast_path(need.key, now.wall_ms, policy, missed)
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Settings(#[from] SettingsError),
    #[error("connecting to NATS: {0}")]
    Connect(#[from] async_nats::ConnectError),
    #[error(transparent)]
    Bus(#[from] crate::bus::NodeBusError),
    #[error(transparent)]
    Policy(#[from] crate::bus::PolicyWatchError),
}

/// Starts the runtime the settings name: NATS if `nats_url` is set, else embedded.
pub async fn start(
    settings: &NodeSettings,
    clock: Clock,
    shutdown: watch::Receiver<bool>,
) -> Result<Box<dyn NodeRuntime>, RuntimeError> {
    let mut config = settings.node_config()?;
    if settings.nats_url.is_empty() {
        // Embedded: the owners are in this process and a fast path is a function call,
        // so standing options would buy nothing, and at a start they would cost a
        // window that began before it half its pool (ARCHITECTURE.md, "Standing
        // options").
        config.standing_permille = 0;
    }
    let surface = Arc::new(DecisionSurface::new(settings.surface_config()));
    // C9: a new epoch at every start; wall milliseconds outgrow any earlier start's.
    let now = clock();
    let epoch = bus_schemas::NodeEpoch(now.wall_ms.max(1));
    let limiter = NodeLimiter::new(config, surface, epoch, now);
    if settings.nats_url.is_empty() {
        let bus = EmbeddedBus::start(limiter, clock, shutdown);
        let index = settings.policy.index(settings.round_ms)?;
        bus.set_policy(index);
        return Ok(Box::new(bus));
    }
    let client = foldgate_runtime::nats::connect_options(
        settings.nats_ca_file.as_deref(),
        settings
            .nats_cert_file
            .as_deref()
            .zip(settings.nats_key_file.as_deref()),
    )
    .connect(&settings.nats_url)
    .await?;
    let mut bus = NodeBus::start(client, limiter, clock, shutdown).await?;
    bus.watch_policy(subjects::POLICY_BUCKET).await?;
    Ok(Box::new(bus))
}
