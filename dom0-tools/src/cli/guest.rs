//! `xmx attach` and `xmx detach`.

use anyhow::Result;

use super::XmxdTarget;
use crate::xmxd::control::{GuestStatus, XmxdRequest};

/// Arguments of `xmx attach`.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    #[command(flatten)]
    target: XmxdTarget,
    /// The running domain.
    domid: u16,
    /// Put the guest in this cluster (created if missing) [default: the cluster recorded
    /// for its name, else `default`].
    #[arg(long)]
    cluster: Option<String>,
    /// Print the guest's resulting status as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `xmx detach`.
#[derive(Debug, clap::Args)]
pub struct DetachArgs {
    #[command(flatten)]
    target: XmxdTarget,
    /// The running domain.
    domid: u16,
}

pub(super) fn attach(args: &AttachArgs) -> Result<i32> {
    let mut client = args.target.connect()?;
    let status: Option<GuestStatus> = client.call_as(&XmxdRequest::Attach {
        domid: args.domid,
        cluster: args.cluster.clone(),
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(0);
    }
    match status {
        Some(g) if g.attached => println!(
            "domain {} ({}): xmx device attached, MAC {}, cluster {}{}",
            args.domid,
            g.name,
            g.mac,
            g.cluster,
            g.index
                .map(|i| format!(", peer index {i}"))
                .unwrap_or_default()
        ),
        _ => println!(
            "domain {}: wish recorded; the device is attached once its name is known",
            args.domid
        ),
    }
    Ok(0)
}

pub(super) fn detach(args: &DetachArgs) -> Result<i32> {
    let mut client = args.target.connect()?;
    client.call(&XmxdRequest::Detach { domid: args.domid })?;
    println!("domain {}: xmx device detached", args.domid);
    Ok(0)
}
