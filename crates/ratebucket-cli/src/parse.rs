//! Parsers of the batch command's option values: priority classes, tenants' weights and
//! caps, dialects.

use ratebucket_http::dialect::Dialect;
use ratebucket_rt::core::{MAX_WEIGHT, Priority, UnknownPriority};

/// A priority class by name, for `--priority`.
pub(crate) fn parse_priority(name: &str) -> Result<Priority, String> {
    name.parse().map_err(|e: UnknownPriority| e.to_string())
}

/// `TENANT=WEIGHT`, for `--weight`.
pub(crate) fn parse_weight(text: &str) -> Result<(u32, u32), String> {
    let (tenant, weight) = tenant_and(text, "TENANT=WEIGHT, such as 3=2")?;
    let weight: u32 =
        weight.trim().parse().map_err(|_| format!("`{weight}`: a weight is a whole number"))?;
    if weight == 0 || weight > MAX_WEIGHT {
        return Err(format!("weight {weight}: must be within 1..={MAX_WEIGHT}"));
    }
    Ok((tenant, weight))
}

/// A dialect by name, for `--dialect`.
pub(crate) fn parse_dialect(name: &str) -> Result<&'static Dialect, String> {
    Dialect::named(name).ok_or_else(|| {
        let names: Vec<&str> = ratebucket_http::dialect::ALL.iter().map(|d| d.name).collect();
        format!("no dialect {name:?}; one of {}", names.join(", "))
    })
}

/// `TENANT=SHARE`, for `--cap`.
pub(crate) fn parse_cap(text: &str) -> Result<(u32, f64), String> {
    let (tenant, share) = tenant_and(text, "TENANT=SHARE, such as 3=0.25")?;
    let share: f64 =
        share.trim().parse().map_err(|_| format!("`{share}`: a share is a number such as 0.25"))?;
    if !(share > 0.0 && share <= 1.0) {
        return Err(format!("share {share}: must be above 0 and at most 1"));
    }
    Ok((tenant, share))
}

/// `TENANT=VALUE`: the tenant's number and the value's text (`form` says what is expected).
fn tenant_and<'a>(text: &'a str, form: &str) -> Result<(u32, &'a str), String> {
    let (tenant, value) =
        text.split_once('=').ok_or_else(|| format!("`{text}`: expected {form}"))?;
    let tenant = tenant.trim().parse().map_err(|_| format!("`{tenant}`: a tenant is a number"))?;
    Ok((tenant, value))
}
