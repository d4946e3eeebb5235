//! A plain-text account of where an endpoint stands, for the moment a
//! transfer stops making progress: which messages wait for an ack, which
//! LARGE sends wait for their NOTIFY, which receives wait for a pull, and
//! what each partner's windows say. Read by people, so it is lines of text,
//! not a format a program parses.

use std::fmt::Write;

use super::{CoreRequest, Endpoint, RecvState, RequestId, Retx, SendPayload};
use crate::time::Instant;

/// Requests listed one by one per state; the rest are counted.
const LISTED: usize = 4;

impl Endpoint {
    /// Where this endpoint stands at `now`: one line per partner with
    /// traffic outstanding, one per request state, and the oldest few
    /// requests of each waiting state.
    pub fn stall_report(&self, now: Instant) -> String {
        let ms = |t: Instant| now.saturating_since(t).as_millis();
        let until = |t: Instant| {
            let n = t.as_nanos() as i128 - now.as_nanos() as i128;
            n / 1_000_000
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "endpoint {} (session {:#x}{}): {} requests, {} inbound ({} unexpected bytes), {} frames queued, next timer {}",
            self.index,
            self.session,
            if self.closed { ", closed" } else { "" },
            self.requests.len(),
            self.inbound.len(),
            self.unexpected_bytes,
            self.transmits.len(),
            match self.next_timeout() {
                Some(t) => format!("in {} ms", until(t)),
                None => "none".into(),
            },
        );
        for (addr, p) in &self.partners {
            let quiet = p.non_acked.is_empty()
                && p.throttled.is_empty()
                && p.awaiting_notify.is_empty()
                && p.connects.is_empty()
                && p.partials.is_empty()
                && p.early.is_empty();
            if quiet {
                continue;
            }
            let _ = writeln!(
                out,
                "  partner {}:{} sessions {:?}/{:?}: send next {} acked-to {} unacked {} throttled {} awaiting-notify {} connects {}; recv match {} frag {} acked {} partials {} early {}{} ack {:?}",
                addr.peer_index,
                addr.endpoint,
                p.true_session,
                p.back_session,
                p.next_send_seq,
                p.next_acked_send_seq,
                p.non_acked.len(),
                p.throttled.len(),
                p.awaiting_notify.len(),
                p.connects.len(),
                p.next_match_recv_seq,
                p.next_frag_recv_seq,
                p.last_acked_recv_seq,
                p.partials.len(),
                p.early.len(),
                match p.early.first() {
                    Some(e) => format!(" (first {})", e.seqnum()),
                    None => String::new(),
                },
                p.ack,
            );
        }
        let retx_text = |retx: Option<Retx>| match retx {
            Some(x) => format!(
                "seq {} sent {}x, resend in {} ms",
                x.seqnum,
                x.transmissions,
                until(x.next_resend)
            ),
            None => "no seqnum yet".into(),
        };
        let mut sends_eager = Vec::new();
        let mut sends_large = Vec::new();
        let mut connects = Vec::new();
        let mut posted = 0usize;
        let mut assembling = Vec::new();
        let mut pulling = Vec::new();
        let mut notifying = Vec::new();
        // Oldest first, as a reader of the dump expects.
        let mut ids: Vec<&RequestId> = self.requests.keys().collect();
        ids.sort_unstable();
        for (id, r) in ids.into_iter().map(|id| (id, &self.requests[id])) {
            match r {
                CoreRequest::Connect(c) => connects.push(format!(
                    "connect {} to {}:{} sent {}x, {} ms old",
                    id.0,
                    c.peer.peer_index,
                    c.peer.endpoint,
                    c.transmissions,
                    ms(c.submitted)
                )),
                CoreRequest::Send(s) => {
                    let retx = retx_text(s.retx);
                    let line = format!(
                        "send {} to {}:{} match {:#x}: {retx}, {} ms old",
                        id.0,
                        s.peer.peer_index,
                        s.peer.endpoint,
                        s.match_info,
                        ms(s.submitted)
                    );
                    match &s.payload {
                        SendPayload::Eager(_) => sends_eager.push(line),
                        SendPayload::Large { msg_length, window } => sends_large.push(format!(
                            "{line}, {msg_length} bytes window {}/{}, notified {:?}",
                            window.id, window.seqnum, s.notified
                        )),
                    }
                }
                CoreRequest::Recv(r) => match &r.state {
                    RecvState::Posted => posted += 1,
                    RecvState::Assembling => assembling.push(format!("recv {}", id.0)),
                    RecvState::Pulling(l) => pulling.push(format!(
                        "recv {} pulling {} of {} bytes from {}:{} window {}/{}",
                        id.0,
                        l.xfer_length,
                        l.msg_length,
                        l.source.peer_index,
                        l.source.endpoint,
                        l.window.id,
                        l.window.seqnum
                    )),
                    RecvState::Notifying {
                        large,
                        status,
                        retx,
                        ..
                    } => notifying.push(format!(
                        "recv {} notifying {}:{} ({status:?}): {}",
                        id.0,
                        large.source.peer_index,
                        large.source.endpoint,
                        retx_text(*retx)
                    )),
                },
            }
        }
        let _ = writeln!(
            out,
            "  receives posted {posted}, assembling {}, pulling {}, notifying {}; sends eager {}, large {}; connects {}",
            assembling.len(),
            pulling.len(),
            notifying.len(),
            sends_eager.len(),
            sends_large.len(),
            connects.len()
        );
        for list in [
            &connects,
            &sends_eager,
            &sends_large,
            &assembling,
            &pulling,
            &notifying,
        ] {
            for line in list.iter().take(LISTED) {
                let _ = writeln!(out, "    {line}");
            }
            if list.len() > LISTED {
                let _ = writeln!(out, "    ... and {} more", list.len() - LISTED);
            }
        }
        out
    }
}
