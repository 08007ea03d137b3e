//! Image decoding: JPEG through zune-jpeg, PNG and WebP through the `image`
//! crate, each to 8-bit interleaved pixels in the caller's mode, with an
//! optional resize fused in (the decoded image goes straight to the
//! resizer, and from it to the caller's buffer).

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::errors::DecodeErrors;
use zune_jpeg::JpegDecoder;

use super::error::DecodeError;
use super::resize::resize_into;

/// The default cap on decoded pixels: the size at which PIL refuses an image
/// as a decompression bomb (twice `PIL.Image.MAX_IMAGE_PIXELS`), so that
/// whatever PIL opens, minato opens too.
pub const DEFAULT_MAX_PIXELS: u64 = 2 * 89_478_485;

/// The pixel layout of the output, named as PIL names its modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// "RGB": three channels.
    Rgb,
    /// "L": one channel of luma, PIL's ITU-R 601-2 weights.
    Gray,
    /// "RGBA": four channels; opaque where the image has no alpha.
    Rgba,
}

impl Mode {
    pub fn parse(name: &str) -> Result<Mode, DecodeError> {
        match name {
            "RGB" => Ok(Mode::Rgb),
            "L" => Ok(Mode::Gray),
            "RGBA" => Ok(Mode::Rgba),
            other => Err(DecodeError::InvalidArgument(format!(
                "mode must be 'RGB', 'L' or 'RGBA', not {other:?}"
            ))),
        }
    }

    pub fn channels(self) -> usize {
        match self {
            Mode::Rgb => 3,
            Mode::Gray => 1,
            Mode::Rgba => 4,
        }
    }
}

/// How to decode.
#[derive(Debug, Clone, Copy)]
pub struct ImageOptions {
    /// Resize to (height, width); None keeps the image's size.
    pub size: Option<(usize, usize)>,
    pub mode: Mode,
    /// Largest decoded image, in pixels, checked before decoding.
    pub max_pixels: u64,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            size: None,
            mode: Mode::Rgb,
            max_pixels: DEFAULT_MAX_PIXELS,
        }
    }
}

/// A decoded image: `height * width * channels` bytes, row-major, interleaved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    pub data: Vec<u8>,
}

/// Decodes an encoded image, resized to `options.size` if given.
pub fn decode_image(data: &[u8], options: &ImageOptions) -> Result<Decoded, DecodeError> {
    if options.size.is_none() {
        return decode_native(data, options);
    }
    let (height, width, len) = options.output_shape()?;
    let mut out = vec![0; len];
    decode_image_into(data, options, &mut out)?;
    Ok(Decoded {
        height,
        width,
        channels: options.mode.channels(),
        data: out,
    })
}

/// Decodes an encoded image into `out`, which holds exactly one image of
/// `options.size` (required) in `options.mode`.
pub fn decode_image_into(
    data: &[u8],
    options: &ImageOptions,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    let (height, width, expected) = options.output_shape()?;
    if out.len() != expected {
        return Err(DecodeError::InvalidArgument(format!(
            "the output holds {} bytes, not the {expected} of one image",
            out.len()
        )));
    }
    let decoded = decode_native(data, options)?;
    resize_into(&decoded, height, width, out)
}

impl ImageOptions {
    /// One output image's `(height, width, bytes)`: `size` (required) in
    /// the mode. Checked before decoding, so a bad size costs no decode.
    pub fn output_shape(&self) -> Result<(usize, usize, usize), DecodeError> {
        let (height, width) = self.size.ok_or_else(|| {
            DecodeError::InvalidArgument("decoding into a buffer needs a size".to_owned())
        })?;
        if height == 0 || width == 0 {
            return Err(DecodeError::InvalidArgument(format!(
                "size must be positive, not ({height}, {width})"
            )));
        }
        height
            .checked_mul(width)
            .and_then(|pixels| pixels.checked_mul(self.mode.channels()))
            .map(|len| (height, width, len))
            .ok_or_else(|| {
                DecodeError::InvalidArgument(format!("size ({height}, {width}) is too large"))
            })
    }
}

