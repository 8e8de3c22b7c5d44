//! The engine's face to a server, as TGI's `Infer` is to its router: a server hands it a
//! validated request with its draft leases and its model's verifier and price, and gets back
//! a stream of token events and, when the generation ends, its account (tokens by source,
//! calls, the target's time, the cost). What lies between stays behind this face: the `n`
//! runs, one per lease, seeded apart; merging their stats; pricing the answer in its class;
//! and scoping the target calls' trace context and deadline.
//!
//! Beside the run, this face names what a server builds once and keeps (the engine, its
//! draft workers and target client, the verifiers, the grammar compiler), what it keeps
//! account with (ledgers, meters, the target's counters), and the HTTP [`transport`] the
//! engine's target clients share with a server's passthrough. With [`crate::request`] and
//! [`crate::policy`] it is all a server needs to name; the rest of the crate stays behind it.

use std::path::Path;
use std::sync::Arc;
use tokio::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::cost::{BusyRates, Pricing, Tariff, answer_cost};
use crate::decode::{GenerateRequest, TargetTime};
use crate::draft::Draft;
use crate::targets::trace::{self, TraceContext};
use crate::targets::{PrefixStyle, TargetKind, TextSettings, retry};
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

// What a server builds once and keeps.
pub use crate::decode::{DecodeSettings, Engine};
pub use crate::draft::lazy::LazyDraftPool;
pub use crate::draft::{DRAFT_GRAPH, DraftConfig, DraftWorkers};
pub use crate::grammar::Grammars;
pub use crate::home::{DRAFT_GGUF_SHA256, Home};
pub use crate::targets::{TargetClient, TargetConfig, TargetFacts, WindowRoute};
pub use crate::verify::Verifier;

// What a run yields, and how it fails.
pub use crate::decode::{FinishReason, Stats, TokenEvent};
pub use crate::error::{EngineError, TargetError};

// What a server keeps account with.
pub use crate::cost::{BudgetGuard, BusyMeter, CostEstimate, CostGuard, Ledger, Rates, Unit};
pub use crate::targets::counters::TargetCounters;

/// The HTTP transport the engine's target clients use, for a server that also calls the
/// target itself (passthrough, readiness): the same TLS settings, the same retry verdicts,
/// and the deadline and trace context a request's calls carry.
pub mod transport {
    pub use crate::targets::retry::{Verdict, current_deadline, status_verdict, with_deadline};
    pub use crate::targets::trace::TraceContext;
    pub use crate::targets::{SendFailure, http_client_builder, load_ca_file};
}

/// Connects a client to the target of `kind` a policy names. A text-level kind re-tokenizes
/// with the draft's `tokenizer`; `chat_template` is the target's own template file, for an
/// `openai_text` target of another model family, read here so a bad file fails the policy's
/// load rather than its first request.
pub fn connect(
    kind: TargetKind,
    config: TargetConfig,
    tokenizer: &Tokenizer,
    prefix_style: PrefixStyle,
    chat_template: Option<&Path>,
) -> anyhow::Result<Arc<dyn TargetClient>> {
    let chat_template = chat_template
        .map(ChatTemplate::from_file)
        .transpose()?
        .map(Arc::new);
    let text = TextSettings {
        prefix_style,
        chat_template,
    };
    Ok(crate::targets::build(kind, config, tokenizer, &text)?)
}

/// One token event of answer `.0` (of the `n` asked for).
pub type Event = (usize, TokenEvent);

/// Events buffered between the runs and the server.
const EVENTS_BUFFERED: usize = 256;

/// What the target's time is worth: rates that learn from each finished generation.
pub trait Meter: Send + Sync {
    /// Learns from a finished generation's calls.
    fn learn(&self, stats: &Stats);
    /// The rates now.
    fn rates(&self) -> BusyRates;
}

/// Where a finished generation's spend is booked (a model's budget), as soon as it ends,
/// however its response then goes.
pub trait Books: Send + Sync {
    /// Books `stats`, which cost `cost` in its model's price class.
    fn record(&self, stats: &Stats, cost: CostEstimate);
}

/// A validated request, ready to run.
pub struct Job {
    /// The generation each answer runs (answer `i` is seeded `seed + i`).
    pub request: GenerateRequest,
    /// One draft lease per answer (`n`).
    pub leases: Vec<Box<dyn Draft>>,
    /// The model's verifier.
    pub verifier: Arc<dyn Verifier>,
    /// The model's price.
    pub price: Pricing,
    /// The target's rates, taught by each generation.
    pub meter: Arc<dyn Meter>,
    /// The model's budget, where it has one.
    pub books: Option<Arc<dyn Books>>,
    /// The request's trace context, which every target call carries.
    pub trace: TraceContext,
    /// A deadline the target calls' retries must not pass (a non-streamed answer's head).
    pub deadline: Option<Instant>,
}

