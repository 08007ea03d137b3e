//! minato's own decoders, in plain Rust without Python: images (JPEG, PNG,
//! WebP) with a fused resize, NPY/NPZ arrays and, behind the `video` cargo
//! feature, video frames through FFmpeg. Every entry point takes bytes and
//! returns owned buffers or offsets into its input, so the bindings can run
//! it with the GIL released and hand the result to numpy without a copy.

mod batch;
mod error;
mod image;
mod npy;
mod npz;
mod resize;
#[cfg(feature = "video")]
mod video;

pub use batch::decode_images_into;
pub use error::{read_path, DecodeError};
pub use image::{decode_image, decode_image_into, Decoded, ImageOptions, Mode, DEFAULT_MAX_PIXELS};
pub use npy::{parse_npy, ByteOrder, DtypeKind, NpyDtype, NpyHeader, NPY_MAGIC};
pub use npz::{parse_npz, MemberData, NpzMember, NpzOptions, DEFAULT_MAX_BYTES};
#[cfg(feature = "video")]
pub use video::{decode_video, DecodedVideo, VideoOptions, VideoSource, DEFAULT_MAX_VIDEO_PIXELS};
