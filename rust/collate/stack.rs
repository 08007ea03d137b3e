//! Stacking samples into a batch: sample `i`'s bytes go to the `i`-th slot
//! of the output, the layout `torch.stack(samples)` has for contiguous
//! samples of one shape and dtype.

use std::fmt;

use rayon::prelude::*;

use crate::parallel;

/// Below this many bytes a batch is copied on the calling thread: handing
/// the work to minato's thread pool (see [`parallel`]) costs more than the copy.
const PARALLEL_FROM_BYTES: usize = 1 << 20;

/// Why a stack could not be done; the Python side checks shapes first and
/// allocates the output fresh, so these mean a caller bug, not bad data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackError {
    /// The output does not hold exactly one sample's bytes per sample.
    OutputSize {
        samples: usize,
        sample_len: usize,
        out_len: usize,
    },
    /// A sample's length differs from the first sample's.
    SampleSize {
        index: usize,
        len: usize,
        expected: usize,
    },
    /// The output buffer is read-only.
    OutputReadOnly,
    /// A buffer is not C-contiguous: sample `sample`'s, or the output's (None).
    NotContiguous { sample: Option<usize> },
    /// Sample `sample`'s bytes overlap the output's.
    Overlaps { sample: usize },
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OutputSize {
                samples,
                sample_len,
                out_len,
            } => write!(
                f,
                "the batch buffer holds {out_len} bytes, not {samples} samples of {sample_len}"
            ),
            Self::SampleSize {
                index,
                len,
                expected,
            } => write!(
                f,
                "sample {index} has {len} bytes where the first has {expected}"
            ),
            Self::OutputReadOnly => write!(f, "the batch buffer is read-only"),
            Self::NotContiguous {
                sample: Some(index),
            } => {
                write!(f, "sample {index}'s buffer is not C-contiguous")
            }
            Self::NotContiguous { sample: None } => {
                write!(f, "the batch buffer is not C-contiguous")
            }
            Self::Overlaps { sample } => {
                write!(f, "sample {sample}'s bytes overlap the batch buffer")
            }
        }
    }
}

impl std::error::Error for StackError {}

/// Copies `samples[i]` into the `i`-th of `samples.len()` equal slots of `out`.
pub fn stack_into(samples: &[&[u8]], out: &mut [u8]) -> Result<(), StackError> {
    let sample_len = samples.first().map_or(0, |first| first.len());
    if let Some((index, sample)) = samples
        .iter()
        .enumerate()
        .find(|(_, sample)| sample.len() != sample_len)
    {
        return Err(StackError::SampleSize {
            index,
            len: sample.len(),
            expected: sample_len,
        });
    }
    if sample_len.checked_mul(samples.len()) != Some(out.len()) {
        return Err(StackError::OutputSize {
            samples: samples.len(),
            sample_len,
            out_len: out.len(),
        });
    }
    if sample_len == 0 {
        return Ok(());
    }
    let copy = |(slot, sample): (&mut [u8], &&[u8])| slot.copy_from_slice(sample);
    let pool = if out.len() >= PARALLEL_FROM_BYTES {
        parallel::pool()
    } else {
        None
    };
    match pool {
        Some(pool) => pool.install(|| {
            out.par_chunks_exact_mut(sample_len)
                .zip(samples.par_iter())
                .for_each(copy)
        }),
        // Small, or no pool could be started.
        None => out.chunks_exact_mut(sample_len).zip(samples).for_each(copy),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn every_sample_lands_in_its_own_slot(
            sample_len in 0usize..64,
            count in 0usize..40,
            big in any::<bool>(),
        ) {
            // `big` samples push the batch past the parallel threshold.
            let sample_len = if big { sample_len + PARALLEL_FROM_BYTES / 8 } else { sample_len };
            let samples: Vec<Vec<u8>> = (0..count)
                .map(|i| (0..sample_len).map(|j| (i * 31 + j) as u8).collect())
                .collect();
            let parts: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
            let mut out = vec![0xAA; sample_len * count];
            stack_into(&parts, &mut out).unwrap();
            prop_assert_eq!(out, samples.concat());
        }
    }

    #[test]
    fn mismatched_sizes_are_refused_before_anything_is_written() {
        let mut out = vec![7; 6];
        assert_eq!(
            stack_into(&[&[1, 2, 3], &[4, 5]], &mut out),
            Err(StackError::SampleSize {
                index: 1,
                len: 2,
                expected: 3
            })
        );
        assert_eq!(
            stack_into(&[&[1, 2], &[3, 4]], &mut out),
            Err(StackError::OutputSize {
                samples: 2,
                sample_len: 2,
                out_len: 6
            })
        );
        assert_eq!(out, [7; 6]);
    }
}
