//! The cookie-date parser of RFC 6265 §5.1.1.
//!
//! `Expires` is parsed with the RFC's deliberately lenient algorithm rather than as a strict
//! HTTP-date, because that is what browsers do and what servers therefore emit: it accepts the
//! IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850 form
//! (`Sunday, 06-Nov-94 08:49:37 GMT`), asctime (`Sun Nov  6 08:49:37 1994`) and the old
//! Netscape form (`Wed, 21-Oct-2015 07:28:00 GMT`) with one implementation. A date that fails
//! to parse makes the caller ignore the `Expires` attribute, as the RFC requires.

use std::time::{Duration, SystemTime};

/// Parses a cookie-date; `None` when the RFC's algorithm fails.
pub(crate) fn parse_cookie_date(input: &[u8]) -> Option<SystemTime> {
    let mut time: Option<(u32, u32, u32)> = None;
    let mut day: Option<u32> = None;
    let mut month: Option<u32> = None;
    let mut year: Option<u32> = None;

    for token in input.split(|&b| is_delimiter(b)).filter(|t| !t.is_empty()) {
        // The order of these checks is the RFC's: a token is consumed by the first rule that
        // has not matched yet and accepts it.
        if time.is_none() {
            if let Some(t) = parse_time(token) {
                time = Some(t);
                continue;
            }
        }
        if day.is_none() {
            if let Some(d) = leading_digits(token, 1, 2) {
                day = Some(d);
                continue;
            }
        }
        if month.is_none() {
            if let Some(m) = parse_month(token) {
                month = Some(m);
                continue;
            }
        }
        if year.is_none() {
            if let Some(y) = leading_digits(token, 2, 4) {
                year = Some(y);
                continue;
            }
        }
    }

    let (hour, minute, second) = time?;
    let (day, month, mut year) = (day?, month?, year?);
    // Two-digit years, as the RFC maps them.
    if (70..=99).contains(&year) {
        year += 1900;
    } else if year <= 69 {
        year += 2000;
    }
    if !(1..=31).contains(&day) || year < 1601 || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    if day > days_in_month(year, month) {
        // "If no such date exists, abort": 30 February is not a date.
        return None;
    }

    let days = days_from_civil(i64::from(year), month, day);
    let secs = days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second);
    if secs >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    }
}

/// RFC 6265 `delimiter = %x09 / %x20-2F / %x3B-40 / %x5B-60 / %x7B-7E`.
fn is_delimiter(b: u8) -> bool {
    matches!(b, 0x09 | 0x20..=0x2F | 0x3B..=0x40 | 0x5B..=0x60 | 0x7B..=0x7E)
}

/// `min..=max` digits, then either the end of the token or a non-digit and anything.
fn leading_digits(token: &[u8], min: usize, max: usize) -> Option<u32> {
    let n = token.iter().take_while(|b| b.is_ascii_digit()).count();
    if n < min || n > max {
        return None;
    }
    Some(
        token[..n]
            .iter()
            .fold(0, |acc, &b| acc * 10 + u32::from(b - b'0')),
    )
}

/// `hms-time = time-field ":" time-field ":" time-field`, `time-field = 1*2DIGIT`, optionally
/// followed by a non-digit and anything.
fn parse_time(token: &[u8]) -> Option<(u32, u32, u32)> {
    let mut fields = [0u32; 3];
    let mut rest = token;
    for (i, field) in fields.iter_mut().enumerate() {
        let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if !(1..=2).contains(&n) {
            return None;
        }
        *field = rest[..n]
            .iter()
            .fold(0, |acc, &b| acc * 10 + u32::from(b - b'0'));
        rest = &rest[n..];
        if i < 2 {
            rest = rest.strip_prefix(b":")?;
        }
    }
    // `n <= 2` above already guarantees the next byte, if any, is a non-digit.
    Some((fields[0], fields[1], fields[2]))
}

fn parse_month(token: &[u8]) -> Option<u32> {
    const MONTHS: [&[u8; 3]; 12] = [
        b"jan", b"feb", b"mar", b"apr", b"may", b"jun", b"jul", b"aug", b"sep", b"oct", b"nov",
        b"dec",
    ];
    let prefix = token.get(..3)?;
    MONTHS
        .iter()
        .position(|m| prefix.eq_ignore_ascii_case(&m[..]))
        .and_then(|i| u32::try_from(i + 1).ok())
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    // 1994-11-06 08:49:37 UTC, the RFC 7231 example instant.
    const NOV_1994: u64 = 784_111_777;

    #[test]
    fn imf_fixdate() {
        assert_eq!(
            parse_cookie_date(b"Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(at(NOV_1994))
        );
    }

    #[test]
    fn rfc850_two_digit_year() {
        assert_eq!(
            parse_cookie_date(b"Sunday, 06-Nov-94 08:49:37 GMT"),
            Some(at(NOV_1994))
        );
    }

    #[test]
    fn asctime() {
        assert_eq!(
            parse_cookie_date(b"Sun Nov  6 08:49:37 1994"),
            Some(at(NOV_1994))
        );
    }

    #[test]
    fn netscape_dashes_four_digit_year() {
        // 2015-10-21 07:28:00 UTC
        assert_eq!(
            parse_cookie_date(b"Wed, 21-Oct-2015 07:28:00 GMT"),
            Some(at(1_445_412_480))
        );
    }

    #[test]
    fn epoch_and_before_epoch() {
        assert_eq!(
            parse_cookie_date(b"Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(at(0))
        );
        let before = parse_cookie_date(b"Wed, 31 Dec 1969 23:59:59 GMT");
        assert_eq!(
            before,
            SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(1))
        );
    }

    #[test]
    fn two_digit_year_below_70_is_2000s() {
        // 2038-01-19 03:14:08 UTC
        assert_eq!(
            parse_cookie_date(b"Tue, 19 Jan 38 03:14:08 GMT"),
            Some(at(2_147_483_648))
        );
    }

    #[test]
    fn rejects_impossible_or_incomplete_dates() {
        for bad in [
            &b""[..],
            b"garbage",
            b"Sun, 06 Nov 1994 GMT",           // no time
            b"Sun, Nov 1994 08:49:37 GMT",     // no day
            b"Sun, 06 1994 08:49:37 GMT",      // no month
            b"Sun, 06 Nov 08:49:37 GMT",       // no year
            b"Sun, 32 Nov 1994 08:49:37 GMT",  // day out of range
            b"Sun, 30 Feb 1994 08:49:37 GMT",  // no such date
            b"Sun, 06 Nov 1994 24:00:00 GMT",  // hour out of range
            b"Sun, 06 Nov 1994 08:60:00 GMT",  // minute out of range
            b"Sun, 06 Nov 1600 08:49:37 GMT",  // before 1601
            b"Sun, 06 Nov 1994 008:49:37 GMT", // three-digit time field
        ] {
            assert_eq!(
                parse_cookie_date(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn leap_day() {
        assert!(parse_cookie_date(b"Tue, 29 Feb 2000 00:00:00 GMT").is_some());
        assert!(parse_cookie_date(b"Thu, 29 Feb 1900 00:00:00 GMT").is_none());
    }

    proptest! {
        // Cross-check against an independent formatter: whatever httpdate writes as an
        // IMF-fixdate, this parser reads back to the same instant.
        #[test]
        fn reads_back_httpdate_output(secs in 0u64..253_402_300_799) {
            let t = at(secs);
            let text = httpdate::fmt_http_date(t);
            prop_assert_eq!(parse_cookie_date(text.as_bytes()), Some(t));
        }
    }
}
