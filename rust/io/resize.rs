//! Resizing decoded images with antialiasing, as PIL's (and so
//! torchvision's) bilinear resize does: a convolution whose support widens
//! with the scale factor. fast_image_resize implements the same algorithm
//! with SIMD kernels.

use std::cell::RefCell;

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::error::DecodeError;
use super::image::Decoded;

thread_local! {
    /// One resizer per thread: it keeps its scratch buffers between images.
    static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new());
}

/// Resizes `source` to `height` x `width` into `out` (exactly that many
/// pixels of `source.channels` bytes); copies when the size already fits.
pub(crate) fn resize_into(
    source: &Decoded,
    height: usize,
    width: usize,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    if (source.height, source.width) == (height, width) {
        out.copy_from_slice(&source.data);
        return Ok(());
    }
    let pixel_type = match source.channels {
        1 => PixelType::U8,
        3 => PixelType::U8x3,
        4 => PixelType::U8x4,
        other => unreachable!("images have 1, 3 or 4 channels, not {other}"),
    };
    let invalid = |what: &str| DecodeError::InvalidArgument(format!("cannot resize: {what}"));
    let dimension = |n: usize| u32::try_from(n).map_err(|_| invalid("a side exceeds 2**32"));
    let from = ImageRef::new(
        dimension(source.width)?,
        dimension(source.height)?,
        &source.data,
        pixel_type,
    )
    .map_err(|err| invalid(&err.to_string()))?;
    let mut to = Image::from_slice_u8(dimension(width)?, dimension(height)?, out, pixel_type)
        .map_err(|err| invalid(&err.to_string()))?;
    // PIL resizes RGBA without premultiplying alpha; so does this.
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .use_alpha(false);
    RESIZER
        .with_borrow_mut(|resizer| resizer.resize(&from, &mut to, &options))
        .map_err(|err| invalid(&err.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(height: usize, width: usize) -> Decoded {
        let data = (0..height * width)
            .flat_map(|i| {
                let x = (i % width * 255 / (width - 1)) as u8;
                [x, x, x]
            })
            .collect();
        Decoded {
            height,
            width,
            channels: 3,
            data,
        }
    }

    #[test]
    fn downscaling_a_gradient_keeps_it_a_gradient() {
        let source = gradient(40, 64);
        let mut out = vec![0; 10 * 16 * 3];
        resize_into(&source, 10, 16, &mut out).unwrap();
        let first_row: Vec<u8> = out[..16 * 3].iter().step_by(3).copied().collect();
        assert!(first_row.windows(2).all(|w| w[0] <= w[1]), "{first_row:?}");
        assert!(first_row[0] < 20 && first_row[15] > 235, "{first_row:?}");
    }

    #[test]
    fn the_same_size_is_a_copy() {
        let source = gradient(3, 5);
        let mut out = vec![0; source.data.len()];
        resize_into(&source, 3, 5, &mut out).unwrap();
        assert_eq!(out, source.data);
    }
}
