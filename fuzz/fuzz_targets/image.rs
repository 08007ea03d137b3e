//! Any bytes: a decoded image or an error, never a crash.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = minato::io::decode_image(data, &minato::io::ImageOptions::default());
});
