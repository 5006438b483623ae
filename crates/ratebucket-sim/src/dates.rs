//! Instants written as providers write them: RFC 3339 (whole seconds or milliseconds) and
//! the HTTP-date of RFC 9110 (`Sun, 06 Nov 1994 08:49:37 GMT`).

use std::time::{Duration, SystemTime};

/// The civil date and time of `secs` since the Unix epoch: year, month, day, hours,
/// minutes, seconds and the day of the week (0 = Sunday).
fn civil(secs: u64) -> (i64, i64, i64, u64, u64, u64, u64) {
    let days = secs / 86_400;
    let rest = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // 1970-01-01 was a Thursday.
    let weekday = (days + 4) % 7;
    (year, month, day, rest / 3_600, rest / 60 % 60, rest % 60, weekday)
}

/// `at` since the Unix epoch as an RFC 3339 instant in UTC: to the millisecond when
/// `millis`, else in whole seconds with the fraction dropped (`2026-12-06T13:40:12Z`), as
/// Anthropic writes its resets.
pub(crate) fn rfc3339(at: Duration, millis: bool) -> String {
    let (year, month, day, h, m, s, _) = civil(at.as_secs());
    let date = format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}");
    if millis { format!("{date}.{:03}Z", at.subsec_millis()) } else { format!("{date}Z") }
}

/// `at` since the Unix epoch as an IMF-fixdate, the fraction dropped.
pub(crate) fn http_date(at: Duration) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (year, month, day, h, m, s, weekday) = civil(at.as_secs());
    format!(
        "{}, {day:02} {} {year:04} {h:02}:{m:02}:{s:02} GMT",
        DAYS[weekday as usize],
        MONTHS[(month - 1) as usize]
    )
}

/// The instant `d` from now, since the Unix epoch.
pub(crate) fn from_now(d: Duration) -> Duration {
    (SystemTime::now() + d).duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

/// The first instant of the month after the one `at` falls in, as `YYYY-MM-DD`.
pub(crate) fn next_month(at: Duration) -> String {
    let (year, month, ..) = civil(at.as_secs());
    let (year, month) = if month == 12 { (year + 1, 1) } else { (year, month + 1) };
    format!("{year:04}-{month:02}-01")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn instants_are_written_as_rfc3339() {
        assert_eq!(rfc3339(ms(0), true), "1970-01-01T00:00:00.000Z");
        // The reference's `now`.
        assert_eq!(rfc3339(ms(1_696_004_797_250), true), "2023-09-29T16:26:37.250Z");
        assert_eq!(rfc3339(ms(1_696_004_797_999), false), "2023-09-29T16:26:37Z");
        assert_eq!(rfc3339(ms(951_782_400_000), true), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(ms(4_102_444_799_999), true), "2099-12-31T23:59:59.999Z");
    }

    #[test]
    fn instants_are_written_as_http_dates() {
        assert_eq!(http_date(ms(1_696_004_797_250)), "Fri, 29 Sep 2023 16:26:37 GMT");
        assert_eq!(http_date(ms(784_111_777_000)), "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn the_next_month_turns_the_year() {
        assert_eq!(next_month(ms(1_696_004_797_250)), "2023-10-01");
        assert_eq!(next_month(ms(4_102_444_799_999)), "2100-01-01");
    }
}
