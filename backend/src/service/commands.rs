//! Answers to the control socket's requests (schema in [`crate::admin`]).

use serde_json::json;
use xmx_wire::mxoe::Mac;

use super::Backend;
use crate::admin::{
    snake_case, BackdRequest, CountersReport, EngineCountersReport, GuestCountersReport,
    GuestReport, NicCountersReport, Reply, ReplyError,
};
use crate::xenbus::toolstack::{self, DeviceSpec};
use xmx_engine::{ClusterId, DropReason, PeerEntry, VirtualNic};

fn nic_report(nic: &VirtualNic, pull_frames_granted: u64) -> NicCountersReport {
    let c = nic.counters();
    NicCountersReport {
        weight: nic.weight(),
        pull_frames_granted,
        tx_frames: c.tx_frames,
        tx_bytes: c.tx_bytes,
        local_frames: c.local_frames,
        local_bytes: c.local_bytes,
        rx_frames: c.rx_frames,
        rx_bytes: c.rx_bytes,
        nacks_sent: c.nacks_sent,
        send_errors: c.send_errors,
        pulls_done: c.pulls_done,
        pulls_failed: c.pulls_failed,
        retransmits: c.pull_rerequests,
        quota_refusals: c.quota_refusals,
        wide_frags_sent: c.wide_frags_sent,
        wide_frags_received: c.wide_frags_received,
        wide_downgrades: c.wide_downgrades,
        total_drops: c.total_drops(),
        drops: DropReason::ALL
            .iter()
            .map(|r| (snake_case(&format!("{r:?}")), c.drops(*r)))
            .filter(|(_, n)| *n > 0)
            .collect(),
    }
}

fn parse_mac(text: &str) -> Result<Mac, ReplyError> {
    text.parse()
        .map_err(|e| ReplyError::new("invalid", format!("MAC {text:?}: {e}")))
}

impl Backend {
    /// Answer one control-socket request.
    pub(super) fn answer(&mut self, request: BackdRequest) -> Reply {
        let result = match request {
            BackdRequest::Counters => {
                let open = self.link.as_mut().map_or(0, |l| l.rx_ring_drops());
                self.counters.nic_rx_ring_drops = self.rx_ring_drops_closed + open;
                self.counters_report().map(|r| json!(r))
            }
            BackdRequest::Guests => Ok(json!(self.guests_report())),
            BackdRequest::SetPeers { peers } => self.set_peers(peers),
            BackdRequest::Attach {
                domid,
                devid,
                mac,
                cluster,
                hostname,
            } => parse_mac(&mac).and_then(|mac| {
                let spec = DeviceSpec {
                    domu: domid,
                    devid,
                    mac,
                    cluster,
                    hostname: hostname
                        .unwrap_or_else(|| format!("{}-{domid}:{devid}", self.cfg.host_name)),
                };
                toolstack::attach(self.xs.as_ref(), self.domid, &spec)
                    .map(|()| serde_json::Value::Null)
                    .map_err(|e| crate::admin::hv_reply_error(&e))
            }),
            BackdRequest::Detach { domid, devid } => {
                toolstack::detach(self.xs.as_ref(), self.domid, domid, devid)
                    .map(|()| serde_json::Value::Null)
                    .map_err(|e| crate::admin::hv_reply_error(&e))
            }
        };
        match result {
            Ok(v) => Reply::ok(v),
            Err(e) => Reply::err(e),
        }
    }

    fn set_peers(
        &mut self,
        peers: Vec<crate::admin::PeerSpec>,
    ) -> Result<serde_json::Value, ReplyError> {
        let entries = peers
            .into_iter()
            .map(|p| {
                Ok(PeerEntry {
                    index: p.index,
                    mac: parse_mac(&p.mac)?,
                    hostname: p.hostname,
                    cluster: ClusterId(p.cluster),
                })
            })
            .collect::<Result<Vec<_>, ReplyError>>()?;
        let n = entries.len();
        self.engine
            .set_peers(entries)
            .map_err(|e| ReplyError::new("invalid", e.to_string()))?;
        tracing::info!(peers = n, "peer table replaced");
        Ok(json!({ "peers": n }))
    }

    /// Counters of the engine, the loop, every device and endpoint.
    pub fn counters_report(&self) -> Result<CountersReport, ReplyError> {
        let e = self.engine.counters();
        let guests = self
            .devices
            .iter()
            .map(|(key, d)| {
                let conn = d.conn.as_ref();
                GuestCountersReport {
                    domid: key.domu,
                    devid: key.devid,
                    connected: conn.is_some(),
                    ctrl_requests: d.ctrl_requests,
                    quota_refusals: d.quota_refusals,
                    nic: conn
                        .and_then(|c| self.engine.guest(c.guest))
                        .map(|nic| nic_report(nic, self.engine.pull_frames_granted(nic.id()))),
                    endpoints: conn
                        .map(|c| c.endpoints.iter().map(|(i, ep)| ep.report(*i)).collect())
                        .unwrap_or_default(),
                }
            })
            .collect();
        Ok(CountersReport {
            engine: EngineCountersReport {
                rx_frames: e.rx_frames,
                rx_malformed: e.rx_malformed,
                rx_unknown_destination: e.rx_unknown_destination,
                rx_spoofed_source: e.rx_spoofed_source,
            },
            backend: self.counters.clone(),
            guests,
        })
    }

    /// Every device and what it holds.
    pub fn guests_report(&self) -> Vec<GuestReport> {
        self.devices
            .iter()
            .map(|(key, d)| {
                let conn = d.conn.as_ref();
                GuestReport {
                    domid: key.domu,
                    devid: key.devid,
                    state: u32::from(d.state),
                    state_name: d.state.name().to_string(),
                    mac: d
                        .spec
                        .as_ref()
                        .map(|s| s.mac.to_string())
                        .unwrap_or_default(),
                    cluster: d.spec.as_ref().map_or(0, |s| s.cluster),
                    hostname: d
                        .spec
                        .as_ref()
                        .map(|s| s.hostname.clone())
                        .unwrap_or_default(),
                    connected: conn.is_some(),
                    endpoints: conn
                        .map(|c| c.endpoints.keys().copied().collect())
                        .unwrap_or_default(),
                    regions: conn.map_or(0, |c| c.regions.len()),
                    mapped_pages: conn.map_or(0, |c| c.usage.mapped_pages),
                    kept_pages: conn.map_or(0, |c| c.kept.pages()),
                    kept_reuses: conn.map_or(0, |c| c.kept.reused()),
                    last_error: d.last_error.clone(),
                }
            })
            .collect()
    }
}
