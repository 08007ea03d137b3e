//! Any bytes: NPZ members whose bytes and arrays lie where they say, or an
//! error. Parsed without the CRC check too, so that mutations reach the NPY
//! parser behind it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use minato::io::{parse_npz, NpzOptions};

fuzz_target!(|data: &[u8]| {
    for check_crc in [false, true] {
        // A cap well under libFuzzer's memory limit.
        let options = NpzOptions {
            max_bytes: 1 << 26,
            check_crc,
        };
        let Ok(members) = parse_npz(data, &options) else {
            continue;
        };
        for member in &members {
            let bytes = member.bytes(data);
            if let Some(header) = &member.array {
                let end = header.data_offset.checked_add(header.data_len);
                assert!(end.is_some_and(|end| end <= bytes.len()));
            }
        }
    }
});
