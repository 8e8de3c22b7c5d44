//! The bytes request bodies may hold while they are read, before their requests take a slot,
//! and each client address's share of them.
//!
//! Bodies are read ahead of the slots so that a slow one never holds a slot; without a bound of
//! their own, clients trickling large bodies over many connections (and HTTP/2 streams) could
//! buffer any amount. The budget is what the slots could hold once the bodies are read
//! (`max_concurrent_requests` times `max_body_bytes`). It is charged for bytes received, never
//! for bytes promised: a `Content-Length` costs nothing until its bytes come, so connections
//! that declare large bodies and then trickle them hold a few bytes each, not the budget. One
//! address may hold at most its share of connections' worth of it (`max_connections_per_ip`
//! of `max_connections`, and always room for one whole body), so clients at one address that
//! send large bodies fast and then stall cannot fill it for everyone else either. With no
//! per-address cap (behind a proxy, where every client has the proxy's address) there is no
//! share. A start-up setting, as the slots are.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The client address a connection came from, set on each of its requests (absent for
/// requests served in process, as in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub IpAddr);

/// The budget: a total, and the most one address may hold of it.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    total: Arc<Semaphore>,
    per_address: Option<usize>,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// The budget is spent (for everyone, or for this address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    /// Every byte of the budget is held.
    Total,
    /// This address holds its share.
    Address,
}

/// What one body being read holds; given back when dropped.
#[derive(Debug)]
pub struct Held {
    permit: Option<OwnedSemaphorePermit>,
    bytes: usize,
    address: Option<IpAddr>,
    budget: BodyBudget,
}

impl BodyBudget {
    /// `total` bytes, of which one address holds at most `per_address` (`None`: no share).
    pub fn new(total: usize, per_address: Option<usize>) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
            per_address,
            held: Arc::default(),
        }
    }

    /// The budget for a gateway policy (see the module documentation).
    pub fn for_policy(g: &crate::policy::GatewayPolicy) -> Self {
        let total = g.max_concurrent_requests.saturating_mul(g.max_body_bytes);
        let share = (g.max_connections_per_ip > 0).then(|| {
            let part = total as f64 * g.max_connections_per_ip as f64 / g.max_connections as f64;
            (part as usize).max(g.max_body_bytes).min(total)
        });
        Self::new(total, share)
    }

    /// Bytes not held by any body.
    pub fn available(&self) -> usize {
        self.total.available_permits()
    }

    /// An empty hold for a body from `address`.
    pub fn hold(&self, address: Option<IpAddr>) -> Held {
        Held {
            permit: None,
            bytes: 0,
            address,
            budget: self.clone(),
        }
    }

    fn addresses(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Held {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `n` more bytes, or says which budget is spent (holding nothing more then).
    pub fn grow(&mut self, n: usize) -> Result<(), Spent> {
        if n == 0 {
            return Ok(());
        }
        let b = &self.budget;
        if let (Some(ip), Some(share)) = (self.address, b.per_address) {
            let mut held = b.addresses();
            let mine = held.entry(ip).or_insert(0);
            if *mine + n > share {
                if *mine == 0 {
                    held.remove(&ip);
                }
                return Err(Spent::Address);
            }
            *mine += n;
        }
        let taken = u32::try_from(n)
            .ok()
            .and_then(|k| b.total.clone().try_acquire_many_owned(k).ok());
        let Some(taken) = taken else {
            self.release_address(n);
            return Err(Spent::Total);
        };
        match &mut self.permit {
            Some(p) => p.merge(taken),
            None => self.permit = Some(taken),
        }
        self.bytes += n;
        Ok(())
    }

    fn release_address(&self, n: usize) {
        let Some(ip) = self.address else { return };
        if self.budget.per_address.is_none() {
            return;
        }
        let mut held = self.budget.addresses();
        if let Some(mine) = held.get_mut(&ip) {
            *mine = mine.saturating_sub(n);
            if *mine == 0 {
                held.remove(&ip);
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release_address(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn an_address_holds_at_most_its_share_and_everything_comes_back() {
        let budget = BodyBudget::new(100, Some(40));
        let mut a1 = budget.hold(Some(A));
        let mut a2 = budget.hold(Some(A));
        a1.grow(30).unwrap();
        assert_eq!(a2.grow(11), Err(Spent::Address));
        a2.grow(10).unwrap();
        // Another address is served from the rest.
        let mut b = budget.hold(Some(B));
        b.grow(40).unwrap();
        let mut unknown = budget.hold(None);
        assert_eq!(unknown.grow(21), Err(Spent::Total));
        unknown.grow(20).unwrap();
        assert_eq!(budget.available(), 0);
        drop((a1, a2, b, unknown));
        assert_eq!(budget.available(), 100);
        assert!(budget.addresses().is_empty());
    }

    #[test]
    fn without_a_share_only_the_total_binds() {
        let budget = BodyBudget::new(100, None);
        let mut a = budget.hold(Some(A));
        a.grow(100).unwrap();
        assert_eq!(a.bytes(), 100);
        assert_eq!(budget.hold(Some(B)).grow(1), Err(Spent::Total));
    }

    #[test]
    fn the_policy_share_follows_the_connection_share() {
        let mut g = crate::policy::Policy::parse(
            "[target]\nkind = \"llama_cpp\"\nbase_url = \"http://h:1\"\n[gateway]\nauth = \"none\"\n",
            std::path::Path::new("/p.toml"),
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .gateway;
        let budget = BodyBudget::for_policy(&g);
        let total = g.max_concurrent_requests * g.max_body_bytes;
        assert_eq!(budget.available(), total);
        assert_eq!(
            budget.per_address,
            Some(total * g.max_connections_per_ip / g.max_connections)
        );
        g.max_connections_per_ip = 1;
        assert_eq!(
            BodyBudget::for_policy(&g).per_address,
            Some(g.max_body_bytes)
        );
        g.max_connections_per_ip = 0;
        assert_eq!(BodyBudget::for_policy(&g).per_address, None);
    }
}
