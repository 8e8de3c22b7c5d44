//! One retry policy for every call to the target: the engine's calls and the gateway's
//! passthrough. The schedule, the attempt count and the sleeping are `backon`'s; what is ours
//! is which failures are worth another attempt, the jitter, and the deadline a wait must fit.
//!
//! - Delays grow from the policy's `target.backoff`, doubling, capped at [`BACKOFF_CAP`], with
//!   full jitter (a uniform draw below the delay): many gateways that saw the same target fail
//!   at once do not all come back at the same instant.
//! - A target that says when to come back (`Retry-After` on 429 or 503, as hosted APIs send
//!   when they rate-limit) is waited for exactly that long instead, when the wait fits the
//!   deadline; when it does not, its error is returned at once rather than after a wait that
//!   could not end in an answer.
//! - No wait runs past the deadline: the call's own (`target.timeout` for each attempt it may
//!   make, from its first) or the request's, when the gateway runs one ([`with_deadline`]).

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};

tokio::task_local! {
    static DEADLINE: Instant;
}

/// Longest backoff between two attempts (a larger `target.backoff` is kept as it is): past
/// this a failure is no passing blip, and the caller is better told.
pub const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// Longest `Retry-After` read: a larger one never fits a deadline anyway.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(24 * 3600);

/// What a failed attempt allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Try again after the backoff.
    Retry,
    /// Try again after the time the target named.
    RetryAfter(Duration),
    /// Give up: another attempt would fail the same way.
    Final,
}

/// Attempts and delays.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Attempts after the first.
    pub retries: u32,
    /// First backoff.
    pub backoff: Duration,
    /// Longest one attempt may take: the call's own deadline is this for each attempt it may
    /// make, so a wait never stretches a call past what its attempts alone could take.
    pub call_timeout: Duration,
}

impl RetryPolicy {
    /// Runs `attempt` until it succeeds, `verdict` calls its error final, the retries are
    /// spent, or the next wait would not fit the deadline; returns the last error then.
    pub async fn run<T, E, Fut, F, V>(&self, attempt: F, verdict: V) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        V: Fn(&E) -> Verdict,
        E: std::fmt::Display,
    {
        let deadline = self.deadline(Instant::now());
        let schedule = ExponentialBuilder::default()
            .with_min_delay(self.backoff)
            .with_max_delay(self.backoff.max(BACKOFF_CAP))
            .with_factor(2.0)
            .with_max_times(self.retries as usize);
        attempt
            .retry(schedule.build())
            .sleep(tokio::time::sleep)
            .when(|e| verdict(e) != Verdict::Final)
            .adjust(|e, next| wait(verdict(e), next, deadline, Instant::now(), rand::random))
            .notify(|e, wait| tracing::warn!(error = %e, ?wait, "target call failed; retrying"))
            .await
    }

    /// The call's deadline: its own, or the request's when that comes first.
    fn deadline(&self, started: Instant) -> Instant {
        let own = started
            + self
                .call_timeout
                .saturating_mul(self.retries.saturating_add(1));
        DEADLINE.try_with(|d| own.min(*d)).unwrap_or(own)
    }
}

/// The wait before the next attempt, or `None` to give up: `next` is the schedule's delay
/// (`None` once the retries are spent), `unit` a uniform draw in [0, 1) for the jitter.
fn wait(
    verdict: Verdict,
    next: Option<Duration>,
    deadline: Instant,
    now: Instant,
    unit: impl FnOnce() -> f64,
) -> Option<Duration> {
    let delay = match (verdict, next) {
        (Verdict::Final, _) | (_, None) => return None,
        (Verdict::RetryAfter(after), Some(_)) => after,
        (Verdict::Retry, Some(d)) => d.mul_f64(unit().clamp(0.0, 1.0)),
    };
    (now + delay < deadline).then_some(delay)
}

/// Runs `f` with `deadline` as the request's: no retry inside it waits past that instant.
pub async fn with_deadline<F: Future>(deadline: Instant, f: F) -> F::Output {
    DEADLINE.scope(deadline, f).await
}

/// The request's deadline in the running task, if one is set: a task spawned for the request
/// takes it along with [`within`] (a task-local does not cross `tokio::spawn`).
pub fn current_deadline() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// Runs `f` under `deadline` when there is one, as [`with_deadline`].
pub async fn within<F: Future>(deadline: Option<Instant>, f: F) -> F::Output {
    match deadline {
        Some(d) => with_deadline(d, f).await,
        None => f.await,
    }
}

