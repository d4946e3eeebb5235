//! What one role of the suite found: named checks, each passed, failed or skipped.

use std::fmt;

use serde::Serialize;

use crate::DomId;

/// The result of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The platform behaved as Xen does.
    Pass,
    /// The platform did not; the detail says how.
    Fail,
    /// Not applicable on this platform or for this domain (the detail says why).
    Skip,
}

/// One named check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// A stable dotted name, e.g. `grant.256.map`.
    pub name: String,
    /// How the check went.
    pub outcome: Outcome,
    /// The error of a failure, the reason of a skip, or what a refusal said.
    pub detail: String,
}

/// Everything one role checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConformanceReport {
    /// The role's name (see [`ConformanceRole::as_str`](crate::conformance::ConformanceRole::as_str)).
    pub role: String,
    /// The domain that ran the role.
    pub domid: DomId,
    /// The domain it worked with (see [`ConformanceSetup::peer`](crate::conformance::ConformanceSetup::peer)).
    pub peer: DomId,
    /// The platform the role ran on: `linux` or `sim`.
    pub platform: String,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl ConformanceReport {
    pub(crate) fn new(role: &str, domid: DomId, peer: DomId, platform: &str) -> Self {
        ConformanceReport {
            role: role.to_string(),
            domid,
            peer,
            platform: platform.to_string(),
            checks: Vec::new(),
        }
    }

    /// True iff no check failed (skips are not failures).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.outcome != Outcome::Fail)
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.outcome == Outcome::Fail)
    }

    /// The check named `name`, if it ran.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// Names of every check, in the order they ran.
    pub fn names(&self) -> Vec<&str> {
        self.checks.iter().map(|c| c.name.as_str()).collect()
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    pub(crate) fn pass(&mut self, name: &str, detail: impl Into<String>) {
        self.push(name, Outcome::Pass, detail.into());
    }

    pub(crate) fn fail(&mut self, name: &str, detail: impl Into<String>) {
        let detail = detail.into();
        tracing::warn!(check = name, %detail, "conformance: check failed");
        self.push(name, Outcome::Fail, detail);
    }

    pub(crate) fn skip(&mut self, name: &str, detail: impl Into<String>) {
        self.push(name, Outcome::Skip, detail.into());
    }

    /// Record `result`: `Ok(detail)` passes, `Err(error)` fails.
    pub(crate) fn record(&mut self, name: &str, result: Result<String, String>) {
        match result {
            Ok(d) => self.pass(name, d),
            Err(e) => self.fail(name, e),
        }
    }

    fn push(&mut self, name: &str, outcome: Outcome, detail: String) {
        tracing::debug!(check = name, ?outcome, %detail, "conformance");
        self.checks.push(Check {
            name: name.to_string(),
            outcome,
            detail,
        });
    }
}

impl fmt::Display for ConformanceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} (domain {}, peer {}, platform {})",
            self.role, self.domid, self.peer, self.platform
        )?;
        for c in &self.checks {
            let tag = match c.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "SKIP",
            };
            if c.detail.is_empty() {
                writeln!(f, "  {tag}  {}", c.name)?;
            } else {
                writeln!(f, "  {tag}  {}  ({})", c.name, c.detail)?;
            }
        }
        let count = |o| self.checks.iter().filter(|c| c.outcome == o).count();
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            count(Outcome::Pass),
            count(Outcome::Fail),
            count(Outcome::Skip)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_do_not_fail_a_report_and_failures_do() {
        let mut r = ConformanceReport::new("granter", 1, 2, "sim");
        r.pass("a", "");
        r.skip("b", "not here");
        assert!(r.passed());
        r.record("c", Err("boom".into()));
        assert!(!r.passed());
        assert_eq!(
            r.failures().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["c"]
        );
        assert_eq!(r.names(), ["a", "b", "c"]);
        assert_eq!(r.get("b").unwrap().outcome, Outcome::Skip);
        assert!(r.get("d").is_none());
    }

    #[test]
    fn json_and_text_carry_every_check() {
        let mut r = ConformanceReport::new("mapper", 0, 3, "linux");
        r.pass("grant.1.map", "");
        r.fail("evtchn.bind", "refused \"x\"");
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["role"], "mapper");
        assert_eq!(v["peer"], 3);
        assert_eq!(v["checks"][0]["name"], "grant.1.map");
        assert_eq!(v["checks"][0]["outcome"], "pass");
        assert_eq!(v["checks"][1]["outcome"], "fail");
        assert_eq!(v["checks"][1]["detail"], "refused \"x\"");
        let text = r.to_string();
        assert!(text.contains("PASS  grant.1.map"), "{text}");
        assert!(
            text.contains("FAIL  evtchn.bind  (refused \"x\")"),
            "{text}"
        );
        assert!(text.ends_with("1 passed, 1 failed, 0 skipped"), "{text}");
    }
}
