//! Faults written as text, as `ratebucket-sim --fault` takes them: `NAME[=ARG][@WHEN]`.

use std::str::FromStr;
use std::time::Duration;

use crate::config::{Fault, FaultRule, Trigger};

/// The names `--fault` takes, with the argument each needs (`SECS`, `CODE`, `BYTES`), in
/// the order the help lists them.
pub const FAULT_NAMES: [&str; 24] = [
    "status=CODE",
    "overloaded=SECS",
    "rate-limited=SECS",
    "reset",
    "stall=SECS",
    "cut",
    "error-chunk",
    "insufficient-quota",
    "unauthorized",
    "too-large",
    "stall-after-head=SECS",
    "stall-mid-stream=SECS",
    "error-in-200",
    "absurd-usage",
    "flood=BYTES",
    "stream-rate-limit",
    "stream-overloaded",
    "stream-error-after-content",
    "spend-limit",
    "usage-limit",
    "capacity-exceeded",
    "retry-after-in-message=SECS",
    "apim-rate-limit=SECS",
    "long-retry-after=SECS",
];

impl FromStr for FaultRule {
    type Err = String;

    /// `NAME[=ARG][@WHEN]`: a fault of [`FAULT_NAMES`] and when it strikes: every request
    /// (no `@`, or `@every`), each first arrival of a body (`@first`), with a probability
    /// (`@0.05`, written with a point), or the requests numbered (`@0,3,7`, from 0 in
    /// arrival order).
    fn from_str(text: &str) -> Result<FaultRule, String> {
        let (fault, when) = text.split_once('@').unwrap_or((text, "every"));
        let (name, arg) = match fault.split_once('=') {
            Some((name, arg)) => (name.trim(), Some(arg.trim())),
            None => (fault.trim(), None),
        };
        let secs = || -> Result<Duration, String> {
            let arg = arg.ok_or_else(|| format!("--fault {name} needs a wait: {name}=SECS"))?;
            arg.parse::<f64>()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .filter(|d| *d <= Duration::from_secs(366 * 86_400))
                .ok_or_else(|| {
                    format!("--fault {name}={arg}: not a number of seconds up to a year")
                })
        };
        let number = |what: &str| -> Result<u64, String> {
            let arg = arg.ok_or_else(|| format!("--fault {name} needs {what}: {name}=N"))?;
            arg.parse::<u64>().map_err(|_| format!("--fault {name}={arg}: not a whole number"))
        };
        let fault = match name {
            "status" => {
                let code = number("a status")?;
                let code = u16::try_from(code)
                    .ok()
                    .filter(|c| (100..=999).contains(c))
                    .ok_or_else(|| format!("--fault status={code}: not an HTTP status"))?;
                Fault::Status(code)
            }
            "overloaded" => Fault::Overloaded { retry_after: secs()? },
            "rate-limited" => Fault::RateLimited { retry_after: secs()? },
            "reset" => Fault::ResetBeforeResponse,
            "stall" => Fault::Stall { stall: secs()? },
            "cut" => Fault::CutStream,
            "error-chunk" => Fault::ErrorChunk,
            "insufficient-quota" => Fault::InsufficientQuota,
            "unauthorized" => Fault::Unauthorized,
            "too-large" => Fault::RequestTooLarge,
            "stall-after-head" => Fault::StallAfterHead { stall: secs()? },
            "stall-mid-stream" => Fault::StallMidStream { stall: secs()? },
            "error-in-200" => Fault::ErrorIn200,
            "absurd-usage" => Fault::AbsurdUsage,
            "flood" => Fault::Flood {
                bytes: usize::try_from(number("a size")?)
                    .map_err(|_| "--fault flood: too large".to_owned())?,
            },
            "stream-rate-limit" => Fault::StreamError { overloaded: false, after_content: false },
            "stream-overloaded" => Fault::StreamError { overloaded: true, after_content: false },
            "stream-error-after-content" => {
                Fault::StreamError { overloaded: false, after_content: true }
            }
            "spend-limit" => Fault::SpendLimit,
            "usage-limit" => Fault::UsageLimit,
            "capacity-exceeded" => Fault::CapacityExceeded,
            "retry-after-in-message" => Fault::RetryAfterInMessage { retry_after: secs()? },
            "apim-rate-limit" => Fault::ApimRateLimit { retry_after: secs()? },
            "long-retry-after" => Fault::LongRetryAfter { retry_after: secs()? },
            other => {
                return Err(format!(
                    "--fault {other}: no such fault; one of {}",
                    FAULT_NAMES.join(", ")
                ));
            }
        };
        let trigger = match when.trim() {
            "every" => Trigger::Rate(1.0),
            "first" => Trigger::FirstArrivals,
            rate if rate.contains('.') => {
                let p = rate
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("--fault ...@{rate}: not a probability in [0, 1]"))?;
                Trigger::Rate(p)
            }
            list => Trigger::Requests(
                list.split(',')
                    .map(|n| n.trim().parse::<u64>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| {
                        format!(
                            "--fault ...@{list}: not `every`, `first`, a probability or request numbers"
                        )
                    })?,
            ),
        };
        Ok(FaultRule { fault, trigger })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_parses() {
        for name in FAULT_NAMES {
            let text =
                name.replace("=SECS", "=2").replace("=CODE", "=503").replace("=BYTES", "=64");
            assert!(text.parse::<FaultRule>().is_ok(), "{text}");
        }
    }

    #[test]
    fn a_fault_names_its_trigger() {
        let rule: FaultRule = "long-retry-after=1382400@0,2".parse().expect("parses");
        assert_eq!(
            rule.fault,
            Fault::LongRetryAfter { retry_after: Duration::from_secs(1_382_400) }
        );
        assert_eq!(rule.trigger, Trigger::Requests(vec![0, 2]));
        let rule: FaultRule = "capacity-exceeded@0.25".parse().expect("parses");
        assert_eq!(rule.trigger, Trigger::Rate(0.25));
        let rule: FaultRule = "spend-limit".parse().expect("parses");
        assert_eq!(rule.trigger, Trigger::Rate(1.0));
        let rule: FaultRule = "reset@first".parse().expect("parses");
        assert_eq!(rule.trigger, Trigger::FirstArrivals);
    }

    #[test]
    fn bad_faults_are_refused_with_a_reason() {
        for bad in [
            "nonsense",
            "stall",
            "stall=forever",
            "status=42",
            "reset@2.5",
            "reset@soon",
            "overloaded=-1",
            "long-retry-after=1e12",
        ] {
            let error = bad.parse::<FaultRule>().expect_err(bad);
            assert!(error.starts_with("--fault"), "{bad}: {error}");
        }
    }
}