/// The wait a `Retry-After` header asks for: delay-seconds or an HTTP date (RFC 9110, 10.2.3).
pub fn retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    let after = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(v)
            .ok()?
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    };
    Some(after.min(RETRY_AFTER_MAX))
}

/// What a target's error status allows: 5xx is retried (the same request may well succeed
/// on a target that recovers), 429 only when the target says when, other 4xx never (the same
/// request would fail the same way). A `Retry-After` on 429 or 503 sets the wait.
pub fn status_verdict(status: u16, retry_after_header: Option<&str>) -> Verdict {
    let after = retry_after_header.and_then(retry_after);
    match (status, after) {
        (429 | 503, Some(after)) => Verdict::RetryAfter(after),
        (500.., _) => Verdict::Retry,
        _ => Verdict::Final,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_is_fully_jittered_and_bounded_by_the_deadline() {
        let now = Instant::now();
        let d = Duration::from_millis(800);
        let far = now + Duration::from_secs(60);
        assert_eq!(
            wait(Verdict::Retry, Some(d), far, now, || 0.0),
            Some(Duration::ZERO)
        );
        assert_eq!(
            wait(Verdict::Retry, Some(d), far, now, || 0.5),
            Some(Duration::from_millis(400))
        );
        assert_eq!(wait(Verdict::Retry, None, far, now, || 0.5), None);
        assert_eq!(wait(Verdict::Final, Some(d), far, now, || 0.5), None);
        let near = now + Duration::from_millis(300);
        assert_eq!(wait(Verdict::Retry, Some(d), near, now, || 0.5), None);
        assert_eq!(
            wait(Verdict::Retry, Some(d), near, now, || 0.25),
            Some(Duration::from_millis(200))
        );
    }

    #[test]
    fn a_retry_after_is_waited_exactly_when_it_fits() {
        let now = Instant::now();
        let after = Verdict::RetryAfter(Duration::from_secs(2));
        let tiny = Some(Duration::from_millis(1));
        assert_eq!(
            wait(after, tiny, now + Duration::from_secs(5), now, || 0.0),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            wait(after, tiny, now + Duration::from_secs(1), now, || 0.0),
            None
        );
        // Retries spent: no wait, however short.
        assert_eq!(
            wait(after, None, now + Duration::from_secs(5), now, || 0.0),
            None
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let d = retry_after(&later).unwrap_or_default();
        assert!(
            d > Duration::from_secs(115) && d <= Duration::from_secs(120),
            "{d:?}"
        );
        assert_eq!(retry_after("soon"), None);
        assert_eq!(retry_after("-1"), None);
    }

    #[test]
    fn statuses_retried_as_before_and_a_named_wait_honoured() {
        assert_eq!(status_verdict(500, None), Verdict::Retry);
        assert_eq!(status_verdict(502, Some("x")), Verdict::Retry);
        assert_eq!(
            status_verdict(503, Some("3")),
            Verdict::RetryAfter(Duration::from_secs(3))
        );
        assert_eq!(
            status_verdict(429, Some("1")),
            Verdict::RetryAfter(Duration::from_secs(1))
        );
        assert_eq!(status_verdict(429, None), Verdict::Final);
        assert_eq!(status_verdict(400, Some("1")), Verdict::Final);
        assert_eq!(status_verdict(401, None), Verdict::Final);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_stop_at_the_retries_and_at_the_requests_deadline() {
        let policy = RetryPolicy {
            retries: 3,
            backoff: Duration::from_millis(100),
            call_timeout: Duration::from_secs(60),
        };
        let calls = std::sync::atomic::AtomicU32::new(0);
        let attempt = || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err::<(), _>("down")
        };
        assert!(policy.run(attempt, |_| Verdict::Retry).await.is_err());
        assert_eq!(calls.swap(0, std::sync::atomic::Ordering::SeqCst), 4);
        // A named wait longer than the request has left: one attempt, the error at once.
        let started = tokio::time::Instant::now();
        let r = with_deadline(
            Instant::now() + Duration::from_secs(5),
            policy.run(attempt, |_| Verdict::RetryAfter(Duration::from_secs(30))),
        )
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