/// Decodes at the image's own size, in the requested mode.
fn decode_native(data: &[u8], options: &ImageOptions) -> Result<Decoded, DecodeError> {
    match sniff(data) {
        Some(Format::Jpeg) => decode_jpeg(data, options),
        Some(Format::Png) => decode_with_image_crate(data, ImageFormat::Png, "PNG", options),
        Some(Format::WebP) => decode_with_image_crate(data, ImageFormat::WebP, "WebP", options),
        None => Err(DecodeError::UnknownFormat),
    }
}

enum Format {
    Jpeg,
    Png,
    WebP,
}

/// The format from the data's signature, not from a file name.
fn sniff(data: &[u8]) -> Option<Format> {
    if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(Format::Jpeg)
    } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(Format::Png)
    } else if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        Some(Format::WebP)
    } else {
        None
    }
}

fn decode_jpeg(data: &[u8], options: &ImageOptions) -> Result<Decoded, DecodeError> {
    const FORMAT: &str = "JPEG";
    // Strict: a truncated or damaged scan is an error, as in PIL, rather
    // than an image silently filled with gray.
    let decoder_options = DecoderOptions::default()
        .set_strict_mode(true)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX));
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(data), decoder_options);
    decoder
        .decode_headers()
        .map_err(|err| jpeg_error(err, options))?;
    let info = decoder
        .info()
        .ok_or_else(|| DecodeError::corrupt(FORMAT, "no frame header"))?;
    let (width, height) = (usize::from(info.width), usize::from(info.height));
    DecodeError::check_size(FORMAT, (width * height) as u64, options.max_pixels)?;
    // Gray images decode as luma; everything else (YCbCr, CMYK, YCCK) as
    // RGB, the conversions zune-jpeg has, and then to the mode.
    let gray_input = decoder.input_colorspace() == Some(ColorSpace::Luma);
    let (colorspace, channels) = if gray_input && options.mode == Mode::Gray {
        (ColorSpace::Luma, 1)
    } else {
        (ColorSpace::RGB, 3)
    };
    decoder.set_options(decoder_options.jpeg_set_out_colorspace(colorspace));
    let pixels = decoder.decode().map_err(|err| jpeg_error(err, options))?;
    let decoded = Decoded {
        height,
        width,
        channels,
        data: pixels,
    };
    Ok(convert(decoded, options.mode))
}

fn jpeg_error(err: DecodeErrors, options: &ImageOptions) -> DecodeError {
    const FORMAT: &str = "JPEG";
    match err {
        DecodeErrors::ExhaustedData => DecodeError::truncated(FORMAT, "the data ends mid-image"),
        DecodeErrors::FormatStatic(message) if message.contains("Premature end") => {
            DecodeError::truncated(FORMAT, message)
        }
        DecodeErrors::Unsupported(scheme) => {
            DecodeError::unsupported(FORMAT, format!("{scheme:?}"))
        }
        DecodeErrors::LargeDimensions(pixels) => DecodeError::TooLarge {
            format: FORMAT,
            pixels: pixels as u64,
            limit: options.max_pixels,
        },
        DecodeErrors::IoErrors(err) => DecodeError::truncated(FORMAT, format!("{err:?}")),
        other => DecodeError::corrupt(FORMAT, other.to_string()),
    }
}

