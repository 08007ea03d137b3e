//! Decoding a batch of images in parallel straight into one buffer: each
//! image is decoded, resized into its slot of the batch and dropped, so the
//! only copy of its pixels that outlives it is the one in the batch.

use rayon::prelude::*;

use super::error::DecodeError;
use super::image::{decode_image_into, ImageOptions};
use crate::parallel;

/// Decodes `count` images, the `i`-th from `read(i)`, into `out`: `count`
/// consecutive images of `options.size` (required) in `options.mode`. Runs
/// on minato's thread pool (see [`parallel`]), or on the calling thread when
/// none can be started; the first failure is reported with its image's index.
pub fn decode_images_into<'a, R, B>(
    count: usize,
    read: R,
    options: &ImageOptions,
    out: &mut [u8],
) -> Result<(), DecodeError>
where
    R: Fn(usize) -> Result<B, DecodeError> + Sync,
    B: std::ops::Deref<Target = [u8]> + 'a,
{
    let (_, _, image_len) = options.output_shape()?;
    if Some(out.len()) != image_len.checked_mul(count) {
        return Err(DecodeError::InvalidArgument(format!(
            "the output holds {} bytes, not the {count} x {image_len} of {count} images",
            out.len()
        )));
    }
    let decode = |(index, slot): (usize, &mut [u8])| {
        read(index)
            .and_then(|data| decode_image_into(&data, options, slot))
            .map_err(|err| DecodeError::InBatch {
                index,
                source: Box::new(err),
            })
    };
    match parallel::pool() {
        Some(pool) => pool.install(|| {
            out.par_chunks_mut(image_len)
                .enumerate()
                .try_for_each(decode)
        }),
        None => out.chunks_mut(image_len).enumerate().try_for_each(decode),
    }
}
