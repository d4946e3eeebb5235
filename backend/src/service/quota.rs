//! Per-guest limits of what a guest may make the backend hold.
//!
//! A request beyond a limit is answered with `CtrlStatus::Quota` and counted; it is not a
//! protocol violation (a correct guest may simply want more than dom0 grants it).

/// Limits applied to every guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestQuotas {
    /// Endpoints open at once (published as `max-endpoints`).
    pub max_endpoints: usize,
    /// Regions registered at once on one endpoint (published as `max-regions`).
    pub max_regions_per_endpoint: usize,
    /// Foreign pages mapped at once for the guest: control ring, endpoint pages, regions,
    /// and the info pages read while a request is served.
    pub max_mapped_pages: usize,
    /// Events waiting for room in one endpoint's event ring. While an endpoint has this many,
    /// the backend stops taking requests from its send ring (their completions would have
    /// nowhere to go) and drops further received messages, which the sender retransmits.
    pub max_event_backlog: usize,
    /// Send requests taken from one send ring per service round, so that one busy guest
    /// cannot starve the others.
    pub send_budget_per_round: u32,
}

impl Default for GuestQuotas {
    fn default() -> Self {
        GuestQuotas {
            max_endpoints: 32,
            max_regions_per_endpoint: 256,
            // 64 Ki pages: 256 MiB of guest memory mapped at once.
            max_mapped_pages: 1 << 16,
            max_event_backlog: 1024,
            send_budget_per_round: 32,
        }
    }
}

/// What a guest holds now, checked against [`GuestQuotas`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestUsage {
    /// Foreign pages mapped for the guest.
    pub mapped_pages: usize,
    /// Endpoints open.
    pub endpoints: usize,
    /// Regions registered, all endpoints together.
    pub regions: usize,
}

impl GuestUsage {
    /// `pages` mapped for the guest are no longer.
    pub fn unmapped(&mut self, pages: usize) {
        self.mapped_pages = self.mapped_pages.saturating_sub(pages);
    }

    /// True if `more` pages may be mapped on top of what is mapped.
    pub fn may_map(&self, quotas: &GuestQuotas, more: usize) -> bool {
        self.mapped_pages
            .checked_add(more)
            .is_some_and(|n| n <= quotas.max_mapped_pages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_quota_is_inclusive_and_overflow_safe() {
        let q = GuestQuotas {
            max_mapped_pages: 10,
            ..GuestQuotas::default()
        };
        let u = GuestUsage {
            mapped_pages: 7,
            ..GuestUsage::default()
        };
        assert!(u.may_map(&q, 3));
        assert!(!u.may_map(&q, 4));
        assert!(!u.may_map(&q, usize::MAX));
    }
}
