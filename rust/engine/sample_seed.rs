//! The seeds of an epoch's samples: a sample's random draws are a function
//! of the epoch's seed and the sample's position in the epoch, whichever
//! worker loads it (the Python side seeds the worker's generators with them).

/// splitmix64's finalizer: nearby inputs give unrelated outputs, in the low
/// 32 bits too (torch's CPU generator and numpy's legacy one use only those).
fn mix(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of an iterator's `epoch`-th epoch (0 for its first), from its
/// base seed.
pub fn epoch_seed(base_seed: u64, epoch: u64) -> u64 {
    mix(mix(base_seed) ^ epoch)
}

/// The seed of the sample (or whole batch) at `position` in its epoch.
pub fn sample_seed(epoch_seed: u64, position: u64) -> u64 {
    mix(epoch_seed ^ mix(position))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn seeds_are_fixed_functions_of_their_inputs() {
        assert_eq!(
            sample_seed(epoch_seed(7, 0), 3),
            sample_seed(epoch_seed(7, 0), 3)
        );
        assert_ne!(epoch_seed(7, 0), epoch_seed(7, 1));
        assert_ne!(epoch_seed(7, 0), epoch_seed(8, 0));
    }

    #[test]
    fn neighbouring_positions_differ_in_their_low_32_bits() {
        let epoch = epoch_seed(0, 0);
        let low: HashSet<u32> = (0..100_000u64)
            .map(|position| sample_seed(epoch, position) as u32)
            .collect();
        // Unrelated 32-bit values: a handful of birthday collisions at most.
        assert!(low.len() >= 99_990, "{}", low.len());
    }
}
