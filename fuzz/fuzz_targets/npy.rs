//! Any bytes: an NPY header whose array lies inside the input, or an error.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = minato::io::parse_npy(data) {
        let end = header.data_offset.checked_add(header.data_len);
        assert!(end.is_some_and(|end| end <= data.len()));
        // Whatever the shape, the element count matches the byte count.
        let elements = if header.shape.contains(&0) {
            0
        } else {
            header.shape.iter().product::<usize>()
        };
        assert_eq!(elements, header.count());
        assert_eq!(elements * header.dtype.item_size, header.data_len);
    }
});