fn decode_with_image_crate(
    data: &[u8],
    format: ImageFormat,
    name: &'static str,
    options: &ImageOptions,
) -> Result<Decoded, DecodeError> {
    let image_error = |err: ImageError| match err {
        ImageError::Limits(limit) => DecodeError::unsupported(name, limit.to_string()),
        ImageError::Unsupported(what) => DecodeError::unsupported(name, what.to_string()),
        ImageError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            DecodeError::truncated(name, io.to_string())
        }
        other => {
            let reason = other.to_string();
            if reason.contains("end of") || reason.contains("EOF") || reason.contains("eof") {
                DecodeError::truncated(name, reason)
            } else {
                DecodeError::corrupt(name, reason)
            }
        }
    };
    let decoder = ImageReader::with_format(Cursor::new(data), format)
        .into_decoder()
        .map_err(image_error)?;
    let (width, height) = decoder.dimensions();
    DecodeError::check_size(
        name,
        u64::from(width) * u64::from(height),
        options.max_pixels,
    )?;
    let image = DynamicImage::from_decoder(decoder).map_err(image_error)?;
    let (height, width) = (height as usize, width as usize);
    let (channels, data) = match options.mode {
        Mode::Rgb => (3, image.into_rgb8().into_raw()),
        Mode::Rgba => (4, image.into_rgba8().into_raw()),
        // PIL's weights, from RGB, as `Image.convert("L")` computes them;
        // a gray image passes through unchanged.
        Mode::Gray if !image.color().has_color() => (1, image.into_luma8().into_raw()),
        Mode::Gray => (3, image.into_rgb8().into_raw()),
    };
    let decoded = Decoded {
        height,
        width,
        channels,
        data,
    };
    Ok(convert(decoded, options.mode))
}

/// Converts 1- or 3-channel pixels to the mode's channels, as PIL's
/// `Image.convert` does.
fn convert(decoded: Decoded, mode: Mode) -> Decoded {
    if decoded.channels == mode.channels() {
        return decoded;
    }
    let data = match (decoded.channels, mode) {
        (3, Mode::Gray) => decoded
            .data
            .chunks_exact(3)
            .map(|rgb| {
                // PIL's L = R * 299/1000 + G * 587/1000 + B * 114/1000, rounded.
                let luma = u32::from(rgb[0]) * 19595
                    + u32::from(rgb[1]) * 38470
                    + u32::from(rgb[2]) * 7471
                    + 0x8000;
                (luma >> 16) as u8
            })
            .collect(),
        (3, Mode::Rgba) => decoded
            .data
            .chunks_exact(3)
            .flat_map(|rgb| [rgb[0], rgb[1], rgb[2], 255])
            .collect(),
        (1, Mode::Rgb) => decoded.data.iter().flat_map(|&l| [l, l, l]).collect(),
        (1, Mode::Rgba) => decoded.data.iter().flat_map(|&l| [l, l, l, 255]).collect(),
        _ => unreachable!("decoders produce 1 or 3 channels unless asked for the mode's"),
    };
    Decoded {
        channels: mode.channels(),
        data,
        ..decoded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_data_is_refused_by_signature() {
        let err = decode_image(b"GIF89a....", &ImageOptions::default()).unwrap_err();
        assert_eq!(err, DecodeError::UnknownFormat);
        assert_eq!(
            decode_image(b"", &ImageOptions::default()).unwrap_err(),
            DecodeError::UnknownFormat
        );
    }

    #[test]
    fn modes_parse_by_pil_name() {
        assert_eq!(Mode::parse("L").unwrap(), Mode::Gray);
        assert_eq!(Mode::parse("RGBA").unwrap().channels(), 4);
        assert!(matches!(
            Mode::parse("CMYK"),
            Err(DecodeError::InvalidArgument(_))
        ));
    }

    #[test]
    fn a_cut_jpeg_header_is_an_error_not_a_panic() {
        let data = [0xFF, 0xD8, 0xFF, 0xE0, 0x00];
        assert!(decode_image(&data, &ImageOptions::default()).is_err());
    }

    #[test]
    fn pil_gray_weights() {
        let decoded = Decoded {
            height: 1,
            width: 3,
            channels: 3,
            data: vec![255, 0, 0, 0, 255, 0, 10, 20, 30],
        };
        // PIL: L = 76, 150, and (10*299 + 20*587 + 30*114) / 1000 = 18.16.
        assert_eq!(convert(decoded, Mode::Gray).data, [76, 150, 18]);
    }

    #[test]
    fn decoding_into_a_buffer_of_the_wrong_size_is_refused() {
        let options = ImageOptions {
            size: Some((2, 2)),
            ..ImageOptions::default()
        };
        let err = decode_image_into(b"\xFF\xD8\xFF", &options, &mut [0; 5]).unwrap_err();
        assert!(matches!(err, DecodeError::InvalidArgument(_)), "{err}");
    }
}
