//! Fuzzes the raw head reader and the cookie finder with arbitrary bytes, and checks that the
//! two ways of reading a cookie (raw head, header values) agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use limpet_core::cookie::find_in_values;
use limpet_core::head::{cookie_in_head, head_end, HeadEnd, HeaderLines};

fuzz_target!(|data: &[u8]| {
    let head = match head_end(data, 0) {
        HeadEnd::Complete { head, consumed } => {
            assert!(head < consumed && consumed <= data.len());
            &data[..head]
        }
        HeadEnd::Incomplete { resume_at } => {
            assert!(resume_at <= data.len());
            data
        }
    };
    let from_head = cookie_in_head(head, b"route");
    let values = HeaderLines::new(head)
        .filter(|(name, _)| name.eq_ignore_ascii_case(b"cookie"))
        .map(|(_, value)| value);
    assert_eq!(from_head, find_in_values(values, b"route"));
});