/// A finished generation and what it cost at its model's prices, computed once when it ends.
#[derive(Debug, Clone)]
pub struct Account {
    /// All the request's answers together (`n > 1`: summed).
    pub stats: Stats,
    /// Why each answer ended, in order.
    pub finishes: Vec<Option<FinishReason>>,
    /// In the model's price class's unit (busy: the target's seconds, as `time` counts them).
    pub cost: CostEstimate,
    /// The target's time on it, and passthrough's, at the rates learned so far.
    pub time: TargetTime,
    /// The unit of `cost`.
    pub unit: Unit,
}

impl Account {
    /// Prices `stats` under `price`, first teaching `meter` what the target reported.
    fn new(
        stats: Stats,
        finishes: Vec<Option<FinishReason>>,
        price: &Pricing,
        meter: &dyn Meter,
    ) -> Self {
        meter.learn(&stats);
        let time = stats.target_time(&meter.rates());
        let measured = CostEstimate {
            approxy: time.at_rates,
            passthrough: time.passthrough,
        };
        Self {
            cost: answer_cost(&stats.spend(), price, measured),
            stats,
            finishes,
            time,
            unit: price.unit(),
        }
    }
}

/// The generation's end: its account, or what broke it.
pub type Done = JoinHandle<Result<Account, EngineError>>;

/// Starts `job` on `engine`: its answers' events arrive on the receiver, in order per answer;
/// the handle ends with the account once every answer has ended. Dropping the receiver stops
/// every run and frees its lease.
pub fn start(engine: &Engine, job: Job) -> (mpsc::Receiver<Event>, Done) {
    let Job {
        request,
        leases,
        verifier,
        price,
        meter,
        books,
        trace: context,
        deadline,
    } = job;
    let n = leases.len();
    let (tx, rx) = mpsc::channel::<Event>(EVENTS_BUFFERED);
    let runs: Vec<_> = leases
        .into_iter()
        .enumerate()
        .map(|(i, lease)| {
            let request = seeded_apart(&request, i);
            run(
                engine.clone(),
                Arc::clone(&verifier),
                lease,
                request,
                i,
                tx.clone(),
            )
        })
        .collect();
    drop(tx);
    let generation = async move {
        // In this task, not spawned: the trace context and the deadline are the task's.
        let mut merged: Option<Stats> = None;
        let mut finishes = Vec::with_capacity(n);
        for r in futures::future::join_all(runs).await {
            let stats = r?;
            finishes.push(stats.finish_reason);
            match &mut merged {
                Some(m) => m.absorb(stats),
                None => merged = Some(stats),
            }
        }
        let account = Account::new(merged.unwrap_or_default(), finishes, &price, &*meter);
        if let Some(books) = &books {
            books.record(&account.stats, account.cost);
        }
        Ok(account)
    };
    let done = tokio::spawn(trace::scope(context, retry::within(deadline, generation)));
    (rx, done)
}

/// Answer `i`'s request: the first as sent, the others seeded apart (`seed + i`), so `n`
/// answers with a seed are `n` repeatable, different answers.
fn seeded_apart(request: &GenerateRequest, i: usize) -> GenerateRequest {
    let mut r = request.clone();
    r.sampling.seed = r.sampling.seed.map(|s| s.wrapping_add(i as u64));
    r
}

/// One answer's generation on its own draft lease, its events tagged with its index. It stops
/// as soon as the client is gone (`out` closed), which also frees the lease. Watched here
/// rather than left to the engine's next send: during a long prefill or a target call there
/// is no send for seconds.
async fn run(
    engine: Engine,
    verifier: Arc<dyn Verifier>,
    lease: Box<dyn Draft>,
    request: GenerateRequest,
    index: usize,
    out: mpsc::Sender<Event>,
) -> Result<Stats, EngineError> {
    let left = || Err(EngineError::Draft("the client left".into()));
    let (tx, mut rx) = mpsc::channel::<TokenEvent>(EVENTS_BUFFERED);
    // `tx` goes with the engine's future and is dropped when it ends, which ends `rx`.
    let generate = engine.generate(lease.as_ref(), verifier.as_ref(), request, tx);
    tokio::pin!(generate);
    let mut result = None;
    loop {
        tokio::select! {
            r = &mut generate, if result.is_none() => result = Some(r),
            ev = rx.recv() => match ev {
                Some(ev) => {
                    if out.send((index, ev)).await.is_err() {
                        return left();
                    }
                }
                // Everything it sent is out, in order.
                None => return result.unwrap_or_else(left),
            },
            () = out.closed() => return left(),
        }
    }
}
